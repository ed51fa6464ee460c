"""The decision engine: /choose, /feedback and the state object, independent of HTTP.

The API, replays and rebuilds all go through this one class, with an injected clock and RNG, so the
live service and a replay of its log apply exactly the same rules.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latebandit import metrics
from latebandit.audit.records import Outcome, Record
from latebandit.audit.spool import Spool, SpoolFull
from latebandit.campaign import Campaign, CampaignSpec, CampaignStatus, PolicyChange
from latebandit.delays.exposure import Exposure, bucket_moments, campaign_stats, exposure
from latebandit.delays.tail import delay_summary
from latebandit.engine.feedback import (
    Conversion,
    Reason,
    Rejection,
    anonymous_event,
    campaign_of,
    parse_conversion,
    prepare_batch,
)
from latebandit.engine.group_commit import GroupCommit
from latebandit.engine.planner import Planner
from latebandit.engine.scheduling import UNSETTLED, Scheduler, describe_schedule, unclaimed
from latebandit.policies.base import EPS_N, ArmStats
from latebandit.policies.floor import with_floor
from latebandit.policies.guha import GuhaBayes
from latebandit.store.base import (
    AnonymousEvent,
    CampaignMoved,
    CampaignRefused,
    DecisionResult,
    DecisionStatus,
    Histogram,
    PreparedConversion,
    Pull,
    StateSnapshot,
    StateStore,
    StoreUnavailable,
)
from latebandit.store.schedule import Claim, Uncredited
from latebandit.timeutil import MICROS, Clock, format_time
from latebandit.tokens import DecisionToken, TokenSigner, new_nonce


class UnknownCampaign(LookupError):
    pass


class CampaignExists(ValueError):
    pass


MAX_MOVES = 3
# Campaign ids no store or history knows are answered unknown without a lookup for this long (µs), so a
# client naming made-up campaigns costs one Redis read and one audit query per id and window, not per
# event. The price: a campaign created on another worker meanwhile is unknown here for as long.
UNKNOWN_FOR = 5 * MICROS
UNKNOWN_REMEMBERED = 10_000  # such ids held at most (the oldest go first)
LOOKUPS_PER_BATCH = 100  # campaigns one /feedback batch may make this worker look up; the rest are refused
GROUP_LIMIT = 64  # decisions recorded by one script call at most (the store's per-call cost is amortised long before)
Item = Conversion | dict[str, Any]  # a verified conversion, or an aggregate or watermark as sent
"""Reloads of a campaign whose policy version changed under a request before it answers 503 (retry)."""


def lost_campaign(campaign_id: str) -> StoreUnavailable:
    """A campaign this worker knows that the store no longer has: Redis lost its data. Callers answer
    as for a store outage (fallback decisions, 503 on feedback) until `latebandit rebuild` restores it."""
    return StoreUnavailable(f"the store has lost campaign {campaign_id!r}: run `latebandit rebuild`")


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


@dataclass
class FeedbackResult:
    accepted: int = 0
    duplicates: int = 0
    censored: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)

    def body(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "duplicates": self.duplicates, "censored": self.censored,
                "rejected": sorted(self.rejected, key=lambda item: item["index"])}  # fmt: skip

    def reject(self, index: int, rejection: Rejection) -> None:
        self.rejected.append({"index": index, "reason": rejection.reason.value, "detail": rejection.detail})
        metrics.FEEDBACK_REJECTED.labels(rejection.reason.value).inc()


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
        # The campaign as the audit log knows it: the store may have lost it, or be unreachable.
        self._from_history = from_history
        self.spool = spool  # where fallback decisions' audit records go while the store is unreachable
        self._campaigns: dict[str, Campaign] = {}
        self._unknown: dict[str, int] = {}  # campaign id -> until when (µs) it is answered unknown unread
        self.planner = Planner()
        self._exposures: dict[str, tuple[Histogram, Exposure]] = {}
        # Histogram reads whose per-arm gauges are not published yet (publish_diagnostics, off the request path).
        self._unpublished: dict[str, tuple[Campaign, StateSnapshot, Exposure]] = {}
        self._publishing = threading.Lock()
        self.scheduler = Scheduler(store, rng, self._pull)
        self._decisions = GroupCommit(self._decide_together, GROUP_LIMIT)
        self._claims = GroupCommit(self._claim_together, GROUP_LIMIT)

    # campaigns ------------------------------------------------------------------------------------

    async def create_campaign(self, spec: CampaignSpec) -> Campaign:
        if await self._remembered(spec.id) is not None:
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
        self._remember(campaign)
        return campaign

    def _remember(self, campaign: Campaign) -> None:
        self._campaigns[campaign.id] = campaign
        self._unknown.pop(campaign.id, None)
        metrics.publish_campaign(campaign)

    def _remember_unknown(self, campaign_id: str) -> None:
        if len(self._unknown) >= UNKNOWN_REMEMBERED:
            del self._unknown[next(iter(self._unknown))]
        self._unknown[campaign_id] = self.clock() + UNKNOWN_FOR

    async def campaign(self, campaign_id: str, fresh: bool = False) -> Campaign:
        """The campaign's configuration; cached per worker. The store's scripts check the status and the
        policy version themselves, and a stale copy is reloaded when they answer ``moved``."""
        campaign = None if fresh else self._campaigns.get(campaign_id)
        if campaign is None:
            if not fresh and self._unknown.get(campaign_id, 0) > self.clock():
                raise UnknownCampaign(campaign_id)
            campaign = await self.store.get_campaign(campaign_id)
            if campaign is None:
                if await self._remembered(campaign_id) is not None:
                    raise lost_campaign(campaign_id)  # the same answer on every worker: retry after rebuild
                self._remember_unknown(campaign_id)
                raise UnknownCampaign(campaign_id)
            self._remember(campaign)
        return campaign

    async def _remembered(self, campaign_id: str) -> Campaign | None:
        return None if self._from_history is None else await self._from_history(campaign_id)

    async def set_status(self, campaign_id: str, status: CampaignStatus) -> Campaign:
        record: Record = {"type": "campaign", "campaign": campaign_id, "at": self.clock(),
                          "action": "pause" if status is CampaignStatus.PAUSED else "resume"}  # fmt: skip
        campaign = await self.store.set_status(campaign_id, status, record)
        if campaign is None:
            raise UnknownCampaign(campaign_id)
        await self._durable()
        self._remember(campaign)
        return campaign

    async def change_policy(self, campaign_id: str, change: PolicyChange) -> Campaign:
        """Start the campaign's next policy version (a fresh state; the audit log keeps the old one's
        history, and a replay applies the change at the same point). ValueError if the new policy does not
        fit the campaign, CampaignMoved if another change won the race."""
        current = await self.campaign(campaign_id, fresh=True)
        campaign = current.with_policy(change)
        record: Record = {"type": "campaign", "campaign": campaign_id, "at": self.clock(), "action": "policy",
                          "config": campaign.model_dump(mode="json")}  # fmt: skip
        changed = await self.store.change_policy(campaign, record)
        if changed is None:
            raise UnknownCampaign(campaign_id)
        await self._durable()
        self._remember(changed)
        return changed

    # decisions ------------------------------------------------------------------------------------

    async def choose(self, campaign_id: str, request_id: str | None = None) -> Decision:
        """A decision is always answered while the campaign can be known: with the store down (or emptied)
        a worker that never cached the campaign reads its configuration from the audit log."""
        now = self.clock()
        for attempt in range(MAX_MOVES):
            try:
                campaign = await self.campaign(campaign_id, fresh=attempt > 0)
            except StoreUnavailable:
                campaign = await self._remembered(campaign_id)
                if campaign is None:
                    raise
                self._campaigns[campaign_id] = campaign
                return await self._store_down(campaign, now, request_id)
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
        ttl = math.ceil(self.options.request_ttl)
        if campaign.plans:
            claim = await self._claims.submit((campaign.id, campaign.version), (campaign, request_id))
            if claim.status in UNSETTLED:
                raise unclaimed(campaign)
            result = DecisionResult(DecisionStatus(claim.status.value), claim.decision_id, claim.arm, claim.propensity)
        else:
            result = await self._decisions.submit((campaign.id, campaign.version), (campaign, request_id))
        if result.status is DecisionStatus.MOVED:
            raise CampaignMoved(campaign.id)
        if result.status is DecisionStatus.UNKNOWN:
            raise lost_campaign(campaign.id)
        outcome = result.status.value
        if result.status is DecisionStatus.PAUSED:
            fallback = self._pull(campaign, self._default_arm(campaign), 1.0, now, request_id, fallback=True)
            result, outcome = await self.store.record_fallback(campaign, fallback, request_id, ttl), "fallback_paused"
            if result.status is DecisionStatus.UNKNOWN:
                raise lost_campaign(campaign.id)
        try:
            await self._durable()
        except StoreUnavailable:  # recorded and queued: the audit catches up; never answer a second decision
            metrics.STORE_ERRORS.labels("choose_audit").inc()
        return self._answer(campaign, result, outcome)

    async def _decide_together(
        self, _: tuple[str, int], requests: list[tuple[Campaign, str | None]]
    ) -> list[DecisionResult]:
        """The decisions of one group commit: one policy call for the whole batch (each row its own draw),
        one store call to record them. Taken at the batch's time, from the same statistics."""
        campaign = requests[0][0]
        request_ids = [request_id for _, request_id in requests]
        now = self.clock()
        state = await self.store.snapshot(campaign, self.options.snapshot_interval)
        stats = await self._stats(campaign, state, now)
        policy = self.planner.policy_for(campaign, stats)
        choice = with_floor(policy.choose_together(stats, len(requests), self.rng), campaign.exploration_floor,
                            self.rng)  # fmt: skip
        pulls = [
            self._pull(campaign, arm, propensity, now, request_id)
            for arm, propensity, request_id in zip(
                choice.arm.tolist(), choice.propensity.tolist(), request_ids, strict=True
            )
        ]
        return await self.store.record_decisions(campaign, pulls, request_ids, math.ceil(self.options.request_ttl))

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
        (vernade2017.md §3.6, pitfall 12)."""
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
        metrics.DECISIONS.labels(*metrics.arm_label(campaign.id, arm), outcome).inc()
        return Decision(result.decision_id, campaign.id, arm, campaign.policy.name, result.propensity, fallback)

    async def _stats(self, campaign: Campaign, state: StateSnapshot, now: int) -> ArmStats:
        """Ñ is evaluated once per histogram read and reused while the store serves that read (Redis:
        up to ``snapshot_interval``), so a decision costs O(K), not O(K·B) (vernade2017.md §3.4f)."""
        cached = self._exposures.get(campaign.id)
        if cached is not None and cached[0] is state.histogram:
            return arm_stats(state, cached[1])
        seen = exposure(campaign, state, now)
        self._exposures[campaign.id] = (state.histogram, seen)
        self._unpublished[campaign.id] = (campaign, state, seen)
        if seen.matured_cells.any():
            hist = state.histogram
            await self.store.fold_matured(campaign, hist.arm[seen.matured_cells], hist.bucket[seen.matured_cells])
        return arm_stats(state, seen)

    def publish_diagnostics(self) -> None:
        """The per-arm gauges (estimates, indices, delay summaries) of the histogram reads since the last
        call. Run at scrape time and by a background task, in a thread: at 50 arms the delay summaries take
        tens of milliseconds, which no decision should wait for."""
        with self._publishing:
            while self._unpublished:
                campaign_id, (campaign, state, seen) = self._unpublished.popitem()  # atomic: the loop adds meanwhile
                rows = arm_rows(campaign, state, seen)
                for row, age in zip(rows.values(), seen.pending_age.tolist(), strict=True):
                    row["pending_age"] = _number(age)
                metrics.publish_arms(campaign_id, rows)
                metrics.publish_delays(campaign_id, delay_rows(campaign, state, seen))

    # feedback -------------------------------------------------------------------------------------

    async def feedback(self, events: list[Any]) -> FeedbackResult:
        """Apply a batch. Raises StoreUnavailable (the caller answers 503) when the store cannot be
        reached; events already applied are recognised as duplicates when the client retries."""
        result = FeedbackResult()
        now = self.clock()
        skew = round(self.options.max_skew * MICROS)
        by_campaign: dict[str, list[tuple[int, Item]]] = defaultdict(list)
        unknown: dict[str, Rejection | None] = {}  # each campaign is looked up once per batch
        lookups = 0
        for index, raw in enumerate(events):
            try:
                campaign_id, item = self._validate(raw, now, skew)
            except Rejection as rejection:
                result.reject(index, rejection)
                continue
            if campaign_id not in unknown:
                uncached = campaign_id not in self._campaigns
                if uncached and lookups >= LOOKUPS_PER_BATCH:
                    unknown[campaign_id] = Rejection(
                        Reason.UNKNOWN_CAMPAIGN, f"more than {LOOKUPS_PER_BATCH} campaigns this worker has not "
                        "seen yet in one batch: send this event again (the ones looked up are known now)",
                    )  # fmt: skip
                else:
                    lookups += uncached
                    unknown[campaign_id] = await self._unknown_campaign(campaign_id)
            refusal = unknown[campaign_id]
            if refusal is not None:
                result.reject(index, refusal)
                continue
            by_campaign[campaign_id].append((index, item))
        for campaign_id, conversions in by_campaign.items():
            await self._apply(result, campaign_id, conversions, now)
        await self._durable()
        return result

    async def _apply(self, result: FeedbackResult, campaign_id: str, conversions: list[tuple[int, Item]],
                     now: int) -> None:  # fmt: skip
        """One campaign's events, classified against its policy version; when the store answers that
        the version moved (a policy change), the rest are classified again against the reloaded campaign."""
        for attempt in range(MAX_MOVES):
            campaign = await self.campaign(campaign_id, fresh=attempt > 0)
            if campaign.plans:
                try:
                    await self._apply_anonymous(result, campaign, conversions, now)
                    return
                except CampaignMoved:
                    continue
            items = self._prepared(result, campaign, conversions, now)
            try:
                outcomes = await self.store.apply_conversions(campaign, [prepared for _, prepared in items])
            except CampaignRefused as refused:
                if refused.reason is DecisionStatus.UNKNOWN:  # known to this worker, so the store lost it: retry
                    raise lost_campaign(campaign_id) from refused
                applied = len(refused.applied)
                self._tally(result, campaign, items[:applied], refused.applied)
                if refused.reason is DecisionStatus.MOVED:
                    left = {index for index, _ in items[applied:]}
                    conversions = [(index, conversion) for index, conversion in conversions if index in left]
                    continue
                for index, _ in items[applied:]:
                    result.reject(index, Rejection(Reason.CAMPAIGN_PAUSED, f"campaign {campaign_id!r} is paused"))
                return
            self._tally(result, campaign, items, outcomes)
            return
        raise StoreUnavailable(f"campaign {campaign_id!r} changed policy {MAX_MOVES} times during one request")

    def _prepared(
        self, result: FeedbackResult, campaign: Campaign, conversions: list[tuple[int, Item]], now: int
    ) -> list[tuple[int, PreparedConversion]]:
        attributed: list[tuple[int, Conversion]] = []
        for index, conversion in conversions:
            if isinstance(conversion, Conversion):
                attributed.append((index, conversion))
            else:
                detail = (f"policy {campaign.policy.name!r} learns from attributed conversions, "
                          f"not {conversion['type']} events")  # fmt: skip
                result.reject(index, Rejection(Reason.WRONG_FEEDBACK_KIND, detail))
        prepared = prepare_batch(campaign, [item for _, item in attributed], now, self.options.dedup_retention)
        items = []
        for (index, _), outcome in zip(attributed, prepared, strict=True):
            if isinstance(outcome, Rejection):
                result.reject(index, outcome)
            else:
                items.append((index, outcome))
        return items

    async def _apply_anonymous(
        self, result: FeedbackResult, campaign: Campaign, items: list[tuple[int, Item]], now: int
    ) -> None:
        """A planning campaign's events: aggregates, watermarks, and conversions read as aggregates. Raises
        CampaignMoved, having changed nothing, when the campaign's policy version moved."""
        skew, retention = round(self.options.max_skew * MICROS), self.options.dedup_retention
        events: list[tuple[int, AnonymousEvent]] = []
        rejections: list[tuple[int, Rejection]] = []
        for index, item in items:
            try:
                events.append((index, anonymous_event(campaign, item, now, skew, retention)))
            except Rejection as rejection:
                rejections.append((index, rejection))
        try:
            outcomes = await self.store.apply_anonymous(campaign, [event for _, event in events], now)
        except CampaignRefused as refused:
            if refused.reason is DecisionStatus.UNKNOWN:
                raise lost_campaign(campaign.id) from refused
            if refused.reason is DecisionStatus.MOVED:
                raise CampaignMoved(campaign.id) from refused
            paused = Rejection(Reason.CAMPAIGN_PAUSED, f"campaign {campaign.id!r} is paused")
            rejections += [(index, paused) for index, _ in events]
            events, outcomes = [], []
        for index, rejection in rejections:
            result.reject(index, rejection)
        self._tally_anonymous(result, campaign, events, outcomes)

    def _validate(self, raw: Any, now: int, skew: int) -> tuple[str, Item]:
        """The event's campaign and the event: a verified conversion, or an aggregate or watermark (whose
        fields are checked against the campaign's policy, which may change before it is applied)."""
        named = campaign_of(raw)
        if named is not None:
            return named, raw
        conversion: Conversion = parse_conversion(raw, self.signer, now, skew)
        return conversion.campaign, conversion

    async def _unknown_campaign(self, campaign_id: str) -> Rejection | None:
        """The refusal of events for a campaign no store or history knows; None when it is known."""
        try:
            await self.campaign(campaign_id)
        except UnknownCampaign:
            return Rejection(Reason.UNKNOWN_CAMPAIGN, f"no campaign {campaign_id!r}")
        return None

    @staticmethod
    def _tally(
        result: FeedbackResult, campaign: Campaign, items: list[tuple[int, PreparedConversion]], outcomes: list[Outcome]
    ) -> None:
        label = metrics.campaign_label(campaign.id)
        delays, lags = metrics.CONVERSION_DELAY.labels(label), metrics.REPORT_LAG.labels(label)
        tally = Counter(outcomes)
        records = [prepared.record for (_, prepared), outcome in zip(items, outcomes, strict=True)
                   if outcome is not Outcome.DUPLICATE]  # fmt: skip
        metrics.observe_all(delays, [max(0, r["occurred_at"] - r["decided_at"]) / MICROS for r in records])
        metrics.observe_all(lags, [(r["received_at"] - r["occurred_at"]) / MICROS for r in records])
        for outcome, count in tally.items():
            metrics.FEEDBACK.labels(label, outcome.value).inc(count)
        result.duplicates += tally[Outcome.DUPLICATE]
        result.accepted += len(outcomes) - tally[Outcome.DUPLICATE]
        result.censored += tally[Outcome.CENSORED]

    @staticmethod
    def _tally_anonymous(
        result: FeedbackResult,
        campaign: Campaign,
        items: list[tuple[int, AnonymousEvent]],
        outcomes: list[Outcome | Uncredited],
    ) -> None:
        label = metrics.campaign_label(campaign.id)
        for (index, event), outcome in zip(items, outcomes, strict=True):
            if outcome == Outcome.PHASE_CLOSED:
                detail = "its interval reaches back before the feedback the policy already closed; recorded, not used"
                result.reject(index, Rejection(Reason.PHASE_CLOSED, detail))
            elif outcome is Uncredited.BEFORE_DECISION:
                result.reject(index, Rejection(Reason.BEFORE_DECISION, "it precedes the campaign's first decision"))
            elif outcome == Outcome.DUPLICATE:
                result.duplicates += 1
            else:
                result.accepted += 1
            if outcome is not Uncredited.BEFORE_DECISION:
                metrics.FEEDBACK.labels(label, f"{event.kind}_{outcome}").inc()

    # state ----------------------------------------------------------------------------------------

    async def state(self, campaign_id: str, at: int | None = None) -> dict[str, Any]:
        campaign = await self.campaign(campaign_id, fresh=True)
        as_of = self.clock() if at is None else at
        if campaign.plans:
            snapshot, view = await self.store.snapshot(campaign, 0.0), await self.store.schedule_view(campaign)
            return describe_schedule(campaign, snapshot.counters, view, as_of)
        body = describe_state(campaign, await self.store.snapshot(campaign, 0.0), as_of)
        planned = self.planner.planned(campaign)
        if planned is not None or isinstance(campaign.policy_impl, GuhaBayes):
            body["policy_state"]["plan"] = planned.plan_state() if planned is not None else {"status": "solving"}
        self._unpublished.pop(campaign.id, None)  # an older read: a later scrape must not publish it over this
        metrics.publish_arms(campaign.id, body["arms"])
        metrics.publish_delays(campaign.id, {arm: row["delays"] for arm, row in body["arms"].items()})
        return body

    async def _durable(self) -> None:
        if self._after_write is not None:
            await self._after_write()


def arm_stats(state: StateSnapshot, seen: Exposure) -> ArmStats:
    """The statistics for a decision. Pulls counted since the histogram read are missing from W; each adds
    at most ψ <= 1, so they are added at weight 1 and W stays an upper bound (manegueu2020.md §3.4)."""
    weight = seen.tail_weight
    if weight is not None:
        weight = weight + np.maximum(state.counters.pulls - seen.pulls_seen, 0)
    return campaign_stats(state, seen.effective, seen.delay_exposure, weight, seen.pending)


def _number(value: float) -> float | None:
    return None if not math.isfinite(value) else float(value)


def describe_state(campaign: Campaign, state: StateSnapshot, as_of: int) -> dict[str, Any]:
    """The CONTRACT.md ``state`` object, computed the same way for the live service and for replays. Each
    arm also carries ``delays``, what its observed conversion delays say (service/latebandit/delays/tail.py)."""
    seen = exposure(campaign, state, as_of)
    arms = arm_rows(campaign, state, seen)
    for arm, summary in delay_rows(campaign, state, seen).items():
        arms[arm]["delays"] = summary
    return {
        "campaign": campaign.id,
        "policy": campaign.policy.name,
        "decisions": int(state.counters.decisions),
        "as_of": format_time(as_of),
        "arms": arms,
        "policy_state": {
            "status": campaign.status.value,
            "window": campaign.window,
            "bucket_width": campaign.bucket_width_us / MICROS,
            **campaign.policy_impl.policy_state(arm_stats(state, seen)),
        },
    }


def delay_rows(campaign: Campaign, state: StateSnapshot, seen: Exposure) -> dict[str, dict[str, Any]]:
    """Per arm, what the observed delays say, weighted by how many pulls could have shown each delay."""
    counts = state.delay_counts()
    return {arm: delay_summary(counts[k], seen.delay_exposure[k]) for k, arm in enumerate(campaign.arms)}


def arm_rows(campaign: Campaign, state: StateSnapshot, seen: Exposure) -> dict[str, dict[str, Any]]:
    """Per arm: pulls, conversions, effective pulls, estimate, index (for t = decisions + 1), pending."""
    counters = state.counters
    stats = arm_stats(state, seen)
    policy = campaign.policy_impl
    effective = policy.effective_pulls(stats)[0]
    estimate = policy.estimate(stats)[0]
    index = policy.index(stats)[0]
    arms: dict[str, Any] = {}
    for k, arm in enumerate(campaign.arms):
        defined = effective[k] > EPS_N
        arms[arm] = {
            "pulls": int(counters.pulls[k]),
            "conversions": _integral(counters.conversions[k]),
            "effective_pulls": float(effective[k]),
            "estimate": _number(estimate[k]) if defined else None,
            "index": _number(index[k]) if defined else None,
            "pending": int(seen.pending[k]),
        }
    return arms


def _integral(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)
