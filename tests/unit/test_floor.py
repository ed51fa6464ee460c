"""The exploration floor: propensities against an independent computation (written here from the
definition), the arms actually drawn against those propensities, and the campaign/scenario checks."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from latebandit.campaign import CampaignSpec
from latebandit.policies import POLICIES, ArmStats, Choice, Policy, make_policy
from latebandit.policies.floor import with_floor
from latebandit.sim.runner import run_policy
from latebandit.sim.scenario import ScenarioError, scenario_from_mapping

RUNS = 200_000


def stats(pulls: list[float], conversions: list[float], runs: int = 1) -> ArmStats:
    p, c = np.array([pulls] * runs, dtype=float), np.array([conversions] * runs, dtype=float)
    return ArmStats(p, c, p.copy(), np.full(runs, p[0].sum() + 1))


def expected_mixture(policy_probabilities: list[float], floor: float) -> np.ndarray:
    """P(arm) = P(explore)·1/K + P(not explore)·π(arm), with P(explore) = K·floor: the definition."""
    k = len(policy_probabilities)
    explore = k * floor
    return np.array([explore / k + (1 - explore) * p for p in policy_probabilities])


CASES = [
    # UCB1 with arms 0 and 2 tied exactly (same pulls and successes): π = (1/2, 0, 1/2)
    ("ucb1", {}, [10, 20, 10], [5, 3, 5], [0.5, 0.0, 0.5]),
    ("fixed", {"arm": 1}, [0, 0, 0], [0, 0, 0], [0.0, 1.0, 0.0]),
    ("uniform", {}, [3, 1, 2], [1, 0, 0], [1 / 3] * 3),
    # delayed-KL-UCB with one arm never pulled: forced exploration picks it
    ("delayed-klucb", {}, [10, 0, 10], [2, 0, 9], [0.0, 1.0, 0.0]),
]


@pytest.mark.parametrize(("name", "params", "pulls", "conversions", "policy_probabilities"), CASES)
@pytest.mark.parametrize("floor", [0.01, 0.1, 1 / 3])
def test_propensities_and_draws_match_the_mixture(name, params, pulls, conversions, policy_probabilities, floor):
    policy = make_policy(name, params, 3)
    choice = with_floor(
        policy.choose(stats(pulls, conversions, RUNS), np.random.default_rng(1)), floor, np.random.default_rng(2)
    )
    expected = expected_mixture(policy_probabilities, floor)
    np.testing.assert_allclose(choice.probabilities, np.broadcast_to(expected, (RUNS, 3)), rtol=1e-12)
    np.testing.assert_allclose(choice.propensity, expected[choice.arm], rtol=1e-12)
    assert choice.propensity.min() >= floor - 1e-15
    frequency = np.bincount(choice.arm, minlength=3) / RUNS
    assert np.all(np.abs(frequency - expected) <= 5 * np.sqrt(expected * (1 - expected) / RUNS) + 1e-12)


def test_thompson_with_a_floor_reports_a_distribution_above_the_floor() -> None:
    policy = make_policy("thompson", {"propensity_samples": 200}, 4)
    choice = with_floor(policy.choose(stats([5, 9, 2, 0], [1, 6, 0, 0], 1000), np.random.default_rng(0)), 0.05,
                        np.random.default_rng(1))  # fmt: skip
    np.testing.assert_allclose(choice.probabilities.sum(axis=1), 1.0, rtol=1e-12)
    assert choice.probabilities.min() >= 0.05 - 1e-15
    np.testing.assert_array_equal(choice.propensity, choice.probabilities[np.arange(1000), choice.arm])


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=8).filter(lambda w: sum(w) > 0.01),
    share=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_mixture_is_a_distribution_with_the_floor_and_the_played_arm_s_propensity(weights, share, seed) -> None:
    k = len(weights)
    probabilities = np.array([weights]) / sum(weights)
    floor = share / k
    arm = np.array([int(np.argmax(probabilities[0]))])
    choice = with_floor(Choice(arm, probabilities[:, arm[0]], probabilities), floor, np.random.default_rng(seed))
    np.testing.assert_allclose(choice.probabilities, expected_mixture(list(probabilities[0]), floor)[None], atol=1e-12)
    assert choice.probabilities.min() >= floor - 1e-12
    assert choice.propensity[0] == choice.probabilities[0, choice.arm[0]]


def test_no_floor_changes_nothing_and_draws_nothing() -> None:
    rng = np.random.default_rng(3)
    choice = make_policy("ucb1", {}, 3).choose(stats([1, 2, 3], [1, 1, 1]), rng)
    state = rng.bit_generator.state
    assert with_floor(choice, 0.0, rng) is choice
    assert rng.bit_generator.state == state


def campaign(**fields) -> dict:
    return {"id": "c", "arms": ["a", "b", "c"], "policy": {"name": "ucb1"}, **fields}


def test_a_campaign_floor_above_one_over_k_is_refused() -> None:
    assert CampaignSpec.model_validate(campaign(exploration_floor=1 / 3)).exploration_floor == pytest.approx(1 / 3)
    with pytest.raises(ValidationError, match=r"exploration_floor must lie in \[0, 1/3"):
        CampaignSpec.model_validate(campaign(exploration_floor=0.34))
    with pytest.raises(ValidationError):
        CampaignSpec.model_validate(campaign(exploration_floor=-0.1))


class Opaque(Policy):
    name: ClassVar[str] = "opaque"

    def choose(self, stats: ArmStats, rng: np.random.Generator) -> Choice:
        runs = np.shape(stats.pulls)[0]
        return Choice(np.zeros(runs, dtype=np.int64), np.ones(runs))


def test_a_floor_is_refused_for_a_policy_that_does_not_report_its_probabilities(monkeypatch) -> None:
    monkeypatch.setitem(POLICIES, "opaque", Opaque)
    CampaignSpec.model_validate(campaign(policy={"name": "opaque"}))
    with pytest.raises(ValidationError, match="does not report the probability"):
        CampaignSpec.model_validate(campaign(policy={"name": "opaque"}, exploration_floor=0.1))


def test_the_simulator_plays_a_floored_policy_and_pays_for_it_in_regret() -> None:
    def world(floor: float):
        return scenario_from_mapping({
            "horizon": 2000, "runs": 50, "seed": 4, "arms": [0.5, 0.3, 0.2],
            "delay": {"family": "geometric", "p": 0.05}, "window": 100,
            "policies": [{"name": "delayed-klucb", "exploration_floor": floor}],
        })  # fmt: skip

    plain, floored = world(0.0), world(0.05)
    assert floored.to_json()["policies"][0]["exploration_floor"] == 0.05
    regret = [run_policy(s, s.policies[0]).final.mean() for s in (plain, floored)]
    # the uniform draws alone cost Σ_a floor·Δ_a = 0.05·(0.2 + 0.3) = 0.025 per round, 50 over 2000 rounds (the
    # policy's own rounds add a non-negative part, smaller than without the floor since it learns faster)
    assert regret[1] > 0.9 * 50
    assert regret[1] > regret[0] + 10
    with pytest.raises(ScenarioError, match="exploration_floor"):
        scenario_from_mapping({**floored.to_json(), "policies": [{"name": "ucb1", "exploration_floor": 0.5}]})
