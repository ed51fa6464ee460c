"""The divergences and KL-UCB solvers of latebandit.policies.indices against independent oracles:
SMPyBandits' ``kullback`` module, scipy's brentq and the Lambert-W closed
form (docs/algorithms/vernade.md), plus the index properties the policies rely on."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import os
import sys
import warnings
from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.special import lambertw

from latebandit.policies import indices
from latebandit.policies.indices import d_poisson, exploration, kl_bernoulli, klucb_bernoulli, klucb_poisson
from tests.conftest import missing

RATE = st.floats(min_value=1e-6, max_value=5.0)
SMALL_RATE = st.floats(min_value=1e-6, max_value=1.0 - 1e-6)
LEVEL = st.floats(min_value=1e-8, max_value=50.0)
EFFECTIVE = st.floats(min_value=1e-3, max_value=1e6)
BETA = st.floats(min_value=1e-6, max_value=30.0)
COUNT = st.integers(min_value=0, max_value=10_000)


@pytest.fixture(scope="module")
def kullback() -> ModuleType:
    """SMPyBandits' kullback module imported alone: the
    package's own __init__ chain breaks on current scipy. Its import-time warnings are silenced."""
    spec = importlib.util.find_spec("SMPyBandits")
    if spec is None or spec.origin is None:
        missing("smpybandits is not installed (pip install -e '.[test]')")
    policies_dir = os.path.join(os.path.dirname(spec.origin), "Policies")
    sys.path.insert(0, policies_dir)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import kullback as module
    except Exception as error:  # any import failure of the third-party oracle means "cannot check"
        missing(f"cannot import SMPyBandits' kullback module: {error!r}")
    finally:
        sys.path.remove(policies_dir)
    return module


def brentq_root(divergence: Callable[[float, float], np.ndarray], p: float, c: float, hi: float) -> float:
    """scipy's root of divergence(p, ·) = c on [p, hi], to a few ulps."""
    return brentq(lambda q: float(divergence(p, q)) - c, p, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps)


def delayed_klucb(conversions: float, effective: float, beta: float) -> float:
    """The DelayedKLUCB index from the raw statistics, capped at 1."""
    return float(klucb_poisson(conversions / effective, beta / effective))


# --- reference values and oracles ----------------------------------------------------------------


def test_divergence_reference_values() -> None:
    """The values printed by SMPyBandits' kullback module and closed forms."""
    assert kl_bernoulli(0.1, 0.2) == pytest.approx(0.036690014034750584, rel=1e-14)
    assert d_poisson(2.0, 1.0) == pytest.approx(0.3862943611198906, rel=1e-14)
    assert d_poisson(0.0, 0.7) == 0.7  # 0·log 0 = 0
    assert kl_bernoulli(0.0, 0.5) == pytest.approx(math.log(2.0), rel=1e-15)
    assert kl_bernoulli(1.0, 1.0) == 0.0
    assert kl_bernoulli(0.3, 1.0) == math.inf
    assert d_poisson(0.3, 0.0) == math.inf


def test_index_reference_values() -> None:
    """The library printed these at its default precision 1e-6; brentq gives the exact roots."""
    assert klucb_poisson(0.5, 0.2, upper=np.inf) == pytest.approx(1.0893765430263218, abs=1e-6)
    assert klucb_bernoulli(0.1, 0.2) == pytest.approx(0.37839145109809247, abs=1e-6)
    assert klucb_poisson(0.5, 0.2, upper=np.inf) == pytest.approx(brentq_root(d_poisson, 0.5, 0.2, 3.0), rel=1e-13)
    assert klucb_bernoulli(0.1, 0.2) == pytest.approx(brentq_root(kl_bernoulli, 0.1, 0.2, 1 - 1e-12), rel=1e-13)


def test_peer_table_values() -> None:
    """(S, Ñ, t) rows checked against SMPyBandits, with β = log t."""
    rows = [
        (3, 10.0, 100, 1.0),
        (12, 40.5, 1000, 0.7367518289),
        (0, 7.3, 50, 0.5358935624),
        (30, 31.0, 500, 1.0),
    ]
    for conversions, effective, t, expected in rows:
        beta = float(exploration(t, 0.0))
        assert delayed_klucb(conversions, effective, beta) == pytest.approx(expected, abs=1e-10)


@settings(max_examples=200, deadline=None)
@given(conversions=COUNT, effective=EFFECTIVE, t=st.integers(min_value=2, max_value=10**7))
def test_delayed_klucb_matches_smpybandits(kullback: ModuleType, conversions: int, effective: float, t: int) -> None:
    p, c = conversions / effective, math.log(t) / effective
    oracle = min(1.0, kullback.klucbPoisson(p, c, precision=1e-12))
    assert delayed_klucb(conversions, effective, math.log(t)) == pytest.approx(oracle, rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(p=RATE, c=LEVEL)
def test_uncapped_poisson_index_matches_smpybandits(kullback: ModuleType, p: float, c: float) -> None:
    oracle = kullback.klucbPoisson(p, c, precision=1e-13)
    assert klucb_poisson(p, c, upper=np.inf) == pytest.approx(oracle, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(p=st.floats(min_value=0.0, max_value=1.0), c=LEVEL)
def test_bernoulli_index_matches_smpybandits(kullback: ModuleType, p: float, c: float) -> None:
    oracle = kullback.klucbBern(p, c, precision=1e-13)
    assert klucb_bernoulli(p, c) == pytest.approx(oracle, rel=1e-9, abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(p=RATE, c=LEVEL)
def test_poisson_index_matches_brentq_and_lambert_w(p: float, c: float) -> None:
    ours = float(klucb_poisson(p, c, upper=np.inf))
    hi = p + c + math.sqrt(c * c + 2 * p * c)
    assert ours == pytest.approx(brentq_root(d_poisson, p, c, hi), rel=1e-9)
    y = 1.0 + c / p
    # W_{−1} is ill-conditioned near its branch point −1/e (c ≪ p), and e^{−y} underflows beyond y = 700
    if c / p > 1e-3 and y < 700:
        assert ours == pytest.approx(-p * lambertw(-math.exp(-y), k=-1).real, rel=1e-9)


@settings(max_examples=300, deadline=None)
@given(p=SMALL_RATE, c=LEVEL)
def test_bernoulli_index_matches_brentq(p: float, c: float) -> None:
    ours = float(klucb_bernoulli(p, c))
    below_one = np.nextafter(1.0, 0.0)
    root = 1.0 if kl_bernoulli(p, below_one) <= c else brentq_root(kl_bernoulli, p, c, below_one)
    assert ours == pytest.approx(root, rel=1e-9)


# --- edge cases, in the order of the solver --------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "c", "expected"),
    [
        (0.3, 0.0, 0.3),  # β = 0: the estimate itself
        (1.7, 0.0, 1.0),  # β = 0 and θ̂ > 1: min(p, 1)
        (1.7, 0.5, 1.0),  # θ̂ >= 1
        (1.0, 0.5, 1.0),
        (0.0, 0.25, 0.25),  # θ̂ = 0: min(1, c)
        (0.0, 3.0, 1.0),
        (0.9, 0.1, 1.0),  # d_Pois(0.9, 1) = 0.0052 <= c: capped
        (0.3, -1.0, 0.3),  # a negative level is no exploration
    ],
)
def test_poisson_edge_cases(p: float, c: float, expected: float) -> None:
    assert klucb_poisson(p, c) == expected


@pytest.mark.parametrize(
    ("p", "c", "expected"),
    [(0.3, 0.0, 0.3), (1.0, 0.5, 1.0), (0.0, 0.25, -math.expm1(-0.25)), (0.0, 800.0, 1.0)],
)
def test_bernoulli_edge_cases(p: float, c: float, expected: float) -> None:
    assert klucb_bernoulli(p, c) == pytest.approx(expected, rel=1e-15)


def test_bernoulli_index_near_one() -> None:
    """The Pinsker bracket is 1 here, where kl is infinite; the entropy bracket keeps Newton finite."""
    p, c = 0.5, 10.0
    ours = float(klucb_bernoulli(p, c))
    assert 1.0 - 1e-9 < ours < 1.0
    assert kl_bernoulli(p, ours) == pytest.approx(c, rel=1e-6)


def test_zero_estimate_closed_form_is_the_limit_of_the_solver() -> None:
    """p = 0 takes the closed form; a tiny positive p goes through Newton and must agree."""
    c = np.array([1e-6, 1e-3, 0.1, 0.5, 0.99])
    assert np.allclose(klucb_poisson(1e-14, c), klucb_poisson(0.0, c), rtol=1e-5)
    assert np.allclose(klucb_bernoulli(1e-14, c), klucb_bernoulli(0.0, c), rtol=1e-5)
    assert np.array_equal(klucb_poisson(0.0, c), np.minimum(1.0, c))


def test_exploration_level() -> None:
    t = np.array([1, 2, 100])
    assert np.array_equal(exploration(t, 0.0), [0.0, math.log(2), math.log(100)])
    assert exploration(100, 0.1) == pytest.approx(1.1 * math.log(100))
    assert exploration(0, 0.0) == 0.0  # floored, never −inf


# --- properties the policies rely on -------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(conversions=COUNT, effective=EFFECTIVE, beta=BETA, more=st.floats(min_value=1.0, max_value=100.0))
def test_index_increases_with_beta_and_decreases_with_effective(
    conversions: int, effective: float, beta: float, more: float
) -> None:
    base = delayed_klucb(conversions, effective, beta)
    assert delayed_klucb(conversions, effective, beta * more) >= base * (1 - 1e-12)
    assert delayed_klucb(conversions, effective * more, beta) <= base * (1 + 1e-12)


@settings(max_examples=300, deadline=None)
@given(p=RATE, c=LEVEL)
def test_index_is_the_root_inside_the_bracket(p: float, c: float) -> None:
    ours = float(klucb_poisson(p, c, upper=np.inf))
    assert p + math.sqrt(2 * p * c) * (1 - 1e-12) <= ours <= (p + c + math.sqrt(c * c + 2 * p * c)) * (1 + 1e-12)
    assert d_poisson(p, ours) == pytest.approx(c, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(conversions=COUNT, effective=EFFECTIVE, beta=BETA, scale=st.floats(min_value=0.05, max_value=20.0))
def test_scale_equivariance(conversions: int, effective: float, beta: float, scale: float) -> None:
    """Weights rescaled by 1/c: Ñ' = Ñ/c, θ̂' = c·θ̂, and the index becomes c·U with the cap at c.

    One may word the cap as 1/c; the derivation (θ' = τ_m·θ <= τ_m = c) puts it at c, which is
    what the identity d_Pois(c·p, c·q) = c·d_Pois(p, q) gives.
    """
    rescaled = klucb_poisson(conversions / (effective / scale), beta / (effective / scale), upper=scale)
    assert rescaled == pytest.approx(scale * delayed_klucb(conversions, effective, beta), rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(p=SMALL_RATE, gap=st.floats(min_value=1e-3, max_value=1.0))
def test_poisson_divergence_sandwich(p: float, gap: float) -> None:
    """Lemma 8: (1 − q)·d(p, q) <= d_Pois(p, q) <= d(p, q) for 0 < p < q < 1."""
    q = p + (1 - p) * gap * (1 - 1e-9)
    bernoulli, poisson = float(kl_bernoulli(p, q)), float(d_poisson(p, q))
    assert (1 - q) * bernoulli * (1 - 1e-9) <= poisson <= bernoulli * (1 + 1e-9)


def test_vectorised_equals_scalar_calls() -> None:
    rng = np.random.default_rng(5)
    p = np.concatenate([rng.uniform(0, 2, 200), [0.0, 1.0, 0.5]])
    c = np.concatenate([rng.exponential(0.3, 200), [0.2, 0.2, 0.0]])
    batch = klucb_poisson(p.reshape(-1, 1), c.reshape(-1, 1))
    assert batch.shape == (p.size, 1)
    assert np.array_equal(batch[:, 0], [float(klucb_poisson(a, b)) for a, b in zip(p, c, strict=True)])


def test_bisection_fallback_agrees_with_newton(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a single Newton step almost nothing converges, so the bisection fallback computes the index."""
    rng = np.random.default_rng(11)
    p, c = rng.uniform(1e-4, 1.0, 500), rng.exponential(0.2, 500)
    newton_poisson, newton_bernoulli = klucb_poisson(p, c, upper=np.inf), klucb_bernoulli(p, c)
    monkeypatch.setattr(indices, "NEWTON_STEPS", 1)
    assert np.allclose(klucb_poisson(p, c, upper=np.inf), newton_poisson, rtol=1e-11, atol=0)
    assert np.allclose(klucb_bernoulli(p, c), newton_bernoulli, rtol=1e-11, atol=0)
