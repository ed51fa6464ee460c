"""Ñ in rounds against the brute force Σ_i τ(min(age_i, m)) ("closed form vs brute
force"): the geometric recursion of Vernade et al. 2017, §7, and its exponential-mixture generalisation, and the block
convolution for every other CDF, censored and not, shared and per arm, to 1e-9."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from latebandit.delays.models import delay_from_spec
from latebandit.sim.accounting import BlockConvolution, DecayedSums, decay_terms, exposure_for

RUNS, ARMS, HORIZON = 5, 3, 700
GEOMETRIC = {"family": "geometric", "p": 0.01}
DECAYING = [
    GEOMETRIC,
    {"family": "geometric", "p": 1.0},
    {"family": "exponential", "mean": 40.0},
    {
        "family": "mixture",
        "weights": [0.33, 0.18, 0.49],
        "components": [{"family": "exponential", "mean": m} for m in (0.75, 78.0, 1008.0)],
    },
    {"family": "mixture", "weights": [0.5, 0.5], "components": [GEOMETRIC, {"family": "exponential", "mean": 3.0}]},
]
GENERAL = [
    {"family": "uniform", "low": 3.0, "high": 90.0},
    {"family": "fixed", "value": 17.0},
    {"family": "pareto", "alpha": 0.8, "scale": 2.5},  # infinite mean: never saturates without a window
    {"family": "empirical", "quantiles": [[0, 0.1], [5, 0.4], [50, 0.95]]},
    {"family": "mixture", "weights": [0.5, 0.5], "components": [GEOMETRIC, {"family": "uniform", "low": 0, "high": 9}]},
]
WINDOWS = [None, 0, 1, 30, 250]


def brute_force(models: list[Any], window: int | None, history: np.ndarray, decision: int) -> np.ndarray:
    """(R, K) Σ over pulls s < decision of τ_k(min(decision − 1 − s, m)); rounds are 1-based."""
    out = np.zeros((RUNS, ARMS))
    ages = decision - 1 - np.arange(1, decision)
    capped = ages if window is None else np.minimum(ages, window)
    for k, model in enumerate(models):
        weights = model.cdf(capped)
        out[:, k] = ((history[: decision - 1] == k) * weights[:, None]).sum(axis=0)
    return out


def max_relative_error(specs: list[dict[str, Any]], window: int | None, seed: int) -> tuple[float, type]:
    models = [delay_from_spec(spec) for spec in specs]
    exposure = exposure_for(tuple(models), window, HORIZON, RUNS)
    rng = np.random.default_rng(seed)
    history = rng.choice(ARMS, size=(HORIZON, RUNS), p=[0.6, 0.3, 0.1])  # (T, R) arms, unequal rates
    worst = 0.0
    for decision in range(1, HORIZON + 1):
        if decision % 29 == 0 or decision < 4 or decision == HORIZON:
            expected = brute_force(models, window, history, decision)
            error = np.abs(exposure.effective() - expected) / np.maximum(1.0, expected)
            worst = max(worst, float(error.max()))
        exposure.push(history[decision - 1])
    return worst, type(exposure)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("spec", DECAYING, ids=lambda spec: spec["family"] + str(len(str(spec))))
def test_decayed_sums_match_the_brute_force(spec: dict[str, Any], window: int | None) -> None:
    error, kind = max_relative_error([spec] * ARMS, window, seed=1)
    assert kind is DecayedSums and error <= 1e-9


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("spec", GENERAL, ids=lambda spec: spec["family"] + str(len(str(spec))))
def test_block_convolution_matches_the_brute_force(spec: dict[str, Any], window: int | None) -> None:
    error, kind = max_relative_error([spec] * ARMS, window, seed=2)
    assert kind is BlockConvolution and error <= 1e-9


@pytest.mark.parametrize("window", [None, 10, 250])
def test_one_delay_per_arm(window: int | None) -> None:
    for specs, expected in (
        ([DECAYING[0], DECAYING[2], DECAYING[3]], DecayedSums),
        ([DECAYING[0], GENERAL[0], GENERAL[2]], BlockConvolution),
    ):
        error, kind = max_relative_error(specs, window, seed=3)
        assert kind is expected and error <= 1e-9


def test_decay_terms_reproduce_the_cdf_and_refuse_other_families() -> None:
    ages = np.arange(200)
    for spec in DECAYING:
        terms = decay_terms(delay_from_spec(spec))
        assert terms is not None
        closed = 1.0 - sum(c * rho**ages for c, rho in terms)
        np.testing.assert_allclose(closed, delay_from_spec(spec).cdf(ages), atol=1e-12)
    assert all(decay_terms(delay_from_spec(spec)) is None for spec in GENERAL)


def test_block_lookback_stops_where_the_weights_stop_changing() -> None:
    """Censored: the weights are constant from m on; a bounded delay saturates at its largest value."""
    uniform = delay_from_spec(GENERAL[0])
    ages = np.arange(HORIZON + 1.0)
    assert BlockConvolution(uniform.cdf(np.minimum(ages, 30))[None], RUNS)._lookback == 30
    assert BlockConvolution(uniform.cdf(ages)[None], RUNS)._lookback == 90
