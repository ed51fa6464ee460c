"""The single-arm Lagrangian DP over the Block+Stream family of docs/algorithms/guha.md (Beta–Bernoulli, unit rewards).

One arm with prior Beta(a, b), its own virtual clock τ over a horizon H, and a known delay δ (a play at
step t is usable from step t + δ + 1, Guha et al., §4). At a block start (posterior u = (s, f), clock τ) it
may quit, make a block of ℓ ≤ δ + 1 back-to-back plays and wait for them (ℓ + δ steps), or enter the
stream: δ + 1 blind plays, then one play per step while the posterior of the outcomes seen so far says so.
For a multiplier λ the DP maximises R − λ·N (expected reward minus λ times expected plays):

    Vdf(u, h) = max{0, μ − λ + μ·Vdf(u+1, h−1) + (1 − μ)·Vdf(u+0, h−1)}                     (streaming)
    Vb(u, τ)  = max{0, max_ℓ ℓ(μ − λ) + Σ_k P(k | ℓ, u)·Vb(u + (k, ℓ − k), τ + ℓ + δ),
                    (δ + 1)(μ − λ) + μ·Vdf(u+1, H − τ − δ − 1) + (1 − μ)·Vdf(u+0, H − τ − δ − 1)}

P(k | ℓ, u) is the Beta-Binomial law. R and N of the maximising policy are carried along the same sweep
(a backward pass, not a forward occupancy), so one sweep gives V = R − λN, R and N at the root.

Depth cap D [ours, docs/algorithms/guha.md]: past depth D an arm counts as learned, worth h·max(0, μ − λ) with h
steps left. The sweep runs over depth from D down to 0, vectorised over (s, τ): O(D²·H·(δ + 1)²) work,
O((δ + 2)·D·H) memory for the values and 2 bytes per (posterior, τ) for the action table.
Ties between quitting and playing go to playing when ``tie_play`` (the upper policy P⁺ of §2.2),
otherwise to quitting (P⁻); among the playing actions the smaller block wins a tie.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QUIT = 0  # action codes: a block of 1..min(δ + 1, H) plays is its size, entering the stream is STREAM
STREAM = -1
TIE = 1e-12


def triangle(depth: int) -> int:
    """Number of posteriors (s, f) with s + f < depth: the first table row of that depth."""
    return depth * (depth + 1) // 2


@dataclass(frozen=True)
class ArmShape:
    """What one arm's DP costs: its posteriors, its (posterior, clock) states and its work per λ."""

    prior_a: float
    prior_b: float
    horizon: int
    delay: int
    depth: int

    @property
    def posteriors(self) -> int:
        return triangle(self.depth + 1)

    @property
    def states(self) -> int:
        """Block-start states (posterior, τ) plus streaming states (posterior, h): the action table and h*."""
        return 2 * self.posteriors * (self.horizon + 1)

    @property
    def table_bytes(self) -> int:
        return 2 * self.posteriors * self.horizon + 4 * self.posteriors

    @property
    def working_bytes(self) -> int:
        """Float64 (V, R, N) layers alive during a sweep: δ + 2 block-start layers, two streaming ones and
        the candidate and chosen arrays of the current depth, each at most (D + 2)·(H + 1) values."""
        layers = min(self.delay + 1, self.horizon) + 6
        return 8 * 3 * layers * (self.depth + 2) * (self.horizon + 1)

    @property
    def work(self) -> int:
        """Multiply-adds per λ: every block-start state sums (ℓ + 1) outcomes for each block size ℓ."""
        sizes = min(self.delay + 1, self.horizon)
        return self.states * (1 + sizes * (sizes + 3) // 2)


@dataclass(frozen=True)
class ArmSolution:
    value: float  # V = R − λN at the root
    reward: float  # R, expected reward of the maximising policy
    plays: float  # N, its expected number of plays
    action: np.ndarray | None = None  # int16 (posteriors, H): the block-start action at (row(s, f), τ)
    stream_from: np.ndarray | None = None  # int32 (posteriors,): h* = least h at which a stream continues


class BlockStreamArm:
    """The DP of one (prior, horizon, delay, depth cap); the Beta-Binomial weights are computed once and
    reused for every λ of a bisection."""

    def __init__(self, shape: ArmShape) -> None:
        from scipy.stats import betabinom  # here, not at module level: it is half an API worker's import time

        self.shape = shape
        a, b, depth, delay = shape.prior_a, shape.prior_b, shape.depth, shape.delay
        self.sizes = min(delay + 1, shape.horizon)
        self._mean = [(a + np.arange(d + 1)) / (a + b + d) for d in range(depth + self.sizes + 1)]
        self._weights: list[list[np.ndarray]] = []  # [d][ℓ − 1]: (ℓ + 1, d + 1) P(k | ℓ, (s, d − s))
        for d in range(depth + 1):
            s = np.arange(d + 1)
            k = np.arange(self.sizes + 1)[:, None]
            self._weights.append(
                [np.asarray(betabinom.pmf(k[: ell + 1], ell, a + s, b + d - s)) for ell in range(1, self.sizes + 1)]
            )

    def _learned(self, depth: int, lam: float, tie_play: bool, by_clock: bool) -> np.ndarray:
        """(3, d + 1, H + 1) V, R, N past the depth cap."""
        return learned(self._mean[depth][:, None], self.shape.horizon, lam, tie_play, by_clock)

    def solve(self, lam: float, tie_play: bool = True, tables: bool = False) -> ArmSolution:
        shape = self.shape
        horizon, delay, depth, sizes = shape.horizon, shape.delay, shape.depth, self.sizes
        blocks: dict[int, np.ndarray] = {}  # depth → (3, d + 1, H + 1) V, R, N at block starts, by τ
        stream_next = self._learned(depth + 1, lam, tie_play, by_clock=False)  # streaming (V, R, N) by h
        action = np.zeros((triangle(depth + 1), horizon), dtype=np.int16) if tables else None
        stream_from = np.zeros(triangle(depth + 1), dtype=np.int32) if tables else None
        clock = np.arange(horizon)
        for d in range(depth, -1, -1):
            mu = self._mean[d][:, None]
            # streaming at depth d, from depth d + 1
            play = np.empty((3, d + 1, horizon + 1))
            play[:, :, 0] = -np.inf
            up, down = stream_next[:, 1:, :-1], stream_next[:, :-1, :-1]
            play[0, :, 1:] = mu - lam + mu * up[0] + (1 - mu) * down[0]
            play[1, :, 1:] = mu + mu * up[1] + (1 - mu) * down[1]
            play[2, :, 1:] = 1.0 + mu * up[2] + (1 - mu) * down[2]
            keep = play[0] >= -TIE if tie_play else play[0] > TIE
            stream = np.where(keep, play, 0.0)
            # block starts at depth d: blocks ℓ = 1..sizes, then the stream; a later option must beat
            # the best so far by more than TIE (smaller blocks win ties)
            left = horizon - clock
            chosen = np.full((3, d + 1, horizon), -np.inf)
            best = np.zeros((d + 1, horizon), dtype=np.int64)
            for ell in range(1, sizes + 1):
                following = blocks.get(d + ell)
                if following is None:
                    following = self._learned(d + ell, lam, tie_play, by_clock=True)
                reach = max(horizon - ell - delay, 0)  # clocks τ < reach see the next block start
                candidate = np.zeros((3, d + 1, horizon))
                for k, weight in enumerate(self._weights[d][ell - 1][:, :, None] if reach else ()):
                    candidate[:, :, :reach] += weight * following[:, k : k + d + 1, ell + delay : ell + delay + reach]
                candidate += np.stack([ell * (mu - lam), ell * mu, np.full_like(mu, float(ell))])
                candidate[:, :, left < ell] = -np.inf
                improve(chosen, best, candidate, ell)
            enters = left > delay + 1
            rest = np.where(enters, left - delay - 1, 0)
            candidate = mu * stream_next[:, 1:, rest] + (1 - mu) * stream_next[:, :-1, rest]
            candidate += np.stack([(delay + 1) * (mu - lam), (delay + 1) * mu, np.full_like(mu, delay + 1.0)])
            candidate[:, :, ~enters] = -np.inf
            improve(chosen, best, candidate, STREAM)
            go = chosen[0] >= -TIE if tie_play else chosen[0] > TIE
            start = np.zeros((3, d + 1, horizon + 1))
            start[:, :, :horizon] = np.where(go, chosen, 0.0)
            blocks[d] = start
            blocks.pop(d + sizes + 1, None)
            if action is not None and stream_from is not None:  # tables
                rows = slice(triangle(d), triangle(d + 1))
                action[rows] = np.where(go, best, QUIT)
                stream_from[rows] = first_continuing(keep)
            stream_next = stream
        value, reward, plays = blocks[0][:, 0, 0]
        return ArmSolution(float(value), float(reward), float(plays), action, stream_from)


def learned(mu: np.ndarray, horizon: int, lam: float, tie_play: bool, by_clock: bool) -> np.ndarray:
    """(3, n, H + 1) V, R, N of learned posteriors of means ``mu`` (n, 1): play every remaining step iff
    μ ≥ λ; indexed by the clock τ (``by_clock``, H − τ steps left) or by the steps left h."""
    steps = np.arange(horizon + 1, dtype=np.float64)
    left = horizon - steps if by_clock else steps
    play = (mu - lam >= -TIE) if tie_play else (mu - lam > TIE)
    plays = np.where(play, left, 0.0)
    return np.stack([plays * (mu - lam), plays * mu, plays])


def improve(chosen: np.ndarray, best: np.ndarray, candidate: np.ndarray, code: int) -> None:
    """Take ``candidate`` (3, n, H) where its value beats the best so far (``chosen``) by more than TIE, and
    record its action ``code`` in ``best``: an option tried later must do strictly better."""
    better = candidate[0] > chosen[0] + TIE
    np.copyto(chosen, candidate, where=better[None])
    np.copyto(best, code, where=better)


def first_continuing(keep: np.ndarray) -> np.ndarray:
    """h* per posterior: the least h from which the stream continues for every larger h (H + 1: never).
    Conservative where the decision is not monotone in h (docs/algorithms/guha.md expects it to be)."""
    horizon = keep.shape[1] - 1
    stops = ~keep[:, 1:]
    last_stop = np.where(stops.any(axis=1), horizon - np.argmax(stops[:, ::-1], axis=1), 0)
    return (last_stop + 1).astype(np.int32)
