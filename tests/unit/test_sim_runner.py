"""The vectorised runner against a plain one-run loop (brute-force Ñ and S from the pull records, one
policy call per run with a (1, K) batch), determinism under a seed, the identity of censored and
uncensored runs before round m, and the --json shape of docs/reference/scenarios.md."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from latebandit.policies import ArmStats, make_policy
from latebandit.policies.baselines import Thompson
from latebandit.sim.environment import Environment, policy_generator
from latebandit.sim.patient import make_feed
from latebandit.sim.runner import PolicyResult, contract_json, recording_rounds, run_policy, simulate
from latebandit.sim.scenario import PolicySpec, Scenario, ScenarioError, scenario_from_mapping

GEOMETRIC = {"family": "geometric", "p": 0.02}


def make(policies: list[dict[str, Any]], **overrides: Any) -> Scenario:
    data = {
        "horizon": 300,
        "runs": 5,
        "seed": 7,
        "arms": [0.5, 0.3, 0.2],
        "delay": GEOMETRIC,
        "window": 40,
        "policies": policies,
        "checkpoints": [100, 200, 300],
    } | overrides
    return scenario_from_mapping(data)


def plain_loop(scenario: Scenario, index: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The runs stepped in lockstep, each a plain one-run simulation that keeps the table of its pulls and
    recomputes N, S and Ñ from it: (T, R) regret and (R,) L(T). The runs share the policy generator in
    run order, which is what a batch of R consumes per round (service/latebandit/policies/base.py, uniform_among)."""
    spec = scenario.policies[index]
    policy = make_policy(spec.name, spec.params, scenario.n_arms)
    rng = policy_generator(scenario.seed)
    worlds = [Environment(scenario, runs=1, first_run=r) for r in range(scenario.runs)]  # outcomes only
    window = math.inf if scenario.window is None else scenario.window
    gaps = max(scenario.arms) - np.array(scenario.arms)
    horizon, arms = scenario.horizon, np.arange(scenario.n_arms)
    table = np.zeros((scenario.runs, horizon, 3))  # per run and round: arm, value, delay
    for n in range(1, horizon + 1):
        for r, world in enumerate(worlds):
            arm_of, value, delay = table[r, : n - 1].T
            ages = np.minimum(n - 1 - np.arange(1, n), window)
            revealed = (
                (value > 0) & np.isfinite(delay) & (delay <= window) & (np.arange(1, n) + np.ceil(delay) <= n - 1)
            )
            mine = arm_of[None, :] == arms[:, None]  # (K, n − 1)
            tau = np.array([model.cdf(ages) for model in scenario.delays])
            stats = ArmStats(
                mine.sum(axis=1)[None],
                (mine * value * revealed).sum(axis=1)[None],
                (mine * tau).sum(axis=1)[None],
                np.array([n]),
            )
            arm = int(policy.choose(stats, rng).arm[0])
            pull = world.pull(np.array([arm]))
            world.end_round()
            table[r, n - 1] = arm, pull.values[0], pull.delays[0]
    pulled = table[:, :, 0].astype(int)
    regret = np.cumsum(gaps[pulled], axis=1).T
    final_ages = np.minimum(horizon - np.arange(1, horizon + 1), window)
    tau_final = np.array([model.cdf(final_ages) for model in scenario.delays])  # (K, T)
    weighted = (gaps[pulled] * tau_final[pulled, np.arange(horizon)]).sum(axis=1)
    return regret, weighted


@pytest.mark.parametrize(
    ("policy", "overrides"),
    [
        ("delayed-klucb", {}),
        ("delayed-ucb", {}),
        ("klucb", {}),
        ("delayed-klucb", {"window": None, "delay": {"family": "uniform", "low": 0, "high": 60}}),
        ("delayed-ucb", {"delay": [GEOMETRIC, {"family": "pareto", "alpha": 1.2, "scale": 2}, GEOMETRIC]}),
        ("ucb1", {"reward": "bounded", "window": 0}),
    ],
)
def test_the_batch_agrees_with_a_plain_one_run_loop(policy: str, overrides: dict[str, Any]) -> None:
    scenario = make([{"name": policy}], **overrides)
    result = run_policy(scenario, scenario.policies[0])
    regret, weighted = plain_loop(scenario)
    np.testing.assert_array_equal(result.regret, regret[result.rounds - 1])
    np.testing.assert_allclose(result.weighted, weighted, rtol=1e-9)


def test_same_seed_same_numbers_and_another_seed_other_numbers() -> None:
    scenario = make([{"name": "delayed-klucb"}, {"name": "thompson", "params": {"propensity_samples": 1}}])
    first, again = simulate(scenario), simulate(scenario)
    other = simulate(scenario.with_overrides(seed=8))
    for a, b, c in zip(first, again, other, strict=True):
        assert np.array_equal(a.regret, b.regret) and np.array_equal(a.weighted, b.weighted)
        assert not np.array_equal(a.regret, c.regret)


def test_censored_and_uncensored_runs_coincide_until_the_window() -> None:
    """Censored and uncensored runs: same seeds, same weights and counted conversions until round m + 1."""
    censored = make([{"name": "delayed-ucb"}], horizon=400, window=150)
    uncensored = make([{"name": "delayed-ucb"}], horizon=400, window=None)
    results = [run_policy(s, s.policies[0]) for s in (censored, uncensored)]
    early = results[0].rounds <= 150
    assert np.array_equal(results[0].regret[early], results[1].regret[early])
    assert not np.array_equal(results[0].regret, results[1].regret)


def test_discarding_plays_round_robin_until_pulls_mature() -> None:
    """No index exists before a pull has matured (Vernade et al. 2017, Algorithm 1): every index is +inf, so the opening
    rule plays the arms in turn, in every run: the regret is that of round-robin play."""
    scenario = make(
        [{"name": "delayed-klucb", "feed": "discarding"}, {"name": "delayed-ucb", "feed": "discarding", "label": "d"}],
        window=100,
        runs=40,
    )
    gaps = max(scenario.arms) - np.array(scenario.arms)
    round_robin = np.cumsum(gaps[np.arange(scenario.horizon) % len(gaps)])
    for result in simulate(scenario):
        early = result.rounds <= 100
        expected = round_robin[result.rounds[early] - 1]
        np.testing.assert_allclose(result.regret[early], np.repeat(expected[:, None], 40, axis=1))


def test_contract_json_shape() -> None:
    scenario = make([{"name": "delayed-klucb"}, {"name": "ucb1", "label": "plain"}])
    progress: list[int] = []
    results = simulate(scenario, lambda spec: progress.append)
    document = contract_json(scenario, results)
    assert set(document) == {"scenario", "policies"} and document["scenario"] == scenario.to_json()
    assert list(document["policies"]) == ["delayed-klucb", "plain"]
    for entry in document["policies"].values():
        assert set(entry) == {"regret_mean", "regret_std", "final_regret_mean", "final_regret_std", "seconds"}
        assert len(entry["regret_mean"]) == len(entry["regret_std"]) == len(scenario.checkpoints)
        assert entry["regret_mean"][-1] == entry["final_regret_mean"]
    assert sum(progress) == 2 * scenario.horizon


def test_recorded_rounds_include_every_checkpoint_and_the_horizon() -> None:
    rounds = recording_rounds(make([{"name": "ucb1"}], horizon=12345, checkpoints=[7, 4321]))
    assert {7, 4321, 12345} <= set(rounds.tolist()) and np.all(np.diff(rounds) > 0) and rounds[0] == 1


def test_policies_that_cannot_consume_the_feedback_are_refused() -> None:
    scenario = make([{"name": "delayed-klucb"}], feedback="anonymous")
    with pytest.raises(ScenarioError, match=r"learns from attributed conversions.*only sums are observed"):
        simulate(scenario)


def test_a_policy_its_feed_refuses_fails_the_scenario_before_any_policy_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A feed that refuses the second policy (as the Manegueu feed once refused adapt-patient-bandits' moving
    α; no shipped feed refuses a valid policy now, so the refusal is made here) stops the run before the first
    policy plays a round, naming the second policy."""
    from latebandit.sim import runner

    def refusing_feed(spec: Any, policy: Any, ledger: Any, env: Any) -> Any:
        if policy.name == "adapt-patient-bandits":
            raise ValueError("this feed cannot follow age_aware")
        return make_feed(spec, policy, ledger, env)

    monkeypatch.setattr(runner, "make_feed", refusing_feed)
    scenario = make([{"name": "ucb1"}, {"name": "adapt-patient-bandits"}])
    started: list[str] = []

    def progress(spec: PolicySpec) -> None:
        started.append(spec.label)

    with pytest.raises(ScenarioError, match=r"policies\[1\] 'adapt-patient-bandits': .*age_aware.*no policy was run"):
        simulate(scenario, progress)
    assert started == []


def test_the_simulator_computes_no_propensity_it_does_not_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thompson's propensity costs more than its choice: a run without an event log never asks for it, and
    plays exactly the arms of a run that logs every propensity (the propensity draws nothing)."""
    scenario = make([{"name": "thompson"}])
    logged: list[float] = []
    with_log = run_policy(
        scenario, scenario.policies[0], observe=lambda n, choice, pull: logged.extend(choice.propensity)
    )
    assert len(logged) == scenario.runs * scenario.horizon and min(logged) > 0

    def refuse(*args: Any) -> np.ndarray:
        raise AssertionError("a propensity nobody logs was computed")

    monkeypatch.setattr(Thompson, "win_chances", refuse)
    without = run_policy(scenario, scenario.policies[0])
    np.testing.assert_array_equal(without.regret, with_log.regret)


def test_result_quantities() -> None:
    result = PolicyResult("x", np.array([1, 5]), np.array([[0.0, 1.0], [2.0, 6.0]]), np.zeros(2), 0.1)
    assert result.at([5]).tolist() == [[2.0, 6.0]] and result.final.tolist() == [2.0, 6.0]


UNIFORM_0_20 = {"family": "empirical", "quantiles": [[d, (d + 1) / 21] for d in range(21)]}


@pytest.mark.parametrize(
    ("policy", "overrides"),
    [
        ({"name": "odaaf-b"}, {"arms": [0.5, 0.6], "delay": UNIFORM_0_20, "window": None, "feedback": "anonymous"}),
        ({"name": "ars-ucb"}, {"delay": {"family": "fixed", "value": 2}, "window": None, "feedback": "composite",
                               "spread": [0.5, 0.3, 0.2]}),
        ({"name": "clw", "params": {"max_delay": 8}}, {"delay": {"family": "exponential", "mean": 4}, "window": 30,
                                                       "feedback": "anonymous"}),
        ({"name": "ars-exp3"}, {"delay": GEOMETRIC, "window": None, "feedback": "anonymous", "runs": 3}),
    ],
)  # fmt: skip
def test_planned_policies_play_the_same_in_blocks_as_round_by_round(
    policy: dict[str, Any], overrides: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of rounds in which no run changes arm are a speed-up only: the regret is identical to playing
    round by round, and L(T) is Σ_s Δ_{A_s}·τ(min(T − s, m)) over the arms actually played."""
    from latebandit.sim.players import SchedulePlayer

    scenario = make([policy], horizon=3000, checkpoints=[1000, 3000], **overrides)
    blocks: list[int] = []
    original = SchedulePlayer.play_block

    def recording(self: SchedulePlayer, rounds: int) -> np.ndarray:
        blocks.append(rounds)
        return original(self, rounds)

    monkeypatch.setattr(SchedulePlayer, "play_block", recording)
    blocked = run_policy(scenario, scenario.policies[0])
    assert max(blocks) > 1 and len(blocks) < scenario.horizon

    played: list[np.ndarray] = []

    def one_round(self: SchedulePlayer, rounds: int) -> np.ndarray:
        played.append(original(self, rounds))
        return played[-1]

    monkeypatch.setattr(SchedulePlayer, "longest_block", lambda self: 1)
    monkeypatch.setattr(SchedulePlayer, "play_block", one_round)
    per_round = run_policy(scenario, scenario.policies[0])
    np.testing.assert_array_equal(blocked.regret, per_round.regret)
    arms = np.stack(played)  # (T, R)
    model, window = scenario.delays[0], scenario.window
    ages = scenario.horizon - np.arange(1, scenario.horizon + 1)
    weights = model.cdf(ages if window is None else np.minimum(ages, window))
    gaps = max(scenario.arms) - np.array(scenario.arms)
    brute = (gaps[arms] * weights[:, None]).sum(axis=0)
    np.testing.assert_allclose(blocked.weighted, brute, rtol=1e-9)
    np.testing.assert_allclose(per_round.weighted, brute, rtol=1e-9)


@pytest.mark.parametrize("feedback", [{"feedback": "anonymous"}, {"feedback": "composite", "spread": 4}],
                         ids=["anonymous", "composite"])  # fmt: skip
def test_baselines_that_read_no_feedback_run_under_every_feedback_mode(feedback: dict[str, Any]) -> None:
    """uniform and fixed beside an anonymous learner: uniform's regret is T times the mean gap (to a few
    standard errors), fixed's T times its arm's gap exactly."""
    scenario = make([{"name": "uniform"}, {"name": "fixed", "params": {"arm": 2}}, {"name": "odaaf"}],
                    horizon=2000, runs=200, **feedback)  # fmt: skip
    uniform, fixed, _ = simulate(scenario)
    gaps = max(scenario.arms) - np.asarray(scenario.arms)
    per_round = gaps.std() * math.sqrt(1 - 1 / len(gaps))  # sd of one round's gap under uniform play
    expected = scenario.horizon * gaps.mean()
    assert abs(uniform.final.mean() - expected) < 5 * per_round * math.sqrt(scenario.horizon / scenario.runs)
    assert fixed.final.tolist() == [pytest.approx(scenario.horizon * gaps[2])] * scenario.runs
