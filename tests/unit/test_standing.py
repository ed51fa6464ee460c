"""The standing choice: a policy's distribution while its statistics stand (Policy.standing), and the
engine's draws from it (engine/standing.py): the same law as ``choose`` and ``with_floor``, kept no longer than
the statistics it was computed from."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from latebandit.campaign import Campaign
from latebandit.engine.standing import StandingChoice
from latebandit.policies import Policy, make_policy
from latebandit.policies.base import Choice
from latebandit.policies.baselines import win_probabilities
from latebandit.policies.floor import with_floor
from latebandit.store.base import Counters, Histogram, StateSnapshot
from tests.unit.test_policies import all_policies, one_run, random_stats

STANDS = {"uniform", "fixed", "ucb1", "klucb", "thompson", "delayed-ucb", "delayed-klucb", "delayed-thompson"}


@pytest.mark.parametrize("policy", all_policies(4), ids=lambda policy: policy.name)
def test_a_standing_row_is_the_law_choose_draws_from(policy: Policy) -> None:
    """Where a row stands, ``choose`` reports the same distribution, and its arms follow it; a nan row
    where an arm must still be explored, and everywhere for a policy that does not stand or does not know its
    law."""
    stats = random_stats(np.random.default_rng(21), 400, 4)
    law = policy.standing(stats)
    stands = ~np.isnan(law).any(axis=1)
    if policy.name not in STANDS:
        assert not stands.any()
        return
    assert stands.any()
    choice = policy.choose(stats, np.random.default_rng(22))
    assert choice.probabilities is not None
    np.testing.assert_allclose(law[stands], choice.probabilities[stands])
    np.testing.assert_allclose(law[stands].sum(axis=1), 1.0)
    assert (law[stands][np.arange(stands.sum()), choice.arm[stands]] > 0).all()
    if "thompson" not in policy.name and policy.name not in ("uniform", "fixed"):
        assert (stands == ~np.isposinf(policy.index(stats)).any(axis=1)).all()


def test_an_opening_never_stands() -> None:
    """Rounds 1..K play arm n at round n: the turn moves with t, so no distribution stands."""
    second_round = one_run([1, 0, 0], [0, 0, 0], [0.5, 0, 0], 2)
    assert np.isnan(make_policy("delayed-klucb", {}, 3).standing(second_round)).all()


def campaign(floor: float = 0.0) -> Campaign:
    return Campaign(id="c", arms=["a", "b", "c", "d"], policy={"name": "delayed-klucb", "params": {}},
                    delay={"family": "exponential", "mean": 60}, window=3600, exploration_floor=floor)  # fmt: skip


def snapshot(conversions: list[float]) -> StateSnapshot:
    empty = np.zeros(0, dtype=np.int64)
    histogram = Histogram(empty, empty, empty, empty, empty, np.zeros((0, 1)))
    ints = np.zeros(4, dtype=np.int64)
    return StateSnapshot(Counters(10, ints + 5, np.array(conversions, dtype=np.float64), ints, ints), histogram)


@pytest.mark.parametrize("floor", [0.0, 0.1])
def test_draws_follow_the_law_with_the_floor_mixed_in(floor: float) -> None:
    """Arm frequencies over many draws match the mixture ``with_floor`` draws from, and each draw's
    propensity is that mixture's probability of its arm (an arm of probability 0 is never drawn)."""
    law = np.array([0.5, 0.0, 0.5, 0.0])
    standing = StandingChoice.of(campaign(floor), snapshot([1, 1, 1, 1]), law, 10**6)
    assert standing is not None
    draws = standing.draw(40_000, np.random.default_rng(23))
    expected = with_floor_law(law, floor)
    counts = np.bincount([arm for arm, _ in draws], minlength=4) / len(draws)
    assert np.all(np.abs(counts - expected) <= 4 * np.sqrt(expected * (1 - expected) / len(draws)))
    assert all(propensity == pytest.approx(expected[arm]) for arm, propensity in draws)
    if floor == 0:
        assert counts[1] == counts[3] == 0


def with_floor_law(law: np.ndarray, floor: float) -> np.ndarray:
    """The floored law, from ``with_floor`` itself: each arm's logged propensity when it is drawn."""
    choice = Choice(np.arange(4), law, np.repeat(law[None, :], 4, axis=0))
    floored = with_floor(choice, floor, np.random.default_rng(0))
    assert floored.probabilities is not None
    return floored.probabilities[0]


def test_it_serves_only_the_statistics_it_was_computed_from_and_at_most_its_limit() -> None:
    home, state = campaign(), snapshot([1, 2, 3, 4])
    standing = StandingChoice.of(home, state, np.array([0.25] * 4), 5)
    assert standing is not None
    assert standing.serves(home, state, 5)
    standing.draw(3, np.random.default_rng(24))
    assert standing.serves(home, state, 2) and not standing.serves(home, state, 3)  # its limit, in decisions
    counters = state.counters
    rest = (counters.matured, counters.counted)
    same_counts = StateSnapshot(Counters(11, counters.pulls + 1, np.array([1.0, 2, 3, 4]), *rest), state.histogram)
    assert standing.serves(home, same_counts, 1)  # more pulls and rounds: the staleness a batch already has
    converted = StateSnapshot(Counters(11, counters.pulls, np.array([1.0, 2, 3, 5]), *rest), state.histogram)
    assert not standing.serves(home, converted, 1)  # a counted conversion changes S
    assert not standing.serves(home, snapshot([1, 2, 3, 4]), 1)  # another histogram read (Ñ)
    assert not standing.serves(campaign(), state, 1)  # the configuration was reloaded or changed


def test_no_standing_choice_from_a_nan_row() -> None:
    assert StandingChoice.of(campaign(), snapshot([0] * 4), np.full(4, math.nan), 64) is None


def slow_win_probabilities(alpha: list[float], beta: list[float]) -> np.ndarray:
    """P(arm k's Beta draw is the largest), by adaptive quadrature of f_k·Π F_j with scipy's distributions."""
    wins = []
    for k in range(len(alpha)):

        def integrand(x: float, k: int = k) -> float:
            others = [stats.beta.cdf(x, alpha[j], beta[j]) for j in range(len(alpha)) if j != k]
            return float(stats.beta.pdf(x, alpha[k], beta[k]) * np.prod(others))

        low, high = stats.beta.ppf([1e-14, 1 - 1e-14], alpha[k], beta[k])
        breaks = np.concatenate([stats.beta.ppf([1e-9, 0.5, 1 - 1e-9], a, b) for a, b in zip(alpha, beta, strict=True)])
        inside = sorted(set(breaks[(breaks > low) & (breaks < high)].tolist()))
        wins.append(
            integrate.quad(integrand, low, high, points=inside or None, epsabs=1e-11, epsrel=1e-9, limit=500)[0]
        )
    return np.array(wins) / sum(wins)


@pytest.mark.parametrize(
    ("alpha", "beta"),
    [
        ([1, 1, 1], [1, 1, 1]),  # uniform priors: 1/3 each
        ([2, 2.5], [30, 30]),
        ([1.5, 1001, 11], [1.2, 9001, 90]),  # a fresh arm beside a narrow one beside a wide one
        ([1, 1000, 1000.5], [1, 50_000, 50_000]),  # two narrow, nearly tied posteriors
        ([3.7, 1, 60, 8], [1.1, 500, 2000, 400]),
    ],
)
def test_thompsons_exact_law_matches_adaptive_quadrature(alpha: list[float], beta: list[float]) -> None:
    got = win_probabilities(np.array([alpha], float), np.array([beta], float))[0]
    np.testing.assert_allclose(got, slow_win_probabilities(alpha, beta), atol=1e-5)


def test_thompson_stands_on_its_posterior_up_to_ten_arms() -> None:
    stats_ = one_run([50, 40, 10], [5, 6, 1], [45, 30, 4], 101)
    delayed = make_policy("delayed-thompson", {}, 3)
    np.testing.assert_allclose(delayed.standing(stats_), win_probabilities(*delayed.posterior(stats_)))
    naive = make_policy("thompson", {}, 3)
    np.testing.assert_allclose(naive.standing(stats_), win_probabilities(*naive.posterior(stats_)))
    assert np.isnan(
        make_policy("delayed-thompson", {}, 11).standing(random_stats(np.random.default_rng(2), 1, 11))
    ).all()
