"""What the Manegueu 2020 policies are shown in the simulator, each piece exact and O(1) per round in the
number of past pulls (the service keeps the same quantities in bounded time buckets, engine/exposure.py):

- ``tail_weight``: W_k = Σ_{pulls of k} ψ(age)·1{age < m}, a causal convolution of the pull indicators
  with the policy's envelope, so the block convolution of accounting.py computes it exactly. Adapt-
  PatientBandits' α_t moves with the data, and one convolution holds one α: it is shown W at the largest α
  not above α_t of a fixed geometric grid from α_lo to its largest α_t, which is never below W at α_t (ψ
  decreases in α past the scale), so its bias term stays a bound, a little wider (the service evaluates ψ
  at α_t itself);
- ``delay_counts``: observed delays (reveal round − pull round) per arm in the log buckets of
  service/latebandit/delays/tail.py, scheduled at pull time and counted when they are revealed;
- ``band``: Algorithm 2's answer for the policy's query (arm Ī, d, D): among the pulls of Ī at least D
  rounds old, how many, and how many revealed a reward with delay in (d, D]. D, d and the age cut-off only
  grow, by at most one per round, so per arm a histogram of the lags of the pulls older than the cut-off and
  a running count of its (d, D] slice answer it: every step adds or removes one histogram cell.
"""

from __future__ import annotations

import numpy as np

from latebandit.delays.tail import BUCKETS, bucket_of, upper_edges
from latebandit.policies import ArmStats, Policy
from latebandit.policies.base import Envelope
from latebandit.policies.manegueu import AdaptPatientBandits, PatientBandits
from latebandit.sim import feeds
from latebandit.sim.accounting import BlockConvolution
from latebandit.sim.environment import Calendar, Environment, Pull, one_hot
from latebandit.sim.feeds import Feed, Ledger
from latebandit.sim.scenario import Feed as FeedSpec

ALPHA_GRID = 8  # adapt-patient-bandits' α grid: consecutive values differ by 1.39 from α_lo 0.1 to 1


class DelayBuckets:
    """(R, K, BUCKETS) counts of revealed delays, per arm, and their exposure: the pulls old enough to have
    revealed a delay anywhere in each bucket (age >= ⌈upper edge⌉ − 1, lags being whole rounds)."""

    def __init__(self, env: Environment) -> None:
        runs, arms, horizon = env.runs, env.scenario.n_arms, env.scenario.horizon
        self.counts = np.zeros((runs, arms, BUCKETS))
        self._calendar = Calendar(runs, arms * BUCKETS, horizon)
        self._run_index = np.arange(runs)
        self._cumulative = np.zeros((horizon + 1, runs, arms))  # row n: pulls in rounds <= n
        self._round = 0
        self._needed_age = np.ceil(np.minimum(upper_edges(), horizon + 1.0)).astype(np.int64) - 1

    def exposure(self, t: int) -> np.ndarray:
        """For the decision of round t: pulls of rounds s with t − 1 − s >= the bucket's needed age."""
        rows = np.clip(t - 1 - self._needed_age, 0, self._round)
        return self._cumulative[rows].transpose(1, 2, 0)

    def record(self, pull: Pull) -> None:
        seen = pull.counted
        channels = pull.arms[seen] * BUCKETS + bucket_of(pull.lags[seen])
        lags = pull.lags[seen]
        self._calendar.add(lags, self._run_index[seen], channels, np.ones(lags.size))
        self.counts += self._calendar.pop().reshape(self.counts.shape)
        self._round += 1
        self._cumulative[self._round] = self._cumulative[self._round - 1] + one_hot(pull.arms, self.counts.shape[1])


class Band:
    """The running answer to a band query, as the module docstring describes."""

    def __init__(self, env: Environment) -> None:
        runs, arms, horizon = env.runs, env.scenario.n_arms, env.scenario.horizon
        self._arms = np.full((horizon + 1, runs), -1, dtype=np.int64)  # round s → arm pulled
        self._lags = np.zeros((horizon + 1, runs), dtype=np.int64)  # round s → lag (0: no reward, or none seen)
        self._lag_histogram = np.zeros((runs, arms, horizon + 2))  # pulls older than the cut-off, by lag
        self._old = np.zeros((runs, arms))
        self._inside = np.zeros((runs, arms))  # Σ histogram over lags in (early, late]
        self._cutoff = np.zeros(runs, dtype=np.int64)  # rounds <= cutoff are old enough
        self._early = np.zeros(runs, dtype=np.int64)
        self._late = np.zeros(runs, dtype=np.int64)
        self._round = 0
        self._run_index = np.arange(runs)

    def record(self, pull: Pull) -> None:
        self._round += 1
        self._arms[self._round] = pull.arms
        self._lags[self._round] = np.clip(pull.lags, 0, self._lag_histogram.shape[2] - 1)

    def answer(self, arm: np.ndarray, early: np.ndarray, late: np.ndarray, t: int) -> np.ndarray:
        """(R, 2) for the decision of round t (pulls of rounds <= t − 1 − late are old enough)."""
        runs = self._run_index
        cutoff = t - 1 - late
        if (cutoff < self._cutoff).any() or (late < self._late).any() or (early < self._early).any():
            raise ValueError("a band query may only move its thresholds forward")
        while (moving := self._cutoff < cutoff).any():
            enter = np.where(moving, self._cutoff + 1, 0)  # round 0 holds no pull
            pulled, lag = self._arms[enter, runs], self._lags[enter, runs]
            live = moving & (pulled >= 0)
            self._lag_histogram[runs[live], pulled[live], lag[live]] += 1.0
            self._old[runs[live], pulled[live]] += 1.0
            inside = live & (lag > self._early) & (lag <= self._late)
            self._inside[runs[inside], pulled[inside]] += 1.0
            self._cutoff += moving
        while (moving := self._late < late).any():
            self._late += moving
            self._inside += np.where(moving[:, None], self._lag_histogram[runs, :, self._late], 0.0)
        while (moving := self._early < early).any():
            self._early += moving
            self._inside -= np.where(moving[:, None], self._lag_histogram[runs, :, self._early], 0.0)
        return np.stack([self._old[runs, arm], self._inside[runs, arm]], axis=1)


class Patient(Feed):
    """N, S (Ñ = N: the estimate is the pessimistic S/N) and whichever of W, delay counts and band the
    policy reads."""

    def __init__(self, ledger: Ledger, env: Environment, policy: PatientBandits) -> None:
        super().__init__(ledger)
        adaptive = policy if isinstance(policy, AdaptPatientBandits) else None
        self._adaptive = adaptive
        self._alphas = np.array([policy.envelope_alpha()])
        if adaptive is not None:
            self._alphas = np.geomspace(adaptive.params()["alpha_lo"], adaptive.envelope_alpha(), ALPHA_GRID)
        self._weights: list[BlockConvolution] = []
        if policy.params()["age_aware"]:
            ages = np.arange(env.scenario.horizon + 1, dtype=np.float64)
            for alpha in self._alphas:
                weights = Envelope(np.array([alpha]), policy.params()["scale"]).weights(ages[None, :])[0]
                if env.window is not None:
                    weights = np.where(ages < env.window, weights, 0.0)
                self._weights.append(BlockConvolution(np.tile(weights, (env.scenario.n_arms, 1)), env.runs))
        banded = adaptive is not None and adaptive.needs_band()
        self._delays = DelayBuckets(env) if adaptive is not None and not banded else None
        self._band = Band(env) if banded else None

    def stats(self, t: np.ndarray) -> ArmStats:
        delays = None if self._delays is None else (self._delays.counts, self._delays.exposure(int(t[0])))
        stats = _stats(self.ledger, None, delays, None, t)
        band = None
        if self._band is not None and self._adaptive is not None:
            query = self._adaptive.band_query(stats)
            band = self._band.answer(query.arm, query.early, query.late, int(t[0]))
            stats = _stats(self.ledger, None, delays, band, t)
        if not self._weights:
            return stats
        if self._adaptive is None:
            return _stats(self.ledger, self._weights[0].effective(), delays, band, t)
        grid = np.searchsorted(self._alphas, self._adaptive.alpha(stats) * (1.0 + 1e-12), side="right") - 1
        weights = np.stack([convolution.effective() for convolution in self._weights])  # (G, R, K)
        weight = weights[np.maximum(grid, 0), np.arange(grid.size)]
        return _stats(self.ledger, weight, delays, band, t)

    def record(self, pull: Pull) -> None:
        for convolution in self._weights:
            convolution.push(pull.arms)
        if self._delays is not None:
            self._delays.record(pull)
        if self._band is not None:
            self._band.record(pull)


def _stats(
    ledger: Ledger,
    weight: np.ndarray | None,
    delays: tuple[np.ndarray, np.ndarray] | None,
    band: np.ndarray | None,
    t: np.ndarray,
) -> ArmStats:
    counts, exposure = (None, None) if delays is None else delays
    return ArmStats(ledger.pulls, ledger.conversions, ledger.pulls, t, weight, counts, band, exposure)


def make_feed(spec: FeedSpec, policy: Policy, ledger: Ledger, env: Environment) -> Feed:
    """The Manegueu 2020 policies' own feed, or the feed of feeds.py the scenario asks for."""
    if spec.kind is None and isinstance(policy, PatientBandits):
        return Patient(ledger, env, policy)
    return feeds.make_feed(spec, policy, ledger, env)
