"""Delay models against scipy.stats and independent closed forms, their samplers against their CDFs
(DKW bound on 200k draws), spec round trips and validation (hypothesis: bad specs give ValueError only)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from latebandit.delays.models import FAMILIES, DelayModel, delay_from_spec

MIXTURE = {
    "family": "mixture",
    "weights": [0.33, 0.18, 0.49],
    "components": [
        {"family": "exponential", "mean": 900},
        {"family": "exponential", "mean": 93_600},
        {"family": "exponential", "mean": 1_209_600},
    ],
}  # the Criteo-like fit of docs/reproductions.md (15 min, 26 h, 14 d)
QUANTILES = [[0.0, 0.1], [2.0, 0.35], [5.5, 0.35], [10.0, 0.8], [40.0, 1.0]]
SPECS: dict[str, dict[str, Any]] = {
    "exponential": {"family": "exponential", "mean": 3.5},
    "geometric": {"family": "geometric", "p": 0.2},
    "fixed": {"family": "fixed", "value": 4.0},
    "uniform": {"family": "uniform", "low": 1.0, "high": 6.0},
    "pareto": {"family": "pareto", "alpha": 3.5, "scale": 2.0},
    "mixture": MIXTURE,
    "mixed-mixture": {
        "family": "mixture",
        "weights": [0.25, 0.75],
        "components": [{"family": "geometric", "p": 0.5}, {"family": "uniform", "low": 0, "high": 3}],
    },
    "empirical": {"family": "empirical", "quantiles": QUANTILES},
    "empirical-defective": {"family": "empirical", "quantiles": [[1.0, 0.2], [3.0, 0.7]]},
}


def empirical_cdf(points: list[list[float]], x: float) -> float:
    """Right-continuous step function, written as a loop."""
    value = 0.0
    for delay, probability in points:
        if x >= delay:
            value = probability
    return value


def reference_cdf(key: str, x: np.ndarray) -> np.ndarray:
    """The CDF from scipy.stats, or by hand where scipy has no such family."""
    if key == "exponential":
        return stats.expon(scale=3.5).cdf(x)
    if key == "geometric":
        return stats.geom(0.2, loc=-1).cdf(x)  # scipy's support starts at 1
    if key == "fixed":
        return np.array([1.0 if v >= 4.0 else 0.0 for v in x])
    if key == "uniform":
        return stats.uniform(loc=1.0, scale=5.0).cdf(x)
    if key == "pareto":
        return stats.pareto(3.5, scale=2.0).cdf(x)
    if key == "mixture":
        parts = [stats.expon(scale=mean).cdf(x) for mean in (900, 93_600, 1_209_600)]
        return 0.33 * parts[0] + 0.18 * parts[1] + 0.49 * parts[2]
    if key == "mixed-mixture":
        return 0.25 * stats.geom(0.5, loc=-1).cdf(x) + 0.75 * stats.uniform(0, 3).cdf(x)
    points = SPECS[key]["quantiles"]
    return np.array([empirical_cdf(points, v) for v in x])


def grid(key: str) -> np.ndarray:
    """Ages to compare at: negatives, support points of the discrete parts, and a fine range."""
    top = 3e6 if key == "mixture" else 60.0
    return np.concatenate([[-5.0, -1e-9, 0.0], np.arange(0.0, 41.0), np.linspace(0.0, top, 997), [np.inf]])


@pytest.mark.parametrize("key", SPECS)
def test_cdf_matches_reference(key: str) -> None:
    model = delay_from_spec(SPECS[key])
    x = grid(key)
    ours = model.cdf(x)
    assert ours.dtype == np.float64 and ours.shape == x.shape
    np.testing.assert_allclose(ours, reference_cdf(key, x), rtol=1e-12, atol=1e-15)
    assert (model.cdf(np.array([-1.0, -1e-300])) == 0).all()
    assert np.all(np.diff(model.cdf(np.sort(x))) >= 0)
    assert model.cdf(2.5).shape == ()


@pytest.mark.parametrize("key", SPECS)
def test_samples_follow_the_cdf(key: str) -> None:
    """Dvoretzky–Kiefer–Wolfowitz: P(sup |F_n − F| > ε) <= 2·exp(−2nε²), 2e-6 for ε = 0.006."""
    model = delay_from_spec(SPECS[key])
    n = 200_000
    draws = np.sort(model.sample(np.random.default_rng(21), n))
    assert draws.shape == (n,) and draws.dtype == np.float64
    x = grid(key)[:-1]  # finite ages: a defective empirical CDF puts its missing mass at inf
    empirical = np.searchsorted(draws, x, side="right") / n
    assert np.abs(empirical - model.cdf(x)).max() < 0.006


@pytest.mark.parametrize("key", SPECS)
def test_mean(key: str) -> None:
    model = delay_from_spec(SPECS[key])
    if key == "empirical-defective":
        assert model.mean() == math.inf  # 30% of conversions are never observed
        assert np.isinf(model.sample(np.random.default_rng(0), 10_000)).mean() == pytest.approx(0.3, abs=0.03)
        return
    draws = model.sample(np.random.default_rng(22), 200_000)
    error = max(draws.std() / math.sqrt(draws.size), 1e-12)
    assert model.mean() == pytest.approx(draws.mean(), abs=5 * error)


def test_closed_form_means() -> None:
    assert delay_from_spec(SPECS["geometric"]).mean() == pytest.approx(4.0)  # (1 − p)/p, support from 0
    assert delay_from_spec(SPECS["pareto"]).mean() == pytest.approx(3.5 * 2.0 / 2.5)
    assert delay_from_spec({"family": "pareto", "alpha": 1.0, "scale": 1.0}).mean() == math.inf
    assert delay_from_spec(SPECS["empirical"]).mean() == pytest.approx(2 * 0.25 + 10 * 0.45 + 40 * 0.2)
    assert math.isnan(delay_from_spec({"family": "unknown"}).mean())


def test_sample_shapes_and_reproducibility() -> None:
    for spec in SPECS.values():
        model = delay_from_spec(spec)
        first = model.sample(np.random.default_rng(3), (4, 5))
        assert first.shape == (4, 5)
        np.testing.assert_array_equal(first, model.sample(np.random.default_rng(3), (4, 5)))


def test_geometric_edges() -> None:
    always = delay_from_spec({"family": "geometric", "p": 1.0})
    np.testing.assert_array_equal(always.cdf([-0.5, 0.0, 3.7, np.inf]), [0.0, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(always.sample(np.random.default_rng(0), 5), np.zeros(5))
    geometric = delay_from_spec(SPECS["geometric"])
    assert geometric.cdf(2.99) == geometric.cdf(2.0) == pytest.approx(1 - 0.8**3)  # whole elapsed units


def test_exponential_components() -> None:
    assert delay_from_spec(SPECS["exponential"]).exponential_components() == ((1.0, 1 / 3.5),)
    components = delay_from_spec(MIXTURE).exponential_components()
    assert components is not None
    ages = np.linspace(0.0, 5e6, 101)
    closed = sum(w * (1 - np.exp(-rate * ages)) for w, rate in components)
    np.testing.assert_allclose(closed, delay_from_spec(MIXTURE).cdf(ages), rtol=1e-12, atol=1e-15)
    components_spec = [MIXTURE, {"family": "exponential", "mean": 1.0}]
    nested = delay_from_spec({"family": "mixture", "weights": [0.5, 0.5], "components": components_spec})
    nested_components = nested.exponential_components()
    assert nested_components is not None and len(nested_components) == 4
    assert math.fsum(w for w, _ in nested_components) == pytest.approx(1.0)
    for key in ("geometric", "fixed", "uniform", "pareto", "mixed-mixture", "empirical"):
        assert delay_from_spec(SPECS[key]).exponential_components() is None
    assert delay_from_spec({"family": "unknown"}).exponential_components() is None


@pytest.mark.parametrize("key", SPECS)
def test_spec_round_trip(key: str) -> None:
    model = delay_from_spec(SPECS[key])
    spec = model.to_spec()
    assert spec == SPECS[key] or key == "mixed-mixture"  # ints come back as floats there
    again = delay_from_spec(spec)
    assert again == model and again.to_spec() == spec


def test_unknown_family_has_no_cdf() -> None:
    model = delay_from_spec({"family": "unknown"})
    assert model.to_spec() == {"family": "unknown"}
    with pytest.raises(ValueError, match="unknown"):
        model.cdf(1.0)
    with pytest.raises(ValueError, match="unknown"):
        model.sample(np.random.default_rng(0), 3)


@pytest.mark.parametrize(
    ("spec", "mentions"),
    [
        ({"mean": 3}, "family"),
        ({"family": "gamma", "shape": 2}, "gamma"),
        ({"family": "exponential"}, "mean"),
        ({"family": "exponential", "mean": 0}, "mean"),
        ({"family": "exponential", "mean": -2}, "mean"),
        ({"family": "exponential", "mean": "60"}, "mean"),
        ({"family": "exponential", "mean": True}, "mean"),
        ({"family": "exponential", "mean": math.inf}, "mean"),
        ({"family": "exponential", "mean": math.nan}, "mean"),
        ({"family": "exponential", "mean": 10**400}, "mean"),
        ({"family": "exponential", "mean": 3, "scale": 2}, "scale"),
        ({"family": "geometric", "p": 0}, "p"),
        ({"family": "geometric", "p": 1.5}, "p"),
        ({"family": "fixed", "value": -1}, "value"),
        ({"family": "uniform", "low": 2, "high": 2}, "high"),
        ({"family": "uniform", "low": -1, "high": 2}, "low"),
        ({"family": "pareto", "alpha": 0, "scale": 1}, "alpha"),
        ({"family": "pareto", "alpha": 2, "scale": 0}, "scale"),
        ({"family": "mixture", "weights": [0.5, 0.4], "components": MIXTURE["components"][:2]}, "weights"),
        ({"family": "mixture", "weights": [1.0], "components": MIXTURE["components"][:2]}, "weights"),
        ({"family": "mixture", "weights": [1.2, -0.2], "components": MIXTURE["components"][:2]}, "weights"),
        ({"family": "mixture", "weights": [], "components": []}, "weights"),
        ({"family": "mixture", "weights": [1.0], "components": [{"family": "unknown"}]}, "components"),
        ({"family": "mixture", "weights": [1.0], "components": [{"family": "fixed", "value": -3}]}, "value"),
        ({"family": "mixture", "weights": "1", "components": [{"family": "fixed", "value": 3}]}, "weights"),
        ({"family": "empirical", "quantiles": []}, "quantiles"),
        ({"family": "empirical", "quantiles": [[1, 0.5], [1, 0.7]]}, "delay"),
        ({"family": "empirical", "quantiles": [[1, 0.5], [2, 0.4]]}, "probability"),
        ({"family": "empirical", "quantiles": [[1, 0.5], [2, 1.1]]}, "probability"),
        ({"family": "empirical", "quantiles": [[-1, 0.5]]}, "delay"),
        ({"family": "empirical", "quantiles": [[1, 0.0]]}, "quantiles"),
        ({"family": "empirical", "quantiles": [[1, 0.5, 3]]}, "quantiles"),
        ({"family": "unknown", "mean": 3}, "mean"),
    ],
)
def test_bad_specs_name_the_field(spec: dict[str, Any], mentions: str) -> None:
    with pytest.raises(ValueError, match=mentions):
        delay_from_spec(spec)


def test_mixture_weights_within_tolerance_are_accepted() -> None:
    fixed = [{"family": "fixed", "value": 1}, {"family": "fixed", "value": 2}]
    model = delay_from_spec({"family": "mixture", "weights": [0.5, 0.5 + 5e-10], "components": fixed})
    assert model.cdf(np.inf) == 1.0
    assert model.cdf(1.0) == pytest.approx(0.5, abs=1e-9)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = sorted({field for cls in FAMILIES.values() for field in cls.fields} | {"family", "extra"})


@st.composite
def delay_specs(draw: st.DrawFn, depth: int = 0) -> Any:
    """Spec-shaped objects with random families, fields and values, some nested, many invalid."""
    family = draw(st.sampled_from([*FAMILIES, "nope"]) | JSON)
    spec: dict[str, Any] = {"family": family}
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
        if field == "components" and depth < 2:
            spec[field] = draw(st.lists(delay_specs(depth + 1), max_size=3) | JSON)
        elif field == "quantiles":
            pair = st.lists(st.floats() | st.integers(-5, 50) | JSON, min_size=1, max_size=3)
            spec[field] = draw(st.lists(pair, max_size=4) | JSON)
        else:
            spec[field] = draw(st.floats() | st.integers() | st.lists(st.floats(0, 1), max_size=3) | JSON)
    return spec if draw(st.booleans()) else draw(st.sampled_from([spec, [spec], "spec", None]))


@settings(max_examples=400, deadline=None)
@given(spec=delay_specs())
def test_random_specs_fail_only_with_value_error(spec: Any) -> None:
    try:
        model = delay_from_spec(spec)
    except ValueError as error:
        assert str(error)
        return
    assert isinstance(model, DelayModel)
    assert delay_from_spec(model.to_spec()) == model
