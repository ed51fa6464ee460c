"""The delay-corrected count Ñ_k = Σ_{pulls i of k} τ_k(min(age_i, m)) in rounds, exactly, for R runs.

Age convention of docs/reference/scenarios.md: at the decision of round n, the pull of round s has age n − 1 − s.
Two exact paths, both O(1) in the number of past pulls per round:

- ``DecayedSums`` when τ(a) = 1 − Σ_j c_j·ρ_j^a at every integer age a >= 0: geometric delays
  (c = ρ = 1 − p) and (mixtures of) exponentials (c = w_j, ρ = e^{−λ_j}). This is the recursion of Vernade et
  al. 2017, §7, generalised to several components: E_j ← ρ_j·E_j + 1{A_n = k} − ρ_j^m·1{A_{n−m} = k}.
- ``BlockConvolution`` for any other CDF (uniform, fixed, Pareto, empirical, mixtures of them): Ñ is a
  causal convolution of the pull indicators with w(a) = τ(min(a, m)). Every B rounds one matrix product
  gives the contribution of all earlier pulls to the next B decisions; pulls inside the block are added
  as they happen. w is constant from some lag L on (L <= m when censored), so older pulls are a count.

Both expose ``effective()`` (Ñ for the current decision, (R, K)) and ``push(arms)`` (end of the round).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from latebandit.delays.models import DelayModel, Geometric, Mixture
from latebandit.sim.environment import Ring, one_hot

BLOCK = 64  # decisions per matrix product in BlockConvolution
DecayTerms = tuple[tuple[float, float], ...]


class Exposure(Protocol):
    def effective(self) -> np.ndarray:
        """(R, K) Ñ at the decision of the current round."""

    def push(self, arms: np.ndarray) -> None:
        """Record the current round's pulls (R,) and move to the next round."""


def decay_terms(model: DelayModel) -> DecayTerms | None:
    """((c_j, ρ_j), ...) with τ(a) = 1 − Σ_j c_j·ρ_j^a for every integer a >= 0, or None if there are none."""
    if isinstance(model, Geometric):
        survival = 1.0 - model.p
        return ((survival, survival),)
    if isinstance(model, Mixture):
        total = sum(model.weights)
        terms: list[tuple[float, float]] = []
        for weight, component in zip(model.weights, model.components, strict=True):
            inner = decay_terms(component)
            if inner is None:
                return None
            terms.extend((weight / total * c, rho) for c, rho in inner)
        return tuple(terms)
    exponentials = model.exponential_components()
    if exponentials is None:
        return None
    return tuple((weight, float(np.exp(-rate))) for weight, rate in exponentials)


class DecayedSums:
    """Ñ = τ_m·N_old + (N − N_old) − Σ_j c_j·E_j, with E_j = Σ_{pulls younger than m} ρ_j^age
    (uncensored: Ñ = N − Σ_j c_j·E_j over all pulls). Memory: the arms of the last m rounds."""

    def __init__(self, terms: list[DecayTerms], window: int | None, runs: int) -> None:
        n_arms, depth = len(terms), max(len(t) for t in terms)
        self._c = np.zeros((depth, 1, n_arms))
        self._rho = np.zeros((depth, 1, n_arms))
        for k, arm_terms in enumerate(terms):
            for j, (c, rho) in enumerate(arm_terms):
                self._c[j, 0, k], self._rho[j, 0, k] = c, rho
        self._sums = np.zeros((depth, runs, n_arms))
        self._pulls = np.zeros((runs, n_arms))
        self._old = np.zeros((runs, n_arms))
        self._window = window
        if window is not None:
            self._leave = self._rho**window
            self._tau_m = 1.0 - (self._c * self._leave).sum(axis=0)
            self._recent = Ring(window, runs, fill=-1, dtype=np.int64)

    def effective(self) -> np.ndarray:
        decayed = (self._c * self._sums).sum(axis=0)
        if self._window is None:
            return self._pulls - decayed
        return self._tau_m * self._old + (self._pulls - self._old) - decayed

    def push(self, arms: np.ndarray) -> None:
        pulled = one_hot(arms, self._pulls.shape[1])
        self._sums *= self._rho
        self._sums += pulled
        self._pulls += pulled
        if self._window is not None:
            leaving = one_hot(self._recent.push(arms), self._pulls.shape[1])
            self._sums -= self._leave * leaving
            self._old += leaving


class BlockConvolution:
    """Exact Ñ for any CDF. ``weights`` is (K, A + 1) with weights[k, a] = τ_k(min(a, m)) for ages
    0..A, A >= the largest age that can occur (the horizon)."""

    def __init__(self, weights: np.ndarray, runs: int, block: int = BLOCK) -> None:
        n_arms, ages = weights.shape
        changes = np.flatnonzero((weights != weights[:, -1:]).any(axis=0))
        self._lookback = lookback = int(changes[-1]) + 1 if changes.size else 0
        self._block = block
        lags = np.arange(max(ages, lookback + block + 1))
        saturated = weights[:, np.minimum(np.minimum(lags, lookback), ages - 1)]
        shared = bool((weights == weights[:1]).all())
        self._shared = shared
        rows = 1 if shared else n_arms
        # toeplitz[k, j, i] = w_k(j + L − 1 − i): decision j of the block, pull i of the lookback rows.
        offsets = np.arange(block)[:, None] + lookback - 1 - np.arange(lookback)[None, :]
        self._toeplitz = saturated[:rows][:, offsets]
        self._fresh = saturated[:, :block]  # w_k(age) for pulls made inside the block
        self._tail = saturated[:, lookback]  # weight of every pull older than the lookback
        self._history = np.zeros((lookback + block, runs, n_arms))
        self._old = np.zeros((runs, n_arms))
        self._run_index = np.arange(runs)
        self._offset = 0  # decision index inside the block
        self._done = 0  # pulls recorded so far, to skip history rows before the first round
        self._pending = self._block_base()

    def _block_base(self) -> np.ndarray:
        """(B, R, K) Ñ of the block's decisions from the pulls made before the block."""
        lookback, block = self._lookback, self._block
        runs, n_arms = self._old.shape
        base = np.empty((block, runs, n_arms))
        base[:] = self._tail * self._old
        start = lookback - min(self._done, lookback)
        if start < lookback:
            history, toeplitz = self._history[start:lookback], self._toeplitz[:, :, start:]
            if self._shared:
                base += (toeplitz[0] @ history.reshape(lookback - start, -1)).reshape(block, runs, n_arms)
            else:
                for k in range(n_arms):
                    base[:, :, k] += toeplitz[k] @ history[:, :, k]
        return base

    def effective(self) -> np.ndarray:
        return self._pending[self._offset].copy()

    def push(self, arms: np.ndarray) -> None:
        j, block, lookback = self._offset, self._block, self._lookback
        runs = self._run_index
        self._pending[j + 1 :, runs, arms] += self._fresh[arms, : block - j - 1].T
        self._history[lookback + j, runs, arms] = 1.0
        self._offset += 1
        self._done += 1
        if self._offset == block:
            self._old += self._history[:block].sum(axis=0)
            self._history[:lookback] = self._history[block:]
            self._history[lookback:] = 0.0
            self._offset = 0
            self._pending = self._block_base()


def exposure_for(delays: tuple[DelayModel, ...], window: int | None, horizon: int, runs: int) -> Exposure:
    """The exact accounting for these per-arm delay models: decayed sums when every arm has them."""
    terms = [decay_terms(model) for model in delays]
    exact = [arm_terms for arm_terms in terms if arm_terms is not None]
    if len(exact) == len(terms):
        return DecayedSums(exact, window, runs)
    ages = np.arange(horizon + 1, dtype=np.float64)
    capped = ages if window is None else np.minimum(ages, window)
    return BlockConvolution(np.stack([model.cdf(capped) for model in delays]), runs)


def weighted_regret(
    delays: tuple[DelayModel, ...],
    window: int | None,
    horizon: int,
    gaps: np.ndarray,
    blocks: list[tuple[int, int, np.ndarray]],
) -> np.ndarray:
    """(R,) L(T) = Σ_{s <= T} Δ_{A_s}·τ_{A_s}(min(T − s, m)) (= Σ_k Δ_k·Ñ_k(T + 1)) from the rounds played as
    blocks (first round, rounds, arms (R,)): cumulative sums of the weights over ages make each block O(R)."""
    ages = np.arange(horizon + 1, dtype=np.float64)
    capped = ages if window is None else np.minimum(ages, window)
    weights = np.stack([model.cdf(capped) for model in delays])  # (K, T + 1) τ by age
    below = np.concatenate([np.zeros((len(delays), 1)), np.cumsum(weights, axis=1)], axis=1)  # Σ_{age < a}
    total = np.zeros(blocks[0][2].shape if blocks else 0)
    run_gaps = gaps if gaps.ndim == 2 else gaps[None, :]  # (R or 1, K): a prior draws each run's means
    runs = np.arange(total.size) if gaps.ndim == 2 else np.zeros(total.size, dtype=np.int64)
    for first, rounds, arms in blocks:  # ages horizon − first down to horizon − first − rounds + 1
        exposure = below[arms, horizon - first + 1] - below[arms, horizon - first - rounds + 1]
        total += run_gaps[runs, arms] * exposure
    return total
