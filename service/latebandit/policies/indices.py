"""Vectorised divergences and KL-UCB index solvers (Vernade et al. 2017; docs/algorithms/vernade.md).

Every function works elementwise on broadcastable arrays, so one call serves K arms of one campaign or
K arms of thousands of simulated runs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike

NEWTON_STEPS = 10  # 3–6 suffice in practice; run a fixed number, vectorised
BISECTION_CAP = 1100  # more halvings than a float interval can take, so the loop always ends
RTOL = 1e-12  # stopping rule |step| <= 1e-12·q

Divergence = Callable[[np.ndarray, np.ndarray], np.ndarray]
Step = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _xlogx_over(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x·log(x/y) with 0·log(0/y) = 0; through log1p where x ≈ y, where log(x/y) would lose digits.
    Callers silence numpy's floating-point warnings (the discarded branches divide by zero)."""
    ratio = x / y
    log_ratio = np.where(np.abs(ratio - 1.0) < 0.5, np.log1p((x - y) / y), np.log(ratio))
    return np.where(x > 0, x * log_ratio, 0.0)


def _poisson(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return _xlogx_over(p, q) + (q - p)


def _bernoulli(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return _xlogx_over(p, q) + _xlogx_over(1.0 - p, 1.0 - q)


def d_poisson(p: ArrayLike, q: ArrayLike) -> np.ndarray:
    """Poisson divergence d_Pois(p, q) = p·log(p/q) + q − p (so d_Pois(0, q) = q; +inf for q = inf)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    with np.errstate(all="ignore"):
        return np.where(np.isposinf(q), np.inf, _poisson(p, q))


def kl_bernoulli(p: ArrayLike, q: ArrayLike) -> np.ndarray:
    """Bernoulli KL divergence d(p, q); +inf where q ∈ {0, 1} differs from p."""
    with np.errstate(all="ignore"):
        return _bernoulli(np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64))


def exploration(t: ArrayLike, epsilon: float) -> np.ndarray:
    """β = max(0, (1+ε)·log t), floored at 0 (Vernade et al. 2017's exploration function; log 1 = 0)."""
    return np.maximum(0.0, (1.0 + epsilon) * np.log(np.maximum(np.asarray(t, dtype=np.float64), 1.0)))


def _poisson_step(p: np.ndarray, q: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Newton step g/g' for g(q) = d_Pois(p, q) − c, g' = 1 − p/q, at interior points (0 < p < q).

    log1p((p − q)/q) keeps q's relative error near machine precision; it is −inf only when p/q is below
    about 1e-16, and a non-finite step sends that element to the bisection fallback.
    """
    return (p * np.log1p((p - q) / q) + (q - p) - c) / (1.0 - p / q)


def _bernoulli_step(p: np.ndarray, q: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Newton step for g(q) = kl(p, q) − c, g' = (q − p)/(q(1 − q)), at interior points (0 < p < q < 1)."""
    g = p * np.log1p((p - q) / q) + (1.0 - p) * np.log1p((q - p) / (1.0 - q)) - c
    return g * q * (1.0 - q) / (q - p)


def _newton_from_above(
    p: np.ndarray, c: np.ndarray, lo: np.ndarray, hi: np.ndarray, step_of: Step, divergence: Divergence
) -> np.ndarray:
    """The root of divergence(p, q) = c in [lo, hi], for a divergence convex and increasing in q there.

    Newton from hi then decreases monotonically onto the root and never overshoots. An element
    stops once its step is below RTOL·q, so its value never depends on the other elements of the batch;
    elements that do not get there (or go non-finite) are redone by bisection on [lo, hi] with the exact
    divergence.
    """
    q, done = hi, np.zeros(hi.shape, dtype=bool)
    for _ in range(NEWTON_STEPS):
        step = step_of(p, q, c)
        q = np.where(done, q, q - step)
        done |= np.abs(step) <= RTOL * q
        if done.all():
            break
    if not done.all():
        todo = ~done
        q = q.copy()
        q[todo] = _bisect(p[todo], c[todo], lo[todo], hi[todo], divergence)
    return np.clip(q, lo, hi)


def _bisect(p: np.ndarray, c: np.ndarray, lo: np.ndarray, hi: np.ndarray, divergence: Divergence) -> np.ndarray:
    """The largest q in [lo, hi] with divergence(p, q) <= c, to RTOL relative; lo must be feasible."""
    for _ in range(BISECTION_CAP):
        open_ = hi - lo > RTOL * hi
        if not open_.any():
            break
        mid = 0.5 * (lo + hi)
        above = divergence(p, mid) > c
        hi = np.where(open_ & above, mid, hi)
        lo = np.where(open_ & ~above, mid, lo)
    return lo


def _first_case(cases: list[tuple[np.ndarray, ArrayLike]]) -> tuple[np.ndarray, np.ndarray]:
    """The value of the first true condition per element (nan where none holds), and where none holds.
    Like np.select, but without its broadcasting overhead, which dominates for one campaign's K arms."""
    out: ArrayLike = np.nan
    decided = np.zeros((), dtype=bool)
    for condition, value in reversed(cases):
        out = np.where(condition, value, out)
        decided = decided | condition
    return np.asarray(out, dtype=np.float64), ~np.broadcast_to(decided, np.shape(out))


def klucb_poisson(p: ArrayLike, c: ArrayLike, upper: ArrayLike = 1.0) -> np.ndarray:
    """max{q ∈ [p, upper] : d_Pois(p, q) <= c}, the DelayedKLUCB index with c = β/Ñ (Vernade et al. 2017).

    Edge cases, in order: c <= 0 → min(p, upper); p >= upper → upper; p = 0 → min(upper, c);
    d_Pois(p, upper) <= c → upper. Otherwise Newton from the closed-form upper bracket
    p + c + sqrt(c² + 2pc), above the lower bracket p + sqrt(2pc). ``upper`` is the cap, 1 for a
    conversion rate; a rescaled CDF moves it (scale equivariance).
    """
    p, c, upper = (np.asarray(x, dtype=np.float64) for x in (p, c, upper))
    out, inner = _first_case(
        [
            (c <= 0, np.minimum(p, upper)),
            (p >= upper, upper),
            (p == 0, np.minimum(upper, c)),
            (d_poisson(p, upper) <= c, upper),
        ]
    )
    if inner.any():
        pi, ci, ui = (np.broadcast_to(x, out.shape)[inner] for x in (p, c, upper))
        hi = np.minimum(ui, pi + ci + np.sqrt(ci * ci + 2.0 * pi * ci))
        lo = np.minimum(pi + np.sqrt(2.0 * pi * ci), hi)
        with np.errstate(all="ignore"):
            out[inner] = _newton_from_above(pi, ci, lo, hi, _poisson_step, _poisson)
    return out


def klucb_bernoulli(p: ArrayLike, c: ArrayLike) -> np.ndarray:
    """max{q ∈ [p, 1] : kl(p, q) <= c}, the KL-UCB index of Garivier & Cappé 2011 with c = β/N.

    Edge cases: c <= 0 → min(p, 1); p >= 1 → 1; p = 0 → 1 − e^{−c} (closed form). The upper bracket is
    the smaller of Pinsker's p + sqrt(c/2) and 1 − exp(−(c + H(p))/(1 − p)), which follows from
    kl(p, q) >= −H(p) − (1−p)·log(1−q) and, unlike 1, keeps the first Newton step finite.
    """
    p, c = np.asarray(p, dtype=np.float64), np.asarray(c, dtype=np.float64)
    out, inner = _first_case([(c <= 0, np.minimum(p, 1.0)), (p >= 1, 1.0), (p == 0, -np.expm1(-c))])
    if inner.any():
        pi, ci = (np.broadcast_to(x, out.shape)[inner] for x in (p, c))
        with np.errstate(all="ignore"):
            entropy = -(_xlogx_over(pi, np.ones_like(pi)) + _xlogx_over(1.0 - pi, np.ones_like(pi)))
            hi = np.minimum(pi + np.sqrt(ci / 2.0), -np.expm1(-(ci + entropy) / (1.0 - pi)))
            out[inner] = _newton_from_above(pi, ci, pi, hi, _bernoulli_step, _bernoulli)
    return out
