"""The decision engine: /choose, the campaigns' lifecycle and the state object, independent of HTTP.

It is composed of a worker's view of its campaigns (engine/directory.py), the feedback ingest
(engine/ingest.py) and the description of state (engine/describe.py), and decides itself, through a
group commit, with an injected clock and RNG. Replays and rebuilds choose nothing: they record the logged
decisions and apply the logged feedback through the same ingest and store semantics, and describe the
result with the same code (replay/apply.py), so a replay of the log applies exactly the live rules.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from latebandit import metrics
from latebandit.audit.records import Record
from latebandit.audit.spool import Spool, SpoolFull
from latebandit.campaign import Campaign, CampaignSpec, CampaignStatus, PolicyChange
from latebandit.delays.exposure import Exposure, bucket_moments, exposure
from latebandit.engine.describe import arm_stats, delay_rows, describe_state, diagnostic_rows
from latebandit.engine.directory import MAX_MOVES, CampaignArchived, CampaignDirectory, UnknownCampaign
from latebandit.engine.group_commit import GroupCommit
from latebandit.engine.ingest import BatchIngest, Ingest
from latebandit.engine.planner import Planner
from latebandit.engine.prepared import PreparedChoice, recorded
from latebandit.engine.scheduling import UNSETTLED, Scheduler, describe_schedule, unclaimed
from latebandit.engine.standing import StandingChoice
from latebandit.policies.base import ArmStats, Policy
from latebandit.policies.floor import with_floor
from latebandit.store.base import (
    CampaignMoved,
    DecisionResult,
    DecisionStatus,
    Histogram,
    Pull,
    StateSnapshot,
    StateStore,
    StateUnreadable,
    StoreUnavailable,
)
from latebandit.store.schedule import Claim, ClaimStatus
from latebandit.timeutil import MICROS, Clock
from latebandit.tokens import DecisionToken, TokenSigner, new_nonce

logger = logging.getLogger(__name__)


class CampaignExists(ValueError):
    pass


UNREADABLE_REPORT_SECONDS = 60  # how often a campaign whose state cannot be read is reported in the log
GROUP_LIMIT = 64  # decisions recorded by one script call at most (the store's per-call cost is amortised long before)
ANSWERED = (DecisionStatus.NEW, DecisionStatus.REPEATED)  # a decision recorded, or its request's earlier one


@dataclass(frozen=True)
class Decision:
    decision_id: str
    campaign: str
    arm: str
    policy: str
    propensity: float
    fallback: bool

    def body(self) -> dict[str, Any]:
        return {
            "decision_id": self.decision_id, "campaign": self.campaign, "arm": self.arm,
            "policy": self.policy, "propensity": self.propensity, "fallback": self.fallback,
        }  # fmt: skip


@dataclass(frozen=True)
class EngineOptions:
    max_skew: float = 300.0
    request_ttl: float = 86_400.0
    dedup_retention: float = 86_400.0
    snapshot_interval: float = 1.0


class DecisionEngine:
    def __init__(
        self,
        store: StateStore,
        signer: TokenSigner,
        clock: Clock,
        rng: np.random.Generator,
        options: EngineOptions,
        after_write: Callable[[], Awaitable[None]] | None = None,
        from_history: Callable[[str], Awaitable[Campaign | None]] | None = None,
        spool: Spool | None = None,
    ) -> None:
        self.store = store
        self.signer = signer
        self.clock = clock
        self.rng = rng
        self.options = options
        self._after_write = after_write  # the embedded mode makes each write durable before answering
        self.spool = spool  # where fallback decisions' audit records go while the store is unreachable
        self.campaigns = CampaignDirectory(store, clock, from_history)
        ingest = Ingest(store, options.max_skew, options.dedup_retention)
        # Bound, not wrapped: a /feedback request goes straight to the ingest, with no call of its own here.
        self.feedback = BatchIngest(ingest, signer, clock, self.campaigns, self._durable).feedback
        self.planner = Planner()
        self._exposures: dict[str, tuple[Histogram, Exposure]] = {}
        self._standing: dict[str, StandingChoice] = {}  # per campaign, while its statistics stand
        self._prepared: dict[str, PreparedChoice] = {}  # per campaign, its next decision's choice
        self._predictable: dict[str, bool] = {}  # per campaign: its last lone decision's reply held no other writes
        # Histogram reads whose per-arm gauges are not published yet (publish_diagnostics, off the request path).
        self._unpublished: dict[str, tuple[Campaign, StateSnapshot, Exposure]] = {}
        self._publishing = threading.Lock()
        self.scheduler = Scheduler(store, rng, self._pull)
        self._decisions = GroupCommit(self._decide_together, GROUP_LIMIT)
        self._claims = GroupCommit(self._claim_together, GROUP_LIMIT)
        self._unreadable_reported: dict[str, int] = {}  # per campaign, when its unreadable state was last logged

    # campaigns ------------------------------------------------------------------------------------

    async def create_campaign(self, spec: CampaignSpec) -> Campaign:
        if await self.campaigns.from_history(spec.id) is not None:
            raise CampaignExists(
                spec.id, "its audit history exists; if the state store lost it, run `latebandit rebuild`"
            )
        now = self.clock()
        campaign = Campaign(**spec.model_dump(), created_at=now)
        record: Record = {"type": "campaign", "campaign": campaign.id, "at": now, "action": "create",
                          "config": campaign.model_dump(mode="json")}  # fmt: skip
        if not await self.store.create_campaign(campaign, record):
            raise CampaignExists(campaign.id, "it already exists")
        await self._durable()
        self.campaigns.remember(campaign)
        return campaign

    async def campaign(self, campaign_id: str, fresh: bool = False) -> Campaign:
        """The campaign's configuration (CampaignDirectory.campaign)."""
        return await self.campaigns.campaign(campaign_id, fresh)

    async def set_status(self, campaign_id: str, status: CampaignStatus) -> Campaign:
        record: Record = {"type": "campaign", "campaign": campaign_id, "at": self.clock(),
                          "action": "pause" if status is CampaignStatus.PAUSED else "resume"}  # fmt: skip
        campaign = _changeable(campaign_id, await self.store.set_status(campaign_id, status, record))
        await self._durable()
        self.campaigns.remember(campaign)
        return campaign

    async def archive(self, campaign_id: str) -> Campaign:
        """Archive the campaign: decisions end now, conversions are recorded until its ``feedback_until``, then
        a sweep (``purge_archived``) removes its state; its metric series go now. A repeated archive answers the
        first one (idempotent). The audit record is written with the archive, atomically."""
        now = self.clock()
        current = await self.campaigns.campaign(campaign_id, fresh=True)
        record: Record = {"type": "campaign", "campaign": campaign_id, "at": now, "action": "archive"}
        archived = await self.store.archive(current.archived(now), record)
        if archived is None:
            raise UnknownCampaign(campaign_id)
        await self._durable()
        self.campaigns.remember(archived)  # its metric series are removed there (metrics.publish_campaign)
        for held in (self._exposures, self._standing, self._prepared, self._predictable, self._unpublished):
            held.pop(campaign_id, None)
        return archived

    async def change_policy(self, campaign_id: str, change: PolicyChange) -> Campaign:
        """Start the campaign's next policy version (a fresh state; the audit log keeps the old one's
        history, and a replay applies the change at the same point). ValueError if the new policy does not
        fit the campaign, CampaignMoved if another change won the race."""
        current = _changeable(campaign_id, await self.campaigns.campaign(campaign_id, fresh=True))
        campaign = current.with_policy(change)
        record: Record = {"type": "campaign", "campaign": campaign_id, "at": self.clock(), "action": "policy",
                          "config": campaign.model_dump(mode="json")}  # fmt: skip
        changed = _changeable(campaign_id, await self.store.change_policy(campaign, record))
        await self._durable()
        self.campaigns.remember(changed)
        return changed

    # decisions ------------------------------------------------------------------------------------

    async def choose(self, campaign_id: str, request_id: str | None = None) -> Decision:
        """A decision is always answered while the campaign can be known: with the store down (or emptied)
        a worker that never cached the campaign reads its configuration from the audit log."""
        now = self.clock()
        for attempt in range(MAX_MOVES):
            try:
                campaign = await self.campaigns.campaign(campaign_id, fresh=attempt > 0)
            except StoreUnavailable:
                known = await self.campaigns.while_store_down(campaign_id)
                if known is None:
                    raise
                return await self._store_down(known, now, request_id)
            if campaign.archived_at is not None:
                raise CampaignArchived(campaign_id)
            try:
                return await self._decide(campaign, now, request_id)
            except CampaignMoved:
                continue
            except StoreUnavailable:
                return await self._store_down(campaign, now, request_id)
        raise StoreUnavailable(f"campaign {campaign_id!r} changed policy {MAX_MOVES} times during one request")

    async def _store_down(self, campaign: Campaign, now: int, request_id: str | None) -> Decision:
        """Nothing can be recorded in the store: the decision id alone marks the pull as uncounted, and its
        audit record waits in the spool (answered only once it is on disk there)."""
        metrics.STORE_ERRORS.labels("choose").inc()
        pull = self._pull(campaign, self._default_arm(campaign), 1.0, now, request_id, fallback=True)
        if self.spool is not None:
            try:
                await self.spool.append(pull.record)
            except (SpoolFull, OSError) as error:
                raise StoreUnavailable(f"store unreachable and the decision cannot be audited: {error}") from error
        return self._answer(campaign, DecisionResult(DecisionStatus.NEW, pull.decision_id, pull.arm, 1.0),
                            "fallback_store_down")  # fmt: skip

    async def _decide(self, campaign: Campaign, now: int, request_id: str | None) -> Decision:
        try:
            if campaign.plans:
                claim = await self._claims.submit((campaign.id, campaign.version), (campaign, request_id))
                if claim.status is ClaimStatus.UNREADABLE:
                    raise StateUnreadable(campaign.id, "its schedule, to plan")
                if claim.status in UNSETTLED:
                    raise unclaimed(campaign)
                status = DecisionStatus(claim.status.value)
                result = DecisionResult(status, claim.decision_id, claim.arm, claim.propensity)
            else:
                result = await self._decisions.submit((campaign.id, campaign.version), (campaign, request_id))
        except StateUnreadable as unreadable:
            self._report_unreadable(unreadable, now)
            result, outcome = await self._fallback(campaign, now, request_id), "fallback_unreadable"
        else:
            if result.status in (DecisionStatus.MOVED, DecisionStatus.ARCHIVED):  # reloaded: a change, or archived
                raise CampaignMoved(campaign.id)
            if result.status is DecisionStatus.UNKNOWN:
                raise await self.campaigns.refused_unknown(campaign.id)
            outcome = result.status.value
            if result.status is DecisionStatus.PAUSED:
                result, outcome = await self._fallback(campaign, now, request_id), "fallback_paused"
        try:
            await self._durable()
        except StoreUnavailable:  # recorded and queued: the audit catches up; never answer a second decision
            metrics.STORE_ERRORS.labels("choose_audit").inc()
        return self._answer(campaign, result, outcome)

    async def _fallback(self, campaign: Campaign, now: int, request_id: str | None) -> DecisionResult:
        """The default arm, recorded as a fallback (its pull never counts), for a campaign that cannot decide."""
        fallback = self._pull(campaign, self._default_arm(campaign), 1.0, now, request_id, fallback=True)
        result = await self.store.record_fallback(campaign, fallback, request_id, math.ceil(self.options.request_ttl))
        if result.status is DecisionStatus.UNKNOWN:
            raise await self.campaigns.refused_unknown(campaign.id)
        if result.status is DecisionStatus.ARCHIVED:
            raise CampaignArchived(campaign.id)
        return result

    def _report_unreadable(self, unreadable: StateUnreadable, now: int) -> None:
        """An error line naming the campaign, at most once per UNREADABLE_REPORT_SECONDS for each: every
        decision of the campaign meets it until an operator acts, and the log must stay readable."""
        reported = self._unreadable_reported.get(unreadable.campaign_id)
        if reported is not None and now - reported < UNREADABLE_REPORT_SECONDS * MICROS:
            return
        self._unreadable_reported[unreadable.campaign_id] = now
        logger.error(
            "%s; its decisions fall back to its default arm until the state is rebuilt from the audit log "
            "(`latebandit rebuild --campaign %s`) or its policy is changed",
            unreadable, unreadable.campaign_id, extra={"campaign": unreadable.campaign_id},
        )  # fmt: skip

    async def _decide_together(
        self, key: tuple[str, int], requests: list[tuple[Campaign, str | None]]
    ) -> list[DecisionResult]:
        """The decisions of one group commit: one policy call for the whole batch (each row its own draw),
        one store call to record them. Taken at the batch's time, from the same statistics. For a lone
        decision the next one is made ready (``_prepare_next``) while it is recorded, from the counters the
        record will answer where the last reply held no other writer's, and checked (``_prepare_after``)
        once it is answered."""
        campaign = requests[0][0]
        request_ids = [request_id for _, request_id in requests]
        now = self.clock()
        state = await self.store.snapshot(campaign, self.options.snapshot_interval)
        chosen = await self._choose(campaign, state, now, len(requests))
        pulls = [
            self._pull(campaign, arm, propensity, now, request_id)
            for (arm, propensity), request_id in zip(chosen, request_ids, strict=True)
        ]
        loop, lone = asyncio.get_running_loop(), len(requests) == 1
        if lone and self._predictable.get(campaign.id, True) and self._holds(campaign):
            loop.call_soon(self._prepare_next, key, campaign, recorded(state, pulls[0].arm))  # in the reply's wait
        results = await self.store.record_decisions(campaign, pulls, request_ids, math.ceil(self.options.request_ttl))
        if lone and results[0].status in ANSWERED:
            loop.call_soon(self._prepare_after, key, campaign, state)
        return results

    async def _choose(
        self, campaign: Campaign, state: StateSnapshot, now: int, decisions: int
    ) -> list[tuple[int, float]]:
        """Arms and propensities for ``decisions`` successive decisions: the choice prepared for exactly these
        statistics (engine/prepared.py), drawn from the campaign's standing choice while its statistics stand
        (engine/standing.py), else from the policy's own call."""
        prepared = self._prepared.pop(campaign.id, None)
        if prepared is not None and prepared.serves(campaign, state, decisions):
            return [(prepared.arm, prepared.propensity)]
        if self._standing_serves(campaign, state, decisions):
            return self._standing[campaign.id].draw(decisions, self.rng)
        stats = await self._stats(campaign, state, now)
        policy = self.planner.policy_for(campaign, stats)
        standing = self._renew_standing(campaign, state, policy, stats)
        if standing is not None:
            return standing.draw(decisions, self.rng)
        return self._policy_call(campaign, policy, stats, decisions)

    def _standing_serves(self, campaign: Campaign, state: StateSnapshot, decisions: int) -> bool:
        standing = self._standing.get(campaign.id)
        return standing is not None and standing.serves(campaign, state, decisions)

    def _renew_standing(
        self, campaign: Campaign, state: StateSnapshot, policy: Policy, stats: ArmStats
    ) -> StandingChoice | None:
        """The policy's standing choice for these statistics, kept for the decisions that follow; None (and
        none kept) where it has none: during an opening, for a policy whose law is never a standing one
        (qpm-d, Thompson sampling above 10 arms: a nan row) or that does not stand."""
        standing = StandingChoice.of(campaign, state, policy.standing(stats)[0], GROUP_LIMIT) if policy.stands else None
        if standing is None:
            self._standing.pop(campaign.id, None)
        else:
            self._standing[campaign.id] = standing
        return standing

    def _policy_call(
        self, campaign: Campaign, policy: Policy, stats: ArmStats, decisions: int
    ) -> list[tuple[int, float]]:
        choice = with_floor(policy.choose_together(stats, decisions, self.rng), campaign.exploration_floor, self.rng)
        return list(zip(choice.arm.tolist(), choice.propensity.tolist(), strict=True))

    def _prepare_next(self, key: tuple[str, int], campaign: Campaign, state: StateSnapshot) -> None:
        """What the next decision needs, from ``state``, the statistics it reads if nothing else writes first, so
        that it does not compute it itself: a standing choice that serves it (renewed once the one held is used
        up after 64 decisions or computed from another S: the policy's call that every 64th decision would pay
        in its request); where the policy has no standing law (it does not stand, an opening, a nan law), its
        choice (engine/prepared.py). docs/benchmarks.md has what each costs.
        Not while other decisions of the campaign wait (they go as one batch), nor where a choice prepared
        already serves it, nor without a held histogram read whose Ñ is computed (that needs I/O), nor for a
        planned policy (its plan may change before the next decision)."""
        if self._decisions.waiting(key) or self.planner.plans(campaign) or self._standing_serves(campaign, state, 1):
            return
        prepared = self._prepared.get(campaign.id)
        if prepared is not None and prepared.serves(campaign, state, 1):
            return
        policy, stats = campaign.policy_impl, self._held_stats(campaign, state)
        if stats is None or self._renew_standing(campaign, state, policy, stats) is not None:
            return
        ((arm, propensity),) = self._policy_call(campaign, policy, stats, 1)
        self._prepared[campaign.id] = PreparedChoice(campaign, state, arm, propensity)

    def _prepare_after(self, key: tuple[str, int], campaign: Campaign, before: StateSnapshot) -> None:
        """Once a lone decision taken from ``before`` is answered: the next one made ready from the statistics
        held now, unless what was prepared while it was recorded serves them. That needs the reply to hold no
        other writer's decision or conversion, which one worker's campaign between conversions shows; where
        replies do hold some (other workers deciding), preparing during the record is left off until one does
        not. Nothing is prepared while a decision of the campaign is queued or being recorded (its pull is not
        in the counters held yet)."""
        state = self.store.held(campaign, self.options.snapshot_interval)
        if state is None:
            return
        held, sent = state.counters, before.counters  # this decision's reply (another one in flight has none yet)
        self._predictable[campaign.id] = held.conversions is sent.conversions and held.decisions == sent.decisions + 1
        if not self._decisions.busy(key):
            self._prepare_next(key, campaign, state)

    def _holds(self, campaign: Campaign) -> bool:
        """Whether the store holds the campaign's statistics between decisions, what a prepared choice is
        compared with (the embedded store builds them anew for each decision: nothing prepared would serve)."""
        return self.store.held(campaign, self.options.snapshot_interval) is not None

    async def _claim_together(self, _: tuple[str, int], requests: list[tuple[Campaign, str | None]]) -> list[Claim]:
        """The slot claims of one group commit (a planning campaign), made at the batch's time."""
        request_ids = [request_id for _, request_id in requests]
        return await self.scheduler.claim_together(
            requests[0][0], self.clock(), request_ids, math.ceil(self.options.request_ttl)
        )

    def _pull(
        self, campaign: Campaign, arm: int, propensity: float, now: int, request_id: str | None, fallback: bool = False
    ) -> Pull:
        """A decision to record: its signed id, where it falls in the histogram, and its audit record. A
        fallback's id marks its pull as uncounted, so a later conversion of it never enters S
        (docs/design-notes.md, "Decision ids")."""
        token = DecisionToken(campaign.id, arm, now, campaign.version, new_nonce(), fallback)
        decision_id = self.signer.sign(token)
        bucket, offset, moments = bucket_moments(campaign, now)
        record: Record = {
            "type": "decision", "campaign": campaign.id, "decision_id": decision_id, "arm": campaign.arms[arm],
            "at": now, "propensity": propensity, "policy": campaign.policy.name, "version": campaign.version,
            "fallback": fallback, "request_id": request_id,
        }  # fmt: skip
        if fallback:
            record["seq"] = None
        return Pull(arm, bucket, offset, moments, decision_id, propensity, record)

    @staticmethod
    def _default_arm(campaign: Campaign) -> int:
        return campaign.arm_index[campaign.default_arm or campaign.arms[0]]

    def _answer(self, campaign: Campaign, result: DecisionResult, outcome: str) -> Decision:
        arm = campaign.arms[result.arm]
        fallback = outcome.startswith("fallback") or (
            result.status is DecisionStatus.REPEATED and self.signer.verify(result.decision_id).fallback
        )
        metrics.decision_counter(campaign.id, arm, outcome).inc()
        return Decision(result.decision_id, campaign.id, arm, campaign.policy.name, result.propensity, fallback)

    async def _stats(self, campaign: Campaign, state: StateSnapshot, now: int) -> ArmStats:
        """Ñ is evaluated once per histogram read and reused while the store serves that read (Redis:
        up to ``snapshot_interval``), so a decision costs O(K), not O(K·B) (docs/design-notes.md, Ñ)."""
        held = self._held_stats(campaign, state)
        if held is not None:
            return held
        seen = exposure(campaign, state, now)
        self._exposures[campaign.id] = (state.histogram, seen)
        self._unpublished[campaign.id] = (campaign, state, seen)
        if seen.matured_cells.any():
            hist = state.histogram
            await self.store.fold_matured(campaign, hist.arm[seen.matured_cells], hist.bucket[seen.matured_cells])
        return arm_stats(state, seen)

    def _held_stats(self, campaign: Campaign, state: StateSnapshot) -> ArmStats | None:
        """The statistics from ``state`` if its histogram read's Ñ is computed already, else None (no I/O)."""
        cached = self._exposures.get(campaign.id)
        return arm_stats(state, cached[1]) if cached is not None and cached[0] is state.histogram else None

    def publish_diagnostics(self) -> None:
        """The per-arm gauges (estimates, indices, delay summaries) of the histogram reads since the last
        call. Run at scrape time and by a background task, in a thread: at 50 arms the delay summaries take
        tens of milliseconds, which no decision should wait for."""
        with self._publishing:
            while self._unpublished:
                campaign_id, (campaign, state, seen) = self._unpublished.popitem()  # atomic: the loop adds meanwhile
                metrics.publish_arms(campaign_id, diagnostic_rows(campaign, state, seen))
                metrics.publish_delays(campaign_id, delay_rows(campaign, state, seen))

    # state ----------------------------------------------------------------------------------------

    async def state(self, campaign_id: str, at: int | None = None) -> dict[str, Any]:
        campaign = _changeable(campaign_id, await self.campaigns.campaign(campaign_id, fresh=True))
        as_of = self.clock() if at is None else at
        if campaign.plans:
            snapshot, view = await self.store.snapshot(campaign, 0.0), await self.store.schedule_view(campaign)
            return describe_schedule(campaign, snapshot.counters, view, as_of)
        body = describe_state(campaign, await self.store.snapshot(campaign, 0.0), as_of)
        planned = self.planner.planned(campaign)
        if planned is not None or self.planner.plans(campaign):
            body["policy_state"]["plan"] = planned.plan_state() if planned is not None else {"status": "solving"}
        self._unpublished.pop(campaign.id, None)  # an older read: a later scrape must not publish it over this
        metrics.publish_arms(campaign.id, body["arms"])
        metrics.publish_delays(campaign.id, {arm: row["delays"] for arm, row in body["arms"].items()})
        return body

    async def _durable(self) -> None:
        if self._after_write is not None:
            await self._after_write()


def _changeable(campaign_id: str, campaign: Campaign | None) -> Campaign:
    """``campaign`` as the store answered a change or a read of it: UnknownCampaign if none, CampaignArchived
    if archived (its state is going; GET /state?at= replays its past from the audit log)."""
    if campaign is None:
        raise UnknownCampaign(campaign_id)
    if campaign.archived_at is not None:
        raise CampaignArchived(campaign_id)
    return campaign
