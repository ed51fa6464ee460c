"""Arms that arrive during a simulated run (the scenario's ``arrivals``): the field is validated with errors
that name it, an arm is never pulled before its arrival, regret is counted against the best arm present
(checked against a plain loop), and the policy over the arms present chooses as the service's policy over a
campaign's active arms does on the same statistics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from latebandit.campaign import Campaign
from latebandit.policies import ArmStats, Choice
from latebandit.sim.arrivals import Roster
from latebandit.sim.environment import Environment, Pull
from latebandit.sim.logs import simulated_logs
from latebandit.sim.runner import make_policy_for, run_policy
from latebandit.sim.scenario import Scenario, ScenarioError, load_scenario, scenario_from_mapping

INDEX_POLICIES = ("ucb1", "klucb", "delayed-ucb", "delayed-klucb", "patient-bandits", "thompson", "delayed-thompson")


def world(**changes: Any) -> dict[str, Any]:
    base = {
        "horizon": 60, "runs": 6, "seed": 3, "arms": [0.3, 0.2, 0.6], "window": 20,
        "delay": {"family": "geometric", "p": 0.2}, "arrivals": {"2": 31}, "policies": [{"name": "ucb1"}],
    }  # fmt: skip
    return {key: value for key, value in (base | changes).items() if value is not ...}


def test_arrivals_load_and_round_trip() -> None:
    scenario = scenario_from_mapping(world(arrivals={"2": 31, 1: 5}))  # YAML gives integer keys
    assert scenario.arrivals == (1, 5, 31)
    assert scenario.arm_sets() == ((1, (0,)), (5, (0, 1)), (31, (0, 1, 2)))
    assert scenario.to_json()["arrivals"] == {"1": 5, "2": 31}
    assert scenario_from_mapping(scenario.to_json()) == scenario
    every_arm = scenario_from_mapping(world(arrivals={"2": 1}))  # round 1: there from the start
    assert every_arm == scenario_from_mapping(world(arrivals=...)) and "arrivals" not in every_arm.to_json()


@pytest.mark.parametrize(
    ("arrivals", "message"),
    [
        ({"3": 10}, r"arrivals: no arm '3'; arms are named by their index in arms, 0 to 2"),
        ({"x": 10}, r"arrivals: no arm 'x'"),
        ({"-1": 10}, r"arrivals: no arm '-1'"),
        ({True: 10}, r"arrivals: no arm True"),
        ({"2": 0}, r"arrivals\['2'\] must be an integer >= 1 \(got 0\)"),
        ({"2": 2.5}, r"arrivals\['2'\] must be an integer >= 1"),
        ({"2": "10"}, r"arrivals\['2'\] must be an integer >= 1"),
        ({"2": 61}, r"arrivals\['2'\] must be a round within the horizon 60 \(got 61\)"),
        ({"0": 5, "1": 5, "2": 5}, r"at least one arm must be present from round 1"),
        ({0: 5, "0": 6}, r"arrivals names arm 0 twice"),
        ({}, r"arrivals must be a non-empty object"),
        ([31], r"arrivals must be a non-empty object"),
    ],
)
def test_bad_arrivals_are_refused_naming_the_field(arrivals: object, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        scenario_from_mapping(world(arrivals=arrivals))


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"name": "guha-bayes"}, r"policies\[0\]: policy 'guha-bayes' plays a schedule or a plan .* without a restart"),
        ({"name": "odaaf"}, r"policies\[0\]: policy 'odaaf' plays a schedule or a plan over its arms"),
        ({"name": "adapt-patient-bandits", "params": {"estimator": 0}}, r"band estimator .* use estimator 1"),
        ({"name": "fixed", "params": {"arm": 2}}, r"with arms \[0, 1\] present from round 1: .*arm 2, which is not"),
    ],
)
def test_policies_that_cannot_take_an_arriving_arm_are_refused(policy: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        scenario_from_mapping(world(policies=[policy]))


def test_simulated_event_logs_refuse_arrivals() -> None:
    with pytest.raises(ScenarioError, match="no arm-change events"):
        simulated_logs(scenario_from_mapping(world()))


def played(scenario: Scenario, label: str, standing_rounds: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(T, R) the arms pulled each round, (R,) the final regret and (R,) L(T) of the policy labelled so."""
    spec = next(spec for spec in scenario.policies if spec.label == label)
    rounds: list[np.ndarray] = []

    def observe(n: int, choice: Choice, pull: Pull) -> None:
        assert n == len(rounds) + 1
        rounds.append(pull.arms.copy())

    result = run_policy(scenario, spec, observe=observe, standing_rounds=standing_rounds)
    return np.array(rounds), result.final, result.weighted


@pytest.mark.parametrize("standing_rounds", [1, 16])
def test_an_arm_is_never_pulled_before_its_arrival(standing_rounds: int) -> None:
    policies = [{"name": name} for name in (*INDEX_POLICIES, "uniform")]
    floored = {"name": "thompson", "label": "floored", "exploration_floor": 0.2}
    scenario = scenario_from_mapping(world(arrivals={"1": 11, "2": 31}, policies=[*policies, floored], runs=20))
    for spec in scenario.policies:
        arms, _, _ = played(scenario, spec.label, standing_rounds)
        assert set(arms[:10].ravel()) == {0}, spec.label
        assert 2 not in arms[:30], spec.label
        assert (arms[30:] == 2).any(axis=0).all(), spec.label  # opened, or drawn at the prior, in every run


@pytest.mark.parametrize("prior", [..., {"a": 1, "b": 1}])
def test_regret_is_counted_against_the_best_arm_present(prior: Any) -> None:
    """A plain loop over rounds and runs: the gap of each pull to the best arm present at its round, and
    L(T) = Σ_s Δ_s(A_s)·τ(min(T − s, m))."""
    arms = [0.5] * 3 if prior is not ... else [0.3, 0.2, 0.6]
    scenario = scenario_from_mapping(
        world(arms=arms, prior=prior, arrivals={"1": 7, "2": 31}, policies=[{"name": "uniform"}, {"name": "klucb"}])
    )
    means = Environment(scenario).means
    tau = scenario.delays[0].cdf
    for spec in scenario.policies:
        pulled, final, weighted = played(scenario, spec.label)
        for run in range(scenario.runs):
            regret = loss = 0.0
            for s in range(1, scenario.horizon + 1):
                present = [k for k in range(scenario.n_arms) if s >= scenario.arrivals[k]]
                gap = max(means[run, k] for k in present) - means[run, pulled[s - 1, run]]
                regret += gap
                loss += gap * float(tau(min(scenario.horizon - s, scenario.window or 0)))
            assert final[run] == pytest.approx(regret, abs=1e-9)
            assert weighted[run] == pytest.approx(loss, abs=1e-9)


@pytest.mark.parametrize("policy", INDEX_POLICIES)
def test_the_policy_over_the_arms_present_chooses_as_the_service_over_the_active_arms(policy: str) -> None:
    """Arm 1 arrives later: before it, the simulator's policy over arms (0, 2) must choose as a campaign whose
    arm 1 is not active (Campaign.policy_impl on Campaign.on_active_arms, its choice named back by
    active_arms), on the same statistics and the same random draws."""
    delay = {"family": "geometric", "p": 0.2}
    scenario = scenario_from_mapping(world(arrivals={"1": 1000}, policies=[{"name": policy}], horizon=1000))
    roster = Roster(make_policy_for(scenario, scenario.policies[0]), scenario, scenario.policies[0])
    campaign = Campaign(id="c", arms=["a", "b", "c"], retired=["b"], policy={"name": policy}, delay=delay, window=20.0)
    rng = np.random.default_rng(5)
    for case in range(40):
        pulls = rng.integers(0, 50, 3).astype(np.float64)
        pulls[1] = 0.0  # not arrived: no pull, no conversion
        if case % 4 == 0:
            pulls[rng.integers(0, 3)] = 0.0  # an arm to open
        conversions = np.floor(pulls * rng.random(3))
        effective = pulls * rng.uniform(0.5, 1.0, 3)
        t = np.array([pulls.sum() + 1.0])
        weights = effective.copy()
        stats = ArmStats(pulls[None, :], conversions[None, :], effective[None, :], t, weights[None, :])
        simulated = roster.choose(int(t[0]), stats, np.random.default_rng(case), 0.0)
        served = campaign.policy_impl.choose(campaign.on_active_arms(stats), np.random.default_rng(case))
        assert simulated.arm[0] == campaign.active_arms[int(served.arm[0])]
        assert simulated.propensity[0] == pytest.approx(served.propensity[0])
        assert simulated.arm[0] != 1


def test_the_example_adds_the_best_arm_at_half_the_horizon() -> None:
    scenario = load_scenario(Path(__file__).resolve().parents[2] / "examples" / "arm-arrival.yaml")
    arm = max(range(scenario.n_arms), key=lambda k: scenario.arms[k])
    assert scenario.arrivals[arm] == scenario.horizon // 2 and scenario.arm_sets()[0][1] == (0, 1, 2)
