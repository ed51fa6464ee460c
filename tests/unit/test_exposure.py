"""Ñ from the bucketed histogram against the brute-force sum Σ_i F(min(age_i, m)) over every pull."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from latebandit.campaign import Campaign
from latebandit.engine.exposure import bucket_moments, exposure
from latebandit.store.base import Pull
from latebandit.store.memory import MemoryStore
from latebandit.timeutil import MICROS

T0 = 1_800_000_000 * MICROS
WINDOW = 86_400.0


def campaign(delay: dict, buckets: int = 64) -> Campaign:
    policy = {"name": "delayed-klucb", "params": {}}
    return Campaign(id="c", arms=["a", "b"], policy=policy, delay=delay, window=WINDOW, buckets=buckets)


async def histogram_of(config: Campaign, times: np.ndarray, arms: np.ndarray):
    store = MemoryStore(clock=lambda: T0)
    await store.create_campaign(config, {})
    for i, (at, arm) in enumerate(zip(times.tolist(), arms.tolist(), strict=True)):
        bucket, offset, moments = bucket_moments(config, at)
        await store.record_decision(config, Pull(arm, bucket, offset, moments, f"d{i}", 1.0, {}), None, 60)
    return await store.snapshot(config)


def brute_force(config: Campaign, times: np.ndarray, arms: np.ndarray, now: int) -> np.ndarray:
    ages = np.minimum((now - times) / MICROS, WINDOW)
    return np.bincount(arms, config.delay_model.cdf(np.maximum(ages, 0.0)), minlength=2)


def monotone_bound(config: Campaign, times: np.ndarray, arms: np.ndarray, now: int) -> np.ndarray:
    """Any rule that evaluates a bucket at an age inside it errs by at most c·(F(oldest) − F(youngest))."""
    width = config.bucket_width_us
    bucket = times // width
    young = np.clip((now - (bucket + 1) * width) / MICROS, 0.0, WINDOW)
    old = np.clip((now - bucket * width) / MICROS, 0.0, WINDOW)
    spread = config.delay_model.cdf(old) - config.delay_model.cdf(young)
    return np.bincount(arms, spread, minlength=2)


def pulls(seed: int, count: int, span: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    times = T0 - (rng.uniform(0, span, size=count) * MICROS).astype(np.int64)
    return times, rng.integers(0, 2, size=count)


@pytest.mark.parametrize(
    "delay",
    [{"family": "exponential", "mean": 3600.0},
     {"family": "mixture", "weights": [0.33, 0.18, 0.49],
      "components": [{"family": "exponential", "mean": 900}, {"family": "exponential", "mean": 93_600},
                     {"family": "exponential", "mean": 1_209_600}]}],
)  # fmt: skip
async def test_exponential_families_are_exact_inside_the_window(delay: dict) -> None:
    config = campaign(delay)
    span = WINDOW - 2 * config.bucket_width_us / MICROS  # no bucket straddles the window edge
    times, arms = pulls(1, 3000, span)
    state = await histogram_of(config, times, arms)
    now = T0
    got = exposure(config, state, now).effective
    np.testing.assert_allclose(got, brute_force(config, times, arms, now), rtol=1e-9)


@pytest.mark.parametrize(
    "delay",
    [{"family": "exponential", "mean": 3600.0}, {"family": "uniform", "low": 0, "high": 50_000},
     {"family": "pareto", "alpha": 0.7, "scale": 60}, {"family": "fixed", "value": 7200},
     {"family": "geometric", "p": 0.0005},
     {"family": "empirical", "quantiles": [[0, 0.1], [3600, 0.5], [86_400, 0.9]]}],
)  # fmt: skip
@pytest.mark.parametrize("buckets", [8, 64])
async def test_every_family_within_the_bucket_bound_across_the_window_edge(delay: dict, buckets: int) -> None:
    config = campaign(delay, buckets)
    times, arms = pulls(2, 2000, 2.5 * WINDOW)
    state = await histogram_of(config, times, arms)
    for now in (T0, T0 + 3_600 * MICROS, T0 + 2 * 86_400 * MICROS):
        got = exposure(config, state, now).effective
        error = np.abs(got - brute_force(config, times, arms, now))
        assert np.all(error <= monotone_bound(config, times, arms, now) + 1e-9)


async def test_second_order_error_of_the_mean_rule_for_a_smooth_cdf() -> None:
    """Pareto above its scale is smooth: the mean rule errs by at most c·sup|F''|·w²/8 per bucket."""
    config = campaign({"family": "pareto", "alpha": 1.5, "scale": 3600.0}, buckets=64)
    width = config.bucket_width_us / MICROS
    times, arms = pulls(3, 4000, WINDOW - 2 * width)
    times -= 3600 * MICROS + config.bucket_width_us  # every age above the scale, where F is smooth
    times = np.maximum(times, T0 - int((WINDOW - width) * MICROS))
    state = await histogram_of(config, times, arms)
    ages = np.linspace(3600.0, WINDOW, 100_000)
    curvature = np.max(np.abs(np.gradient(np.gradient(config.delay_model.cdf(ages), ages), ages)))
    got = exposure(config, state, T0).effective
    bound = np.bincount(arms, minlength=2) * curvature * width**2 / 8
    assert np.all(np.abs(got - brute_force(config, times, arms, T0)) <= bound * 1.01 + 1e-9)


async def test_matured_pulls_weigh_the_cdf_at_the_window_and_are_not_pending() -> None:
    config = campaign({"family": "exponential", "mean": 3600.0})
    times, arms = pulls(4, 500, 1000.0)
    state = await histogram_of(config, times, arms)
    later = T0 + int(2 * WINDOW * MICROS)
    seen = exposure(config, state, later)
    expected = np.bincount(arms, minlength=2) * config.delay_model.cdf(WINDOW)
    np.testing.assert_allclose(seen.effective, expected, rtol=1e-12)
    assert seen.pending.tolist() == [0, 0] and seen.matured_cells.all()
    assert exposure(config, state, T0).pending.tolist() == np.bincount(arms, minlength=2).tolist()


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1))
async def test_histogram_does_not_depend_on_arrival_order(seed: int) -> None:
    config = campaign({"family": "uniform", "low": 0, "high": 40_000})
    times, arms = pulls(seed, 200, 1.5 * WINDOW)
    order = np.random.default_rng(seed).permutation(len(times))
    first = exposure(config, await histogram_of(config, times, arms), T0).effective
    second = exposure(config, await histogram_of(config, times[order], arms[order]), T0).effective
    np.testing.assert_allclose(first, second, rtol=1e-12)


@pytest.mark.parametrize(
    "delay",
    [{"family": "exponential", "mean": 1.0},
     {"family": "mixture", "weights": [0.5, 0.5],
      "components": [{"family": "exponential", "mean": 5}, {"family": "exponential", "mean": 86_400}]}],
)  # fmt: skip
async def test_delays_much_shorter_than_a_bucket_stay_finite_and_bounded(delay: dict) -> None:
    """exp(λ·w) overflows when the mean delay is tiny against the bucket width: such components use the
    mean rule; the estimate stays finite and within the bucket bound (a service found NaN here)."""
    config = campaign(delay, buckets=8)
    assert len(config.exact_components) == (0 if delay["family"] == "exponential" else 1)
    times, arms = pulls(5, 1000, 2 * WINDOW)
    state = await histogram_of(config, times, arms)
    for now in (T0, T0 + 7 * MICROS, T0 + 5000 * MICROS):
        got = exposure(config, state, now).effective
        assert np.all(np.isfinite(got))
        error = np.abs(got - brute_force(config, times, arms, now))
        assert np.all(error <= monotone_bound(config, times, arms, now) + 1e-9)


async def test_pending_age_is_the_mean_age_of_the_pulls_inside_the_window() -> None:
    """Without conversions every pull inside the window is pending: their mean age, computed pull by pull
    (the histogram keeps each bucket's mean pull time to the millisecond, so the two agree within 1 ms)."""
    config = campaign({"family": "exponential", "mean": 3600.0})
    times, arms = pulls(seed=7, count=400, span=0.9 * WINDOW)  # clear of the bucket that straddles the window
    seen = exposure(config, await histogram_of(config, times, arms), T0)
    for arm in (0, 1):
        ages = (T0 - times[arms == arm]) / MICROS
        assert seen.pending[arm] == len(ages)
        assert seen.pending_age[arm] == pytest.approx(ages.mean(), abs=1e-3)
    empty = exposure(config, await histogram_of(config, times[:0], arms[:0]), T0)
    assert np.isnan(empty.pending_age).all()
