"""How long a declared delay model says conversions take, for the defaults that must match it: the age by
which all but ``TAIL_LEVEL`` of conversions have arrived (a campaign's default window, campaign.py), and
the smallest tail-envelope scale the model satisfies (PatientBandits' default ``scale``, manegueu.py).

Unit-agnostic like the models: seconds in the service, rounds in the simulator.
"""

from __future__ import annotations

import math

import numpy as np

from latebandit.delays.models import DelayModel

TAIL_LEVEL = 1e-3  # the share of conversions a default window may leave out
LONGEST = 10 * 365 * 86_400.0  # the search stops here: nothing the service keeps is older
GRID = 4096  # ages per envelope check: consecutive ages differ by a factor 10^(6/4095) ≈ 1.0034
GRID_DECADES = 6.0  # the envelope check's ages span [reach·10^−6, reach]
BISECTIONS = 100


def reach(model: DelayModel, level: float = TAIL_LEVEL, longest: float = LONGEST) -> float:
    """The smallest age m with P(D > m) <= ``level`` (from above, by bisection); ``longest`` if the model
    leaves more than ``level`` beyond it (an empirical CDF that stops short of 1, a very heavy tail)."""
    if float(model.cdf(0.0)) >= 1.0 - level:
        return 0.0
    if float(model.cdf(longest)) < 1.0 - level:
        return longest
    low, high = 0.0, longest  # cdf(low) < 1 − level <= cdf(high); 100 halvings of 10 years leave 10^−22 s
    for _ in range(BISECTIONS):
        middle = 0.5 * (low + high)
        low, high = (low, middle) if float(model.cdf(middle)) >= 1.0 - level else (middle, high)
    return high


def envelope_scale(model: DelayModel, alpha: float, up_to: float) -> float:
    """The smallest s with P(D > a) <= min(1, (a/s)^−alpha) for every age a in (0, ``up_to``]: Assumption 1
    of Manegueu et al. 2020 (P(D > m) <= m^−α) with time counted in units of s, i.e. the tail bound the
    age-aware bias term sums. It is s = sup_a a·P(D > a)^(1/alpha); on a log grid of ages, each interval
    [a_i, a_(i+1)] is bounded by a_(i+1)·P(D > a_i)^(1/alpha) (P non-increasing), so the value returned is
    never below the supremum and at most 0.34 % above it. 0 when no delay reaches past 0."""
    return float(_scales(model, np.array([alpha]), up_to)[0])


def tightest_envelope(model: DelayModel, up_to: float, alphas: np.ndarray) -> tuple[float, float]:
    """Among the envelopes min(1, (a/s)^−α) that bound the model up to ``up_to`` (``envelope_scale``), α
    from ``alphas``, the one of least area over the model's typical delay (its mean, or its median when the
    mean is infinite): the bias bound an arm reads at age t is about its envelope's area up to t over t, and
    a campaign learns while its pulls are about a typical delay old. A Pareto(α0, s0) model gets (α0, s0)
    when α0 is on the grid (it lies under every other valid envelope at every age); an exponential of mean
    m gets α = 0.5, s = m/(2e), whose flat top (ψ = 1 below s, where every arm's index reads 1) ends three
    times sooner than that of the least-area envelope up to the 99.9 % reach (α = 1.5, s = 1.5·m/e)."""
    mean = model.mean()
    typical = min(up_to, mean if math.isfinite(mean) else reach(model, 0.5))
    scales = _scales(model, alphas, up_to)
    areas = [_area(float(alpha), float(scale), typical) for alpha, scale in zip(alphas, scales, strict=True)]
    best = int(np.argmin(areas))
    return float(alphas[best]), float(scales[best])


def _scales(model: DelayModel, alphas: np.ndarray, up_to: float) -> np.ndarray:
    """``envelope_scale`` for each of ``alphas``, from one evaluation of the model's CDF."""
    if up_to <= 0.0:
        return np.zeros(len(alphas))
    ages = np.geomspace(up_to * 10.0**-GRID_DECADES, up_to, GRID)
    survival = np.clip(1.0 - np.asarray(model.cdf(ages[:-1]), dtype=np.float64), 0.0, 1.0)
    bounds = ages[1:] * survival ** (1.0 / np.asarray(alphas, dtype=np.float64)[:, None])
    return np.maximum(ages[0], bounds.max(axis=1))


def _area(alpha: float, scale: float, up_to: float) -> float:
    """∫_0^up_to min(1, (a/s)^−α) da."""
    if up_to <= scale:
        return up_to
    ratio = up_to / scale
    tail = math.log(ratio) if abs(alpha - 1.0) < 1e-9 else (ratio ** (1.0 - alpha) - 1.0) / (1.0 - alpha)
    return scale * (1.0 + tail)
