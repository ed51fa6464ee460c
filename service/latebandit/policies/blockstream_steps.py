"""The Block+Stream DP of blockstream.py on coarse steps, for delays and horizons of thousands of decisions
(docs/algorithms/guha.md: at 20 decisions a second a 95 % delay of 7 minutes is 8,843 decisions, and the
exact DP's O(D²·H·δ²) work is out of reach; the exact one stays for small problems).

One step is ``unit`` decisions sent to the same arm. Its outcome is the number of conversions among them,
so after j steps from a root Beta(a, b) an arm has seen n_j = a + b + j·unit outcomes whatever they were:
its posterior is known from its mean m alone, kept on a grid of G points, the G quantiles of the root
Beta (the posterior mean is a martingale that converges to θ ~ Beta(a, b): the grid covers where it can
go, finest where it most likely goes). A block of ℓ steps moves m to m' with E[m'] = m and
Var[m'] = L·m(1 − m)/((n_j + 1)(n_j + L)), L = ℓ·unit (the Beta-Binomial predictive law); m' is taken to
follow the Beta of those two moments, spread over the grid's cells [ours: moment-matched]. Past it, the
recursion is the one of blockstream.py with (s, f) replaced by (j, grid point) and plays counted in steps:

    Vdf(j, m, h) = max{0, m − λ + Σ P¹_j(m, m')·Vdf(j + 1, m', h − 1)}
    Vb(j, m, τ)  = max{0, max_ℓ ℓ(m − λ) + Σ Pˡ_j(m, m')·Vb(j + ℓ, m', τ + ℓ + δ),
                      (δ + 1)(m − λ) + Σ P¹_j(m, m')·Vdf(j + 1, m', H − τ − δ − 1)}

Each sum is a (G × G) matrix product over (τ or h): O(H·(δ + 3)·G²·H) work per λ, no depth cap needed
(an arm cannot play more than H steps). Tables: the block-start action per (j, grid point, τ) and h* per
(j, grid point), rows j·G + g.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from latebandit.policies.blockstream import QUIT, STREAM, TIE, ArmSolution, first_continuing, improve, learned

GRID_POINTS = 48  # posterior means kept per depth


@dataclass(frozen=True)
class StepShape:
    """What one arm's DP on steps costs; horizon and delay in steps of ``unit`` decisions."""

    prior_a: float
    prior_b: float
    horizon: int
    delay: int
    unit: int
    points: int = GRID_POINTS

    @property
    def sizes(self) -> tuple[int, ...]:
        """The block sizes tried: powers of two up to δ + 1, and δ + 1 (docs/algorithms/guha.md)."""
        top = min(self.delay + 1, self.horizon)
        return tuple(sorted({*(1 << i for i in range(top.bit_length()) if 1 << i <= top), top}))

    @property
    def rows(self) -> int:
        return (self.horizon + 1) * self.points

    @property
    def states(self) -> int:
        return 2 * self.rows * (self.horizon + 1)

    @property
    def table_bytes(self) -> int:
        return 2 * self.rows * self.horizon + 4 * self.rows

    @property
    def working_bytes(self) -> int:
        """The transition matrices (kept for every λ) and the (V, R, N) layers alive during a sweep."""
        matrices = 8 * (self.horizon + 1) * len(self.sizes) * self.points**2
        return matrices + 8 * 3 * (max(self.sizes) + 6) * self.points * (self.horizon + 1)

    @property
    def work(self) -> int:
        """Multiply-adds per λ: one G × G product over the clock per block size, the stream and its entry."""
        return (self.horizon + 1) * (len(self.sizes) + 2) * self.points**2 * self.horizon


class SteppedArm:
    """The DP of one (root, horizon, delay, unit); the grid and its transitions are computed once and reused
    for every λ of a bisection. Same interface as blockstream.BlockStreamArm."""

    def __init__(self, shape: StepShape) -> None:
        from scipy import special  # here, not at module level: it is half an API worker's import time

        self.shape = shape
        a, b, points = shape.prior_a, shape.prior_b, shape.points
        self.grid = np.asarray(special.betaincinv(a, b, (np.arange(points) + 0.5) / points))
        self._edges = np.asarray(special.betaincinv(a, b, np.arange(1, points) / points))  # inner cell edges
        self._special = special

    @cached_property
    def _transitions(self) -> list[list[np.ndarray]]:
        """[j][i]: (G, G) the law of the grid point after a block of ``sizes[i]`` steps from depth j."""
        shape, m = self.shape, self.grid[:, None]
        edges = np.concatenate([[0.0], self._edges, [1.0]])
        out = []
        for j in range(shape.horizon + 1):
            seen = shape.prior_a + shape.prior_b + j * shape.unit
            row = []
            for ell in shape.sizes:
                spread = ell * shape.unit
                concentration = (seen + 1.0) * (seen + spread) / spread - 1.0
                cdf = self._special.betainc(concentration * m, concentration * (1.0 - m), edges[None, :])
                cdf[:, 0], cdf[:, -1] = 0.0, 1.0
                row.append(np.diff(cdf, axis=1))
            out.append(row)
        return out

    def solve(self, lam: float, tie_play: bool = True, tables: bool = False) -> ArmSolution:
        shape, points = self.shape, self.shape.points
        horizon, delay, sizes = shape.horizon, shape.delay, shape.sizes
        mu = self.grid[:, None]
        gain = np.stack([mu - lam, mu, np.ones_like(mu)])  # (3, G, 1): one step's V, R, N
        learned_clock = learned(mu, horizon, lam, tie_play, by_clock=True)
        blocks: dict[int, np.ndarray] = {}  # depth → (3, G, H + 1) at block starts, by τ
        stream_next = learned(mu, horizon, lam, tie_play, by_clock=False)  # streaming (V, R, N) by h, depth j + 1
        action = np.zeros((shape.rows, horizon), dtype=np.int16) if tables else None
        stream_from = np.zeros(shape.rows, dtype=np.int32) if tables else None
        left = horizon - np.arange(horizon)
        for j in range(horizon, -1, -1):
            moves = self._transitions[j]
            play = np.empty((3, points, horizon + 1))
            play[:, :, 0] = -np.inf
            play[:, :, 1:] = gain + np.matmul(moves[0], stream_next[:, :, :-1])
            keep = play[0] >= -TIE if tie_play else play[0] > TIE
            stream = np.where(keep, play, 0.0)
            chosen = np.full((3, points, horizon), -np.inf)
            best = np.zeros((points, horizon), dtype=np.int64)
            for i, ell in enumerate(sizes):
                following = blocks.get(j + ell, learned_clock)
                reach = max(horizon - ell - delay, 0)  # clocks τ < reach see the next block start
                candidate = np.zeros((3, points, horizon))
                if reach:
                    candidate[:, :, :reach] = np.matmul(moves[i], following[:, :, ell + delay : ell + delay + reach])
                candidate += ell * gain
                candidate[:, :, horizon - ell + 1 :] = -np.inf  # fewer than ℓ steps left
                improve(chosen, best, candidate, ell)
            entry = np.full((3, points, horizon), -np.inf)  # the stream is entered while more than δ + 1 steps are left
            if (enters := max(horizon - delay - 1, 0)) > 0:
                rest = left[:enters] - delay - 1
                entry[:, :, :enters] = np.matmul(moves[0], stream_next[:, :, rest]) + (delay + 1) * gain
            candidate = entry
            improve(chosen, best, candidate, STREAM)
            go = chosen[0] >= -TIE if tie_play else chosen[0] > TIE
            start = np.zeros((3, points, horizon + 1))
            start[:, :, :horizon] = np.where(go, chosen, 0.0)
            blocks[j] = start
            blocks.pop(j + sizes[-1] + 1, None)
            if action is not None and stream_from is not None:
                rows = slice(j * points, (j + 1) * points)
                action[rows] = np.where(go, best, QUIT)
                stream_from[rows] = first_continuing(keep)
            stream_next = stream
        root = blocks[0][:, :, 0] @ self._root_weights()
        return ArmSolution(float(root[0]), float(root[1]), float(root[2]), action, stream_from)

    def _root_weights(self) -> np.ndarray:
        """(G,) the root's mean as weights on the grid: the two points around it, linearly."""
        mean = self.shape.prior_a / (self.shape.prior_a + self.shape.prior_b)
        weights = np.zeros(self.shape.points)
        upper = int(np.clip(np.searchsorted(self.grid, mean), 1, self.shape.points - 1))
        low, high = self.grid[upper - 1], self.grid[upper]
        share = float(np.clip((mean - low) / (high - low), 0.0, 1.0)) if high > low else 0.0
        weights[upper - 1], weights[upper] = 1.0 - share, share
        return weights

    def rows_of(self, mean: np.ndarray, depth: np.ndarray) -> np.ndarray:
        """The table rows of posteriors of these means after these many steps (depth at most the horizon):
        the grid cell the mean falls in."""
        cell = np.searchsorted(self._edges, mean)
        return depth * self.shape.points + cell
