"""Re-enact a logged campaign for another policy, delays included.

The evaluated policy keeps its own history, built only from the logged decisions it accepts (below), in
the same store and with the same exposure code as the live service: its effective counts Ñ age on the
log's clock, and a conversion reaches it at its ``occurred_at``, never earlier; one later than the window
is recorded but never counts (``prepare``), one after the log's end is never seen.

Which logged decisions enter that history is decided by rejection sampling (Li et al. 2011 for uniform
logs, generalised by Dudík et al. 2012, "Sample-efficient nonstationary policy evaluation for contextual
bandits"): decision k is accepted with probability π_k(a_k) / (M·μ_k), where π_k is the evaluated
policy's distribution given its history and μ_k the logged propensity. With M ≥ max π/μ the accepted
decisions are distributed exactly as the policy's own play, one step per accepted decision; a smaller M
(clipping) trades that exactness for more steps. On a uniform log with M = K this is the replay method.

Where the log changes the campaign's arms, the evaluated policy's arm set changes at the same moments
(``Campaign.with_arms``, keeping its history): its distribution covers the arms active at each decision,
a retired or not yet added arm has probability 0 there.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from latebandit.campaign import ArmsRefused, Campaign
from latebandit.engine.describe import arm_stats
from latebandit.engine.exposure import bucket_moments, exposure, scaled_sums
from latebandit.engine.feedback import Conversion, prepare
from latebandit.policies.base import ArmStats
from latebandit.replay.logged import ArmChange, CampaignLog, LoggedDecision, NotEvaluable
from latebandit.store.base import Pull
from latebandit.store.memory import MemoryStore

PROGRESS_EVERY = 500  # decisions between two progress callbacks
RETENTION = 0.0  # seconds: the history never sees a conversion again after its window, so keep none longer


@dataclass(frozen=True)
class Reenactment:
    probabilities: np.ndarray  # (n, K) the evaluated policy's distribution at each logged decision
    accepted: np.ndarray  # (n,) bool: the decision entered the policy's history (one step of its play)
    bound: float  # M


class History:
    """The evaluated policy's own pulls and conversions, on the log's virtual clock. A conversion reaches it
    at its ``occurred_at``, or with ``at_receipt`` when the service received it (its ``received_at``)."""

    def __init__(self, campaign: Campaign, at_receipt: bool = False) -> None:
        self.campaign = campaign
        self.now = campaign.created_at
        self.at_receipt = at_receipt
        self.store = MemoryStore(clock=lambda: self.now, keep_audit=False)
        # heap of conversions to deliver: (when, serial number, which conversion, of which decision)
        self._due: list[tuple[int, int, int, LoggedDecision]] = []
        self._seq = 0
        self.changed = True  # counters changed since the last ``stats``

    async def start(self) -> None:
        await self.store.create_campaign(self.campaign, {})

    async def change_arms(self, change: ArmChange) -> None:
        """The logged arm change, made to the evaluated policy's campaign (its history kept)."""
        try:
            changed = self.campaign.with_arms(change.added, change.retired, restart=False)
        except ArmsRefused as refused:
            raise NotEvaluable(f"the log changes arms, which policy {self.campaign.policy.name!r} cannot follow: "
                               f"{refused.detail}") from None  # fmt: skip
        self.campaign = await self.store.change_arms(changed, {}) or changed
        self.changed = True

    async def advance(self, moment: int) -> None:
        """Move the clock to ``moment``, delivering every conversion due by then."""
        self.now = max(self.now, moment)
        while self._due and self._due[0][0] <= moment:
            due, _, index, decision = heapq.heappop(self._due)
            conversion = decision.conversions[index]
            event = Conversion(
                self.campaign.id, decision.decision_id, decision.arm, decision.at, True, self.campaign.version,
                conversion.occurred_at, conversion.value, conversion.event_id,
            )  # fmt: skip
            await self.store.apply_conversions(self.campaign, [prepare(self.campaign, event, due, RETENTION)])
            self.changed = True

    def pull(self, decision: LoggedDecision) -> Pull:
        """The logged decision as the policy's own pull."""
        bucket, offset, moments = bucket_moments(self.campaign, decision.at)
        return Pull(decision.arm, bucket, offset, moments, decision.decision_id, 1.0, {})

    async def record(self, pull: Pull, decision: LoggedDecision) -> None:
        """Record ``pull`` (of ``decision``); the decision's conversions are then due to the policy."""
        await self.store.record_decision(self.campaign, pull, None, 0)
        for index, conversion in enumerate(decision.conversions):
            self._seq += 1
            due = conversion.received_at if self.at_receipt else conversion.occurred_at
            heapq.heappush(self._due, (due, self._seq, index, decision))
        self.changed = True

    async def stats(self, delay_corrected: bool) -> ArmStats:
        """What the policy is shown now. A delay-naive policy reads only the counters, so the histogram
        is neither rebuilt nor aged for it (Ñ is then the raw pulls, as ``Policy.effective_pulls`` says)."""
        if not delay_corrected:
            counters = (await self.store.snapshot(self.campaign, math.inf)).counters
            self.changed = False
            pulls = counters.pulls[None, :].astype(np.float64)
            sums = scaled_sums(counters.conversions, self.campaign.reward.max)
            stats = ArmStats(pulls, sums[None, :], pulls, np.array([counters.decisions + 1]))
            return self.campaign.on_active_arms(stats)
        snapshot = await self.store.snapshot(self.campaign)
        seen = exposure(self.campaign, snapshot, self.now)
        if seen.matured_cells.any():
            hist = snapshot.histogram
            await self.store.fold_matured(self.campaign, hist.arm[seen.matured_cells], hist.bucket[seen.matured_cells])
        self.changed = False
        return self.campaign.on_active_arms(arm_stats(snapshot, seen))


def reenact(
    log: CampaignLog,
    campaign: Campaign,
    clip: float,
    rng: np.random.Generator,
    progress: Callable[[int], None] | None = None,
) -> Reenactment:
    """One pass over the log for the policy of ``campaign`` (the logged campaign with another policy).
    M = min(clip, max 1/μ): the smallest bound that never clips when ``clip`` allows it. ``progress`` is
    told how many more decisions were done, every PROGRESS_EVERY."""
    return asyncio.run(_reenact(log, campaign, clip, rng, progress))


async def _reenact(
    log: CampaignLog,
    campaign: Campaign,
    clip: float,
    rng: np.random.Generator,
    progress: Callable[[int], None] | None,
) -> Reenactment:
    history = History(campaign)
    await history.start()
    decisions = log.decisions
    bound = min(clip, max((1.0 / d.propensity for d in decisions), default=1.0))
    every_arm = len(campaign.arms) + sum(len(change.added) for change in log.arm_changes)
    probabilities = np.zeros((len(decisions), every_arm))
    accepted = np.zeros(len(decisions), dtype=bool)
    accept_draws = rng.random(len(decisions))
    current: np.ndarray | None = None
    changes = list(reversed(log.arm_changes))
    for k, decision in enumerate(decisions):
        await history.advance(decision.at)
        while changes and changes[-1].at <= decision.at:
            await history.change_arms(changes.pop())
        policy, active = history.campaign.policy_impl, list(history.campaign.active_arms)
        # A delay-naive policy's distribution changes only with its counters; Ñ also ages with time.
        if current is None or history.changed or policy.delay_corrected:
            current = policy.choose(await history.stats(policy.delay_corrected), rng).probabilities
            if current is None:
                raise ValueError(f"policy {policy.name!r} does not report its probabilities: it cannot be evaluated")
        probabilities[k, active] = current[0]
        if accept_draws[k] < probabilities[k, decision.arm] / (bound * decision.propensity):
            accepted[k] = True
            await history.record(history.pull(decision), decision)
        if progress is not None and (k + 1) % PROGRESS_EVERY == 0:
            progress(PROGRESS_EVERY)
    return Reenactment(probabilities, accepted, bound)
