"""Off-policy estimators of a policy's value (expected reward per decision, within the window) from a log
with propensities, given the evaluated policy's distribution at every logged decision (``reenact``).

- ``replay``: the mean reward of the decisions the re-enactment accepted (Li et al. 2011; with rejection
  sampling for non-uniform logs). Each is one step of the policy's own play, so it is the natural
  estimator for an adaptive policy on a uniformly randomised log.
- ``ips``: inverse propensity scoring, mean of w_k·r_k with w_k = min(π_k(a_k)/μ_k, clip).
- ``snips``: self-normalised IPS, Σ w_k·r_k / Σ w_k: slightly biased, but it does not carry the noise of
  the weights' own mean (1 only in expectation), so its interval is narrower where the weights vary.
- ``doubly-robust``: mean of Σ_a π_k(a)·r̂(a) + w_k·(r_k − r̂(a_k)) (Dudík, Langford & Li 2011). r̂ is the
  per-arm mean logged reward, cross-fitted (odd decisions use the even ones' means and vice versa) so
  that r̂ never depends on the reward it corrects; the estimate stays unbiased whatever r̂'s quality and
  its variance shrinks as r̂ approaches the arm means.

Every term sequence is averaged with a normal 95 % interval from its sample variance: the terms are
martingale differences around the value given the past (unbiased given the history when the weights are
not clipped), so the martingale central limit theorem applies. For an adaptive policy the interval is
conditional on the replayed trajectory. Only decisions whose reward is known (window closed) enter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054  # standard normal 97.5 % quantile
ESTIMATORS = ("replay", "ips", "snips", "doubly-robust")


@dataclass(frozen=True)
class Estimate:
    estimator: str
    value: float
    ci95: tuple[float, float]
    effective_sample_size: float
    terms: np.ndarray  # the per-decision terms averaged (NaN where a decision does not enter)


@dataclass(frozen=True)
class LoggedArrays:
    """The log as arrays over its n counted decisions."""

    arms: np.ndarray  # (n,) int
    propensity: np.ndarray  # (n,) μ_k
    reward: np.ndarray  # (n,) NaN where unknown (window still open at the end of the log)


def mean_interval(terms: np.ndarray) -> tuple[float, tuple[float, float]]:
    """The mean of the non-NaN terms and its normal 95 % interval (NaN with fewer than two terms)."""
    present = terms[~np.isnan(terms)]
    if present.size < 2:
        return float("nan"), (float("nan"), float("nan"))
    mean = float(present.mean())
    half = Z95 * float(present.std(ddof=1)) / np.sqrt(present.size)
    return mean, (float(mean - half), float(mean + half))


def weights(log: LoggedArrays, probabilities: np.ndarray, clip: float) -> np.ndarray:
    """w_k = min(π_k(a_k) / μ_k, clip)."""
    chosen = probabilities[np.arange(log.arms.size), log.arms]
    return np.minimum(chosen / log.propensity, clip)


def kish(w: np.ndarray) -> float:
    """Kish's effective sample size (Σw)²/Σw²: how many unweighted samples the weighted ones are worth."""
    total = float((w * w).sum())
    return float(w.sum()) ** 2 / total if total > 0 else 0.0


def replay(log: LoggedArrays, accepted: np.ndarray) -> Estimate:
    terms = np.where(accepted, log.reward, np.nan)
    value, ci = mean_interval(terms)
    return Estimate("replay", value, ci, float((~np.isnan(terms)).sum()), terms)


def ips(log: LoggedArrays, probabilities: np.ndarray, clip: float) -> Estimate:
    known = ~np.isnan(log.reward)
    w = weights(log, probabilities, clip)
    terms = np.where(known, w * np.nan_to_num(log.reward), np.nan)
    value, ci = mean_interval(terms)
    return Estimate("ips", value, ci, kish(w[known]), terms)


def snips(log: LoggedArrays, probabilities: np.ndarray, clip: float) -> Estimate:
    """Its interval is the delta method's: the mean of w_k·(r_k − V̂)/w̄ is 0 at the estimate V̂, and its
    spread is the estimate's. The terms (w_k·r_k/w̄) average to V̂, for the curve over time."""
    known = ~np.isnan(log.reward)
    w = weights(log, probabilities, clip)
    mean_weight = float(w[known].mean()) if known.any() else 0.0
    if known.sum() < 2 or mean_weight <= 0.0:
        nan = float("nan")
        return Estimate("snips", nan, (nan, nan), kish(w[known]), np.full(log.arms.size, nan))
    reward = np.nan_to_num(log.reward)
    value = float((w * reward)[known].sum() / w[known].sum())
    half = Z95 * float((w * (reward - value))[known].std(ddof=1)) / mean_weight / math.sqrt(known.sum())
    terms = np.where(known, w * reward / mean_weight, np.nan)
    return Estimate("snips", value, (value - half, value + half), kish(w[known]), terms)


def cross_fitted_means(log: LoggedArrays, n_arms: int) -> np.ndarray:
    """(n, K) r̂ for each decision: per-arm mean reward over the known decisions of the other parity
    (the overall mean of that half for an arm it never played)."""
    known = ~np.isnan(log.reward)
    parity = np.arange(log.arms.size) % 2
    fitted = np.empty((log.arms.size, n_arms))
    for half in (0, 1):
        other = known & (parity != half)
        sums = np.bincount(log.arms[other], log.reward[other], minlength=n_arms)
        counts = np.bincount(log.arms[other], minlength=n_arms)
        overall = float(log.reward[other].mean()) if other.any() else 0.0
        fitted[parity == half] = np.where(counts > 0, sums / np.maximum(counts, 1), overall)
    return fitted


def doubly_robust(log: LoggedArrays, probabilities: np.ndarray, clip: float) -> Estimate:
    known = ~np.isnan(log.reward)
    w = weights(log, probabilities, clip)
    fitted = cross_fitted_means(log, probabilities.shape[1])
    chosen_fit = fitted[np.arange(log.arms.size), log.arms]
    direct = (probabilities * fitted).sum(axis=1)
    terms = np.where(known, direct + w * (np.nan_to_num(log.reward) - chosen_fit), np.nan)
    value, ci = mean_interval(terms)
    return Estimate("doubly-robust", value, ci, kish(w[known]), terms)


def running(terms: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The estimate as the log unfolds: at up to ``points`` decision indices, the mean of the terms so far
    and its 95 % interval. Returns (indices, value, low, high)."""
    present = ~np.isnan(terms)
    filled = np.where(present, terms, 0.0)
    count = np.cumsum(present)
    total, squares = np.cumsum(filled), np.cumsum(filled * filled)
    grid = np.unique(np.linspace(0, terms.size - 1, min(points, terms.size)).astype(int))
    grid = grid[count[grid] >= 2]
    n = count[grid]
    mean = total[grid] / n
    variance = np.maximum(squares[grid] - n * mean * mean, 0.0) / (n - 1)
    half = Z95 * np.sqrt(variance / n)
    return grid, mean, mean - half, mean + half
