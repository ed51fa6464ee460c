"""DelayedUCB and DelayedKLUCB of Vernade, Cappé & Perchet (UAI 2017), Algorithm 1 (docs/algorithms/vernade.md).

The caller supplies Ñ = Σ τ(min(age, m)) (ages as docs/reference/scenarios.md counts them) and S censored at
the window; these policies only turn (N, S, Ñ, t) into indices. θ̂ = S/Ñ is deliberately not capped (it is
conditionally unbiased); the UCB index is not capped either, the KL index is capped at 1.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from latebandit.policies.base import ArmStats, Array, IndexPolicy
from latebandit.policies.indices import klucb_poisson


class DelayCorrected(IndexPolicy):
    """Index policies that divide by the delay-corrected count Ñ instead of the raw pulls N."""

    delay_corrected: ClassVar[bool] = True

    def effective_pulls(self, stats: ArmStats) -> np.ndarray:
        return np.asarray(stats.effective, dtype=np.float64)


class DelayedUCB(DelayCorrected):
    """U = θ̂ + sqrt(N·β/2)/Ñ: Hoeffding on S − θÑ, a sum of N centred terms of range 1 (the paper's DelayedUCB).

    >>> import numpy as np
    >>> from latebandit.policies import ArmStats, make_policy
    >>> stats = ArmStats(np.array([[100, 100, 100]]), np.array([[20.0, 50.0, 10.0]]),  # N, S
    ...                   np.array([[80.0, 90.0, 70.0]]), np.array([301]))  # Ñ = Σ τ(age), t
    >>> policy = make_policy("delayed-ucb", {}, 3)
    >>> policy.index(stats).round(3).tolist(), policy.choose(stats, np.random.default_rng(0)).arm.tolist()
    ([[0.461, 0.743, 0.384]], [1])
    """

    name: ClassVar[str] = "delayed-ucb"

    def bound(self, estimate: Array, stats: ArmStats, effective: Array, beta: Array) -> Array:
        return estimate + np.sqrt(np.asarray(stats.pulls, dtype=np.float64) * beta / 2.0) / effective


class DelayedKLUCB(DelayCorrected):
    """U = max{q ∈ [θ̂, 1] : Ñ·d_Pois(θ̂, q) <= β}. The Poisson divergence, not the Bernoulli one, because
    the revealed outcomes are Bernoulli(τ_i·θ) with unequal τ_i (the paper's DelayedKLUCB).

    >>> import numpy as np
    >>> from latebandit.policies import ArmStats, make_policy
    >>> stats = ArmStats(np.array([[100, 100, 100]]), np.array([[20.0, 50.0, 10.0]]),  # N, S
    ...                   np.array([[80.0, 90.0, 70.0]]), np.array([301]))  # Ñ = Σ τ(age), t
    >>> policy = make_policy("delayed-klucb", {}, 3)
    >>> policy.index(stats).round(3).tolist(), policy.choose(stats, np.random.default_rng(0)).arm.tolist()
    ([[0.489, 0.865, 0.354]], [1])
    """

    name: ClassVar[str] = "delayed-klucb"

    def bound(self, estimate: Array, stats: ArmStats, effective: Array, beta: Array) -> Array:
        return klucb_poisson(estimate, beta / effective)
