"""The statistics feeds against brute force over the pull records: Discarding's matured counts and
the plug-in Ñ of App. D (censored histogram; uncensored stochastic approximation), and the pulls QPM-D
sees as pending."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest

from latebandit.delays.models import delay_from_spec
from latebandit.policies import ArmStats
from latebandit.sim.accounting import exposure_for
from latebandit.sim.environment import Environment, Pull
from latebandit.sim.feeds import Discarding, Feed, Ledger, PluginGeometric, PluginWindow, Resolution
from latebandit.sim.scenario import scenario_from_mapping

ROUNDS = 160
DELAY = {"family": "geometric", "p": 0.1}


def environment(window: int | None, delay: dict[str, Any] = DELAY) -> Environment:
    return Environment(
        scenario_from_mapping(
            {
                "horizon": ROUNDS,
                "runs": 4,
                "seed": 11,
                "arms": [0.9, 0.6, 0.3],
                "delay": delay,
                "window": window,
                "policies": [{"name": "delayed-klucb"}],
            }
        )
    )


def drive(env: Environment, make: Any) -> tuple[list[ArmStats], list[Pull]]:
    """Random arms; the statistics the feed showed at every decision and the pulls."""
    ledger = Ledger(env.runs, env.scenario.n_arms)
    feed: Feed = make(ledger, env)
    exposure = exposure_for(env.scenario.delays, env.window, ROUNDS, env.runs)
    rng = np.random.default_rng(0)
    shown, pulls = [], []
    for n in range(1, ROUNDS + 1):
        shown.append(copy.deepcopy(feed.stats(np.full(env.runs, float(n)))))  # feeds update their arrays
        arms = rng.integers(0, 3, env.runs)
        pull = env.pull(arms)
        ledger.pulls[np.arange(env.runs), arms] += 1
        exposure.push(arms)
        feed.record(pull)
        ledger.conversions += env.end_round()
        pulls.append(pull)
    return shown, pulls


def revealed_lags(pulls: list[Pull], decision: int, run: int) -> list[int]:
    """Delays (in rounds) of the conversions seen by the decision of round ``decision``."""
    return [
        int(p.lags[run])
        for s, p in enumerate(pulls[: decision - 1], start=1)
        if p.counted[run] and s + p.lags[run] <= decision - 1
    ]


@pytest.mark.parametrize("literal", [False, True])
@pytest.mark.parametrize("window", [0, 9])
def test_discarding_sees_only_matured_pulls(window: int, literal: bool) -> None:
    env = environment(window)
    shown, pulls = drive(env, lambda ledger, env: Discarding(ledger, env, literal))
    tau_m = float(delay_from_spec(DELAY).cdf(window))
    for n, stats in enumerate(shown, start=1):
        matured = pulls[: max(0, n - 1 - window)]  # s <= n − 1 − m
        old = np.zeros((env.runs, 3))
        converted = np.zeros((env.runs, 3))
        for pull in matured:
            old[np.arange(env.runs), pull.arms] += 1
            converted[np.arange(env.runs), pull.arms] += np.where(pull.counted, pull.values, 0.0)
        np.testing.assert_allclose(stats.pulls, tau_m * old if literal else old)
        np.testing.assert_allclose(stats.conversions, converted)
        np.testing.assert_allclose(stats.effective, tau_m * old)


@pytest.mark.parametrize("window", [0, 6, 30])
def test_censored_plugin_weights_pulls_with_the_empirical_cdf_of_the_delays_seen(window: int) -> None:
    env = environment(window)
    shown, pulls = drive(env, PluginWindow)
    for n, stats in enumerate(shown, start=1):
        for r in range(env.runs):
            seen = np.array(revealed_lags(pulls, n, r))
            expected = np.zeros(3)
            for s, pull in enumerate(pulls[: n - 1], start=1):
                age = min(n - 1 - s, window)
                expected[pull.arms[r]] += (seen <= age).mean() if seen.size else 1.0
            np.testing.assert_allclose(stats.effective[r], expected, atol=1e-9)


@pytest.mark.parametrize("gamma", [1.0, 0.6])
def test_uncensored_plugin_runs_stochastic_approximation_into_the_geometric_recursion(gamma: float) -> None:
    env = environment(None)
    shown, pulls = drive(env, lambda ledger, env: PluginGeometric(ledger, env, gamma))
    for r in range(env.runs):
        mean, seen, decayed = 0.0, 0, np.zeros(3)
        for n in range(1, ROUNDS + 1):
            pulled = np.array([p.arms[r] for p in pulls[: n - 1]], dtype=np.int64)
            counts = np.bincount(pulled, minlength=3)
            np.testing.assert_allclose(shown[n - 1].effective[r], counts - decayed, atol=1e-9)
            batch = [int(p.lags[r]) for s, p in enumerate(pulls[:n], start=1) if p.counted[r] and s + p.lags[r] == n]
            for _ in batch:
                seen += 1
                alpha = seen**-gamma
                mean = (1 - alpha) * mean + alpha * np.mean(batch)
            if gamma == 1.0 and seen:
                assert math.isclose(mean, np.mean(revealed_lags(pulls, n + 1, r)), rel_tol=1e-12)
            survival = mean / (1 + mean) if seen else 0.0
            decayed = survival * (decayed + np.eye(3)[pulls[n - 1].arms[r]])


@pytest.mark.parametrize("window", [None, 12])
def test_resolution_pends_every_pull_until_its_delay_or_the_window_has_passed(window: int | None) -> None:
    """QPM-D (Joulani et al. 2013): the outcome of the pull of round s, zero rewards included, is known from
    the decision of round s + ⌈D⌉ + 1 on (D capped at the window); the conversions S are the ledger's."""
    env = environment(window)
    shown, pulls = drive(env, Resolution)
    cap = math.inf if window is None else window
    rounds = np.arange(1, len(pulls) + 1)[:, None]
    resolved_at = rounds + np.ceil(np.minimum(np.stack([pull.delays for pull in pulls]), cap))  # (T, R)
    arms = np.stack([pull.arms for pull in pulls])
    for n, stats in enumerate(shown, start=1):
        for run in range(env.runs):
            open_ = (rounds[:, 0] < n) & (resolved_at[:, run] > n - 1)
            np.testing.assert_array_equal(stats.pending[run], np.bincount(arms[open_, run], minlength=3))
        assert (stats.pending <= stats.pulls).all()
