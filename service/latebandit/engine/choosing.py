"""How /choose picks a campaign's arms from its statistics: the module to read to change how it decides.

A decision's arm is the policy's choice from the campaign's statistics (``ArmStats``: pulls N, credited sums
S, the delay-corrected exposures Ñ and the round t), with the campaign's exploration floor mixed in
(``with_floor``). Ñ needs the histogram of pulls inside the window: it is computed once per histogram read,
which the store serves for up to ``snapshot_interval`` (and may fold matured cells: the only I/O here), so
a decision costs O(K), not O(K·B).

The policy's own call is NumPy work, the largest part of a decision after the store's round trip
(docs/benchmarks.md). Most decisions skip it by taking the campaign's **next choice** (``NextChoice``), kept
per campaign and valid for a number of decisions at one ``StateVersion`` of the statistics (the store's
explicit version: policy version, histogram read, write stamp, decision count):

- a *standing law* (``Policy.standing``): the distribution the policy draws from, which moves only with
  Ñ and S (a new read, a counted conversion, a fold: the version's read and stamp). It serves up to
  ``limit`` decisions, ignoring the pulls and rounds they add meanwhile, the staleness a full batch of the
  group commit has anyway. A draw is one uniform (inverse CDF), the same law as the policy's ``choose``.
- a *drawn choice*, where the policy has no standing law (an opening, patient-bandits, qpm-d: a nan row):
  the next decision's arm, drawn ahead by the policy's own call, valid for one decision at exactly the
  version it was computed from (decision count included). It is the choice the policy would make from
  those statistics with fresh uniforms: the same law, computed earlier.

A request that finds no next choice serving its statistics computes one (or, for a batch that a drawn
choice cannot serve, calls the policy for every row). Once a lone decision is answered, the engine has the
next one made ready from the statistics the worker holds then (``prepare_next``), off the request: nothing
rests on timing, since a next choice serves only a request whose statistics carry its version. (Predicting
it while the decision was still being recorded, from the version the reply would bring, was measured and
did not pay for its concepts: docs/benchmarks.md, "The next choice".)
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from latebandit import metrics
from latebandit.campaign import Campaign
from latebandit.engine.describe import arm_stats, delay_rows, diagnostic_rows
from latebandit.engine.exposure import Exposure, exposure
from latebandit.engine.planner import Planner
from latebandit.policies.base import ArmStats, Policy
from latebandit.policies.floor import mixed_probabilities, with_floor
from latebandit.store.base import StateSnapshot, StateStore, StateVersion

Choice = tuple[int, float]  # an arm's index and its propensity


@dataclass
class NextChoice:
    """The campaign's next choice: a law over arms, valid for ``remaining`` decisions at ``basis`` (any
    decision count of its read and stamp for a standing law; that one count for a drawn choice)."""

    basis: StateVersion
    exact: bool  # a drawn choice: it serves the statistics of ``basis`` alone, decision count included
    remaining: int
    arms: list[int]  # the arms of positive probability
    bounds: list[float]  # their cumulative probabilities, the last one +inf
    propensity: dict[int, float]  # each of those arms' probability under the policy (a drawn one's: the law's)

    @classmethod
    def standing(cls, campaign: Campaign, basis: StateVersion, law: np.ndarray, limit: int) -> NextChoice | None:
        """From a policy's one-run ``standing`` row (over the active arms), with the campaign's exploration
        floor mixed in; None when the row is nan (no standing law)."""
        if np.isnan(law).any():
            return None
        if campaign.exploration_floor > 0:
            law = mixed_probabilities(law[None, :], campaign.exploration_floor)[0]
        arms = campaign.active_arms
        propensity = {arms[arm]: p for arm, p in enumerate(law.tolist()) if p > 0}
        bounds = list(accumulate(propensity.values()))
        bounds[-1] = float("inf")  # rounding never leaves a uniform draw past the last arm
        return cls(basis, False, limit, list(propensity), bounds, propensity)

    @classmethod
    def drawn(cls, basis: StateVersion, arm: int, propensity: float) -> NextChoice:
        return cls(basis, True, 1, [arm], [float("inf")], {arm: propensity})

    def serves(self, version: StateVersion | None, decisions: int) -> bool:
        if version is None or decisions > self.remaining:
            return False
        if self.exact:
            return version == self.basis
        return (version.policy, version.read, version.stamp) == (self.basis.policy, self.basis.read, self.basis.stamp)

    def draw(self, decisions: int, rng: np.random.Generator) -> list[Choice]:
        """``decisions`` arms and their propensities, one uniform each."""
        self.remaining -= decisions
        chosen = [self.arms[bisect_right(self.bounds, u)] for u in rng.random(decisions).tolist()]
        return [(arm, self.propensity[arm]) for arm in chosen]


class Chooser:
    """A worker's choices for its campaigns: the policy's call, the next choices, Ñ per histogram read.

    The policy sees the statistics of the campaign's active arms alone (``Campaign.on_active_arms``) and
    its choices are named back by the campaign's arm indices (``_policy_call``, ``NextChoice.standing``):
    a retired arm is never chosen, and its propensity is 0 under every law kept or drawn here."""

    def __init__(self, store: StateStore, rng: np.random.Generator, snapshot_interval: float, limit: int) -> None:
        self.store = store
        self.rng = rng
        self.planner = Planner()  # guha-bayes's plans, solved off the request path
        self._snapshot_interval = snapshot_interval
        self._limit = limit  # decisions a standing law serves at most (the group commit's batch limit)
        self._next: dict[str, NextChoice] = {}
        self._exposures: dict[str, tuple[tuple[int, int], Exposure]] = {}  # per campaign: Ñ by (policy, read)
        # Histogram reads whose per-arm gauges are not published yet (publish_diagnostics, off the request path).
        self._unpublished: dict[str, tuple[Campaign, StateSnapshot, Exposure]] = {}
        self._publishing = threading.Lock()

    async def choose(self, campaign: Campaign, state: StateSnapshot, now: int, decisions: int) -> list[Choice]:
        """Arms and propensities for ``decisions`` successive decisions taken together from ``state``."""
        ready = self._next.get(campaign.id)
        if ready is not None and ready.serves(state.version, decisions):
            return ready.draw(decisions, self.rng)
        stats = await self._stats(campaign, state, now)
        policy = self.planner.policy_for(campaign, stats)
        renewed = self._renew(campaign, state, policy, stats)
        if renewed is not None and renewed.serves(state.version, decisions):
            return renewed.draw(decisions, self.rng)
        return self._policy_call(campaign, policy, stats, decisions)

    def prepare_next(self, campaign: Campaign) -> None:
        """The next choice made ready for one decision from the statistics the store holds now, with no I/O:
        not where one serves them already, nor where the store holds none (the embedded store builds them
        anew for each decision) or Ñ of their histogram read is not computed yet (that may fold cells), nor
        for a planned policy (its plan may change before the next decision)."""
        state = self.store.held(campaign, self._snapshot_interval)
        if state is None or state.version is None or self.planner.solves_for(campaign):
            return
        ready = self._next.get(campaign.id)
        if ready is not None and ready.serves(state.version, 1):
            return
        stats = self._cached_stats(campaign, state)
        if stats is None:
            return
        policy = campaign.policy_impl
        if self._renew(campaign, state, policy, stats) is None:
            ((arm, propensity),) = self._policy_call(campaign, policy, stats, 1)
            self._next[campaign.id] = NextChoice.drawn(state.version, arm, propensity)

    def _renew(self, campaign: Campaign, state: StateSnapshot, policy: Policy, stats: ArmStats) -> NextChoice | None:
        """The policy's standing law for these statistics, kept as the next choice; None (and the next choice
        dropped) where it has none: during an opening, for a law that is never standing (qpm-d, Thompson
        sampling above 10 arms: a nan row), for a policy that does not stand, or for unversioned statistics."""
        renewed = None
        if policy.stands and state.version is not None:
            renewed = NextChoice.standing(campaign, state.version, policy.standing(stats)[0], self._limit)
        if renewed is None:
            self._next.pop(campaign.id, None)
        else:
            self._next[campaign.id] = renewed
        return renewed

    def _policy_call(self, campaign: Campaign, policy: Policy, stats: ArmStats, decisions: int) -> list[Choice]:
        """The policy's choices from statistics of the active arms, named by the campaign's arm indices."""
        choice = with_floor(policy.choose_together(stats, decisions, self.rng), campaign.exploration_floor, self.rng)
        arms = campaign.active_arms
        return [(arms[arm], propensity) for arm, propensity in zip(choice.arm.tolist(), choice.propensity.tolist(),
                                                                  strict=True)]  # fmt: skip

    async def _stats(self, campaign: Campaign, state: StateSnapshot, now: int) -> ArmStats:
        """The statistics of ``state``, Ñ evaluated once per histogram read and reused while the store serves
        that read (docs/design-notes.md, Ñ); a new read may fold its matured cells into the counters."""
        held = self._cached_stats(campaign, state)
        if held is not None:
            return held
        seen = exposure(campaign, state, now)
        if state.version is not None:
            self._exposures[campaign.id] = ((state.version.policy, state.version.read), seen)
        self._unpublished[campaign.id] = (campaign, state, seen)
        if seen.matured_cells.any():
            hist = state.histogram
            await self.store.fold_matured(campaign, hist.arm[seen.matured_cells], hist.bucket[seen.matured_cells])
        return campaign.on_active_arms(arm_stats(state, seen))

    def _cached_stats(self, campaign: Campaign, state: StateSnapshot) -> ArmStats | None:
        """The statistics of ``state`` if Ñ of its histogram read is computed already, else None (no I/O)."""
        cached = self._exposures.get(campaign.id)
        if cached is None or state.version is None:
            return None
        read, seen = cached
        if read != (state.version.policy, state.version.read):
            return None
        return campaign.on_active_arms(arm_stats(state, seen))

    def unpublished(self, campaign_id: str) -> None:
        """Drop a read's diagnostics not yet published: a fresher description of the campaign supersedes it."""
        self._unpublished.pop(campaign_id, None)

    def forget(self, campaign_id: str) -> None:
        """Drop everything kept for a campaign that decides no more (archived)."""
        for kept in (self._next, self._exposures, self._unpublished):
            kept.pop(campaign_id, None)
        self.planner.forget(campaign_id)

    def publish_diagnostics(self) -> None:
        """The per-arm gauges (estimates, indices, delay summaries) of the histogram reads since the last
        call. Run at scrape time and by a background task, in a thread: at 50 arms the delay summaries take
        tens of milliseconds, which no decision should wait for."""
        with self._publishing:
            while self._unpublished:
                campaign_id, (campaign, state, seen) = self._unpublished.popitem()  # atomic: the loop adds meanwhile
                metrics.publish_arms(campaign_id, diagnostic_rows(campaign, state, seen))
                metrics.publish_delays(campaign_id, delay_rows(campaign, state, seen))
