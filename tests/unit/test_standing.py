"""A policy's standing law: the distribution its ``choose`` draws from while its statistics stand
(Policy.standing), which the engine keeps as a campaign's next choice (tests/unit/test_next_choice.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, stats

from latebandit.policies import Policy, make_policy
from latebandit.policies.baselines import win_probabilities
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
