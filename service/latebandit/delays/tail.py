"""What the observed delays of one arm say: counts in fixed log-spaced buckets, and their tail exponent.

The buckets are the bounded state the store keeps per arm (docs/algorithms/manegueu.md: operators
must see whether a campaign's delay assumption holds). Bucket 0 holds delays below 1 unit (a second in the
service, a round in the simulator); bucket j >= 1 holds [r^(j−1), r^j) with r = √2, and the last bucket is
open above. The same edges serve seconds and rounds.

Tail exponent [ours]: if P(D > x) = (x/u)^−α above a bucket edge u = r^(j0−1), the bucket offset i = j − j0
of a delay above u is geometric, P(i) = q^i·(1 − q) with q = r^−α, because the edges are geometric. The
maximum-likelihood estimate from the counts is then exact for grouped data (no within-bucket guess):
q̂ = ī/(1 + ī), α̂ = log(1 + 1/ī)/log r, with the Fisher standard error (1 − q̂)/(log r·sqrt(q̂·k)) (that of
the truncated geometric when the fit is truncated, ``_geometric_variance``). It is
the Hill estimator's counterpart on a geometric grid. The threshold is the highest edge with at least
``TAIL_SHARE`` of the observations (and ``MIN_TAIL``) above it.

Censoring: a delay longer than the age of a pull cannot have been observed yet, which thins the top of the
histogram and biases α̂ upwards. Given the exposure (pulls old enough for each bucket), ``tail_exponent``
weights each bucket by the inverse of its exposure and stops the fit where fewer than half of the pulls are
old enough (a truncated geometric, solved by bisection). Still a diagnostic: a policy uses its lower
confidence bound, floored (docs/algorithms/manegueu.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

RATIO = math.sqrt(2.0)
BUCKETS = 64  # r^63 ≈ 3·10⁹: a century in seconds
MIN_TAIL = 10
EXPOSED_SHARE = 0.5  # a bucket enters the fit while at least this share of the pulls could have shown it
BISECTIONS = 60
QUANTILES = (0.5, 0.9, 0.99)
TAIL_SHARE = 0.2
LOG_RATIO = math.log(RATIO)


def bucket_of(delay: ArrayLike) -> np.ndarray:
    """The bucket index of each delay (>= 0, in seconds or rounds)."""
    d = np.asarray(delay, dtype=np.float64)
    with np.errstate(divide="ignore"):
        above = np.floor(np.log(np.maximum(d, 1.0)) / LOG_RATIO + 1e-12).astype(np.int64) + 1
    return np.where(d < 1.0, 0, np.minimum(above, BUCKETS - 1))


def lower_edges() -> np.ndarray:
    """(BUCKETS,) the lower edge of every bucket: 0, 1, r, r², …"""
    return np.concatenate(([0.0], 2.0 ** (np.arange(BUCKETS - 1) / 2.0)))


@dataclass(frozen=True)
class TailEstimate:
    """Arrays of the counts' leading shape (one entry per arm, or per run and arm)."""

    alpha: np.ndarray  # nan while fewer than MIN_TAIL observations; inf if the tail sits in one bucket
    se: np.ndarray
    observations: np.ndarray  # delays above the threshold
    threshold: np.ndarray  # the lower edge u the power law is fitted above (nan: no fit)


def upper_edges() -> np.ndarray:
    """(BUCKETS,) the upper edge of every bucket: 1, r, r², …, and inf for the open last one."""
    return np.append(2.0 ** (np.arange(BUCKETS - 1) / 2.0), np.inf)


def tail_exponent(counts: ArrayLike, exposure: ArrayLike | None = None) -> TailEstimate:
    """α̂ for bucket counts (..., BUCKETS), vectorised over arms and runs.

    ``exposure`` (same shape), when given, is the number of pulls at least as old as each bucket's upper
    edge: the pulls for which a delay in that bucket would have been seen. A bucket's count is then divided
    by its exposure relative to the first bucket's (inverse-probability weighting), and buckets seen by
    fewer than EXPOSED_SHARE of the pulls end the fit, which becomes the MLE of a geometric truncated at the
    last usable bucket. This is how the estimate uses "matured cohorts" (docs/algorithms/manegueu.md): without it,
    long delays not yet observable thin the top of the histogram and α̂ comes out too large.
    """
    c = np.asarray(counts, dtype=np.float64)
    if exposure is None:
        weights, usable, truncated = c, np.ones(c.shape, dtype=bool), False
    else:
        e = np.asarray(exposure, dtype=np.float64)
        reference = e[..., :1]
        usable = np.logical_and.accumulate((e >= EXPOSED_SHARE * reference) & (reference > 0), axis=-1)
        weights, truncated = np.where(usable, c * reference / np.maximum(e, 1.0), 0.0), True
    last = usable.sum(axis=-1) - 1  # the last usable bucket
    raw = np.where(usable, c, 0.0)
    raw_above = np.cumsum(raw[..., ::-1], axis=-1)[..., ::-1]  # observations in usable buckets >= j
    above = np.cumsum(weights[..., ::-1], axis=-1)[..., ::-1]
    index_sum = np.cumsum((weights * np.arange(BUCKETS))[..., ::-1], axis=-1)[..., ::-1]  # Σ_{i>=j} i·w_i
    wanted = np.maximum(MIN_TAIL, TAIL_SHARE * raw_above[..., :1])
    j = np.arange(BUCKETS)
    eligible = (raw_above >= wanted) & (j >= 1) & (j < last[..., None] + (0 if truncated else 1))
    start = BUCKETS - 1 - np.argmax(eligible[..., ::-1], axis=-1)
    fitted = eligible.any(axis=-1)
    k = np.take_along_axis(raw_above, start[..., None], axis=-1)[..., 0]
    mass = np.take_along_axis(above, start[..., None], axis=-1)[..., 0]
    sums = np.take_along_axis(index_sum, start[..., None], axis=-1)[..., 0]
    span = np.where(truncated, last - start, np.inf)  # buckets above the threshold's, as a geometric's support
    with np.errstate(all="ignore"):
        offset = np.where(fitted, sums / mass - start, np.nan)
        q = _geometric_parameter(np.where(fitted, offset, 1.0), span)
        alpha = np.where(offset > 0, -np.log(q) / LOG_RATIO, np.where(fitted, np.inf, np.nan))
        se = np.where(offset > 0, 1.0 / (LOG_RATIO * np.sqrt(k * _geometric_variance(q, span))), np.nan)
    return TailEstimate(
        alpha, se, np.where(fitted, k, 0).astype(np.int64), np.where(fitted, lower_edges()[start], np.nan)
    )


def _geometric_parameter(mean: np.ndarray, span: np.ndarray) -> np.ndarray:
    """q with E[i] = mean for P(i) ∝ q^i on i = 0..span (span = inf: q = mean/(1 + mean)), by bisection:
    the truncated mean q/(1−q) − (M+1)·q^(M+1)/(1 − q^(M+1)) increases in q, up to M/2 at q → 1."""
    low, high = np.zeros(mean.shape), np.ones(mean.shape)
    for _ in range(BISECTIONS):
        q = 0.5 * (low + high)
        tail = np.where(np.isinf(span), 0.0, (span + 1.0) * q ** (span + 1.0) / (1.0 - q ** (span + 1.0)))
        above = q / (1.0 - q) - tail > mean
        low, high = np.where(above, low, q), np.where(above, q, high)
    return np.where(np.isinf(span), mean / (1.0 + mean), 0.5 * (low + high))


def _geometric_variance(q: np.ndarray, span: np.ndarray) -> np.ndarray:
    """Var(i) for P(i) ∝ q^i on i = 0..span: the Fisher information about log q per observation, so
    se(α̂) = 1/(log r·sqrt(k·Var)). Untruncated (span = inf) it is q/(1 − q)², the standard error the fit
    had everywhere; truncated, the offsets cannot spread as far, each observation says less about q, and
    that standard error put the bound α̂ − 2·se above the true α in 24 % of draws (tests/unit/test_tail_coverage.py)."""
    i = np.arange(BUCKETS, dtype=np.float64)
    q_safe = np.clip(q, 1e-300, 1.0 - 1e-12)[..., None]
    inside = i <= np.where(np.isinf(span), BUCKETS, span)[..., None]
    with np.errstate(all="ignore"):
        mass = np.where(inside, np.exp(i * np.log(q_safe)), 0.0)
        total = mass.sum(axis=-1)
        mean = (mass * i).sum(axis=-1) / total
        variance = (mass * i * i).sum(axis=-1) / total - mean**2
        untruncated = q / (1.0 - q) ** 2
    return np.where(np.isinf(span), untruncated, variance)


def quantile(counts: ArrayLike, level: float) -> float:
    """The upper edge of the bucket holding the ``level`` quantile (an upper bound on it); nan if empty."""
    c = np.asarray(counts, dtype=np.float64)
    total = c.sum()
    if total <= 0:
        return math.nan
    j = int(np.searchsorted(np.cumsum(c), level * total))
    return math.inf if j >= BUCKETS - 1 else float(2.0 ** (j / 2.0))


def delay_summary(counts: ArrayLike, exposure: ArrayLike | None = None) -> dict[str, Any]:
    """One arm's delay histogram for GET /state: totals, quantile upper bounds, the tail fit, and the
    non-empty buckets as [lower edge, upper edge (null: open), count]."""
    c = np.asarray(counts, dtype=np.int64)
    tail = tail_exponent(c, exposure)
    edges = lower_edges()
    return {
        "observed": int(c.sum()),
        "quantiles": {f"p{round(level * 100)}": _finite(quantile(c, level)) for level in QUANTILES},
        "tail_alpha": _finite(float(tail.alpha)),
        "tail_alpha_se": _finite(float(tail.se)),
        "tail_observations": int(tail.observations),
        "tail_threshold": _finite(float(tail.threshold)),
        "buckets": [
            [float(edges[j]), float(edges[j + 1]) if j + 1 < BUCKETS else None, int(c[j])] for j in np.flatnonzero(c)
        ],
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
