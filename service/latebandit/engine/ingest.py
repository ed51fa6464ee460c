"""Feedback ingest: validated events applied to a state store, campaign by campaign.

``Ingest`` is the one code that turns a campaign's events into store calls: attributed conversions are
classified against the campaign's policy version (engine/feedback.py, ``prepare_batch``), a planning
campaign's events are read as aggregates and watermarks (``anonymous_event``), and the store's refusals
(paused, archived, moved, lost) are answered the same way. /feedback (``BatchIngest``) and the replay of an audit log
(replay/apply.py) both apply events through it, so a replay counts feedback as the service did; they differ
only in where the events come from and in what they make of each event's fate (a ``Ledger``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from latebandit import metrics
from latebandit.audit.records import Outcome
from latebandit.campaign import Campaign
from latebandit.engine.directory import MAX_MOVES, CampaignDirectory, UnknownCampaign, lost_campaign
from latebandit.engine.feedback import (
    Conversion,
    Reason,
    Rejection,
    anonymous_event,
    campaign_of,
    not_served,
    parse_conversion,
    prepare_batch,
)
from latebandit.store.base import (
    AnonymousEvent,
    CampaignRefused,
    DecisionStatus,
    PreparedConversion,
    StateStore,
    StoreUnavailable,
)
from latebandit.store.schedule import RewardBounds, Uncredited
from latebandit.timeutil import MICROS, Clock
from latebandit.tokens import BatchVerifier, TokenSigner

LOOKUPS_PER_BATCH = 100  # campaigns one /feedback batch may make this worker look up; the rest are refused
Item = Conversion | dict[str, Any]  # a verified conversion, or an aggregate or watermark as sent
APPLIED: Sequence[tuple[int, Item]] = ()  # what ``Ingest.apply`` leaves over when every event was applied
# The store's refusals that ``Ingest.apply`` hands back for the caller to reload the campaign: a policy change;
# or a campaign the store no longer has (archived and purged since, or lost: the reload tells which).
RELOAD = (DecisionStatus.MOVED, DecisionStatus.UNKNOWN)


class Ledger(Protocol):
    """What becomes of each event ``Ingest`` is given, by the index its caller gave it."""

    def reject(self, index: int, rejection: Rejection) -> None: ...

    def tally(
        self, campaign: Campaign, items: list[tuple[int, PreparedConversion]], outcomes: list[Outcome]
    ) -> None: ...

    def tally_anonymous(
        self, campaign: Campaign, items: list[tuple[int, AnonymousEvent]], outcomes: list[Outcome]
    ) -> None: ...


@dataclass
class FeedbackResult:
    """The answer to a /feedback batch, and the feedback metrics of its events. ``censored``, ``repeats`` and
    ``stale`` count accepted events (recorded in the audit log, not counted by the policy), so each is part
    of ``accepted``, as docs/reference/http-api.md says: a conversion later than its window, one for
    a decision that had converted already (a new event id), one for a decision of an earlier policy version
    or a fallback. ``duplicates`` are not accepted (nothing recorded)."""

    accepted: int = 0
    duplicates: int = 0
    censored: int = 0
    repeats: int = 0
    stale: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    campaigns: list[str] = field(default_factory=list)  # those the events named, in order (for the access log)

    def body(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "duplicates": self.duplicates, "censored": self.censored,
                "repeats": self.repeats, "stale": self.stale,
                "rejected": sorted(self.rejected, key=lambda item: item["index"])}  # fmt: skip

    def reject(self, index: int, rejection: Rejection) -> None:
        self.rejected.append({"index": index, "reason": rejection.reason.value, "detail": rejection.detail})
        metrics.FEEDBACK_REJECTED.labels(rejection.reason.value).inc()

    def tally(self, campaign: Campaign, items: list[tuple[int, PreparedConversion]], outcomes: list[Outcome]) -> None:
        label = metrics.campaign_label(campaign.id)
        tally = Counter(outcomes)
        records = [prepared.record for (_, prepared), outcome in zip(items, outcomes, strict=True)
                   if outcome is not Outcome.DUPLICATE]  # fmt: skip
        decided, occurred, received = (
            np.array([record[name] for record in records], dtype=np.int64)
            for name in ("decided_at", "occurred_at", "received_at")
        )
        metrics.observe_all(metrics.CONVERSION_DELAY.labels(label), np.maximum(occurred - decided, 0) / MICROS)
        metrics.observe_all(metrics.REPORT_LAG.labels(label), (received - occurred) / MICROS)
        for outcome, count in tally.items():
            metrics.FEEDBACK.labels(label, outcome.value).inc(count)
        self.duplicates += tally[Outcome.DUPLICATE]
        self.accepted += len(outcomes) - tally[Outcome.DUPLICATE]
        self.censored += tally[Outcome.CENSORED]
        self.repeats += tally[Outcome.REPEAT]
        self.stale += tally[Outcome.STALE]

    def tally_anonymous(
        self, campaign: Campaign, items: list[tuple[int, AnonymousEvent]], outcomes: list[Outcome]
    ) -> None:
        label = metrics.campaign_label(campaign.id)
        for (index, event), outcome in zip(items, outcomes, strict=True):
            if outcome == Outcome.PHASE_CLOSED:
                detail = "its interval reaches back before the feedback the policy already closed; recorded, not used"
                self.reject(index, Rejection(Reason.PHASE_CLOSED, detail))
            elif outcome == Outcome.DUPLICATE:
                self.duplicates += 1
            else:
                self.accepted += 1
                self.repeats += outcome == Outcome.REPEAT
                self.stale += outcome == Outcome.STALE
            metrics.FEEDBACK.labels(label, f"{event.kind}_{outcome}").inc()


class Ingest:
    """Validated events applied to one store, one campaign at a time, at the time they are received."""

    def __init__(self, store: StateStore, max_skew: float, retention: float) -> None:
        self.store = store
        self.max_skew = round(max_skew * MICROS)  # µs
        self.retention = retention  # s: how long deduplication keys outlive the window

    async def apply(
        self, campaign: Campaign, events: Sequence[tuple[int, Item]], now: int, ledger: Ledger
    ) -> Sequence[tuple[int, Item]]:
        """Apply ``campaign``'s events, classified against its policy version, and tell ``ledger`` what
        became of each. Returns those left unapplied because the store answered that the version moved (a
        policy change) or that it has no such campaign (``RELOAD``): the caller reloads the campaign and
        applies them again. An archived campaign's events received after its ``feedback_until`` are rejected."""
        if campaign.feedback_until is not None and now > campaign.feedback_until:
            for index, _ in events:
                ledger.reject(index, _archived(campaign))
            return APPLIED
        if campaign.plays_schedule:
            return await self._anonymous(campaign, events, now, ledger)
        items = self._prepared(campaign, events, now, ledger)
        try:
            outcomes = await self.store.apply_conversions(campaign, [prepared for _, prepared in items])
        except CampaignRefused as refused:
            applied = len(refused.applied)
            ledger.tally(campaign, *_refusals_out(campaign, items[:applied], refused.applied, ledger))
            if refused.reason in RELOAD:
                left = {index for index, _ in items[applied:]}
                return [(index, event) for index, event in events if index in left]
            for index, _ in items[applied:]:
                ledger.reject(index, _refusal(campaign, refused.reason))
            return APPLIED
        ledger.tally(campaign, *_refusals_out(campaign, items, outcomes, ledger))
        return APPLIED

    def _prepared(
        self, campaign: Campaign, events: Sequence[tuple[int, Item]], now: int, ledger: Ledger
    ) -> list[tuple[int, PreparedConversion]]:
        attributed: list[tuple[int, Conversion]] = []
        for index, conversion in events:
            if isinstance(conversion, Conversion):
                attributed.append((index, conversion))
            else:
                detail = (f"policy {campaign.policy.name!r} learns from attributed conversions, "
                          f"not {conversion['type']} events")  # fmt: skip
                ledger.reject(index, Rejection(Reason.WRONG_FEEDBACK_KIND, detail))
        prepared = prepare_batch(campaign, [item for _, item in attributed], now, self.retention)
        items = []
        for (index, _), outcome in zip(attributed, prepared, strict=True):
            if isinstance(outcome, Rejection):
                ledger.reject(index, outcome)
            else:
                items.append((index, outcome))
        return items

    async def _anonymous(
        self, campaign: Campaign, items: Sequence[tuple[int, Item]], now: int, ledger: Ledger
    ) -> Sequence[tuple[int, Item]]:
        """A planning campaign's events: aggregates, watermarks, and conversions read as aggregates. Returns
        them all, having changed nothing, when the campaign's policy version moved."""
        events: list[tuple[int, AnonymousEvent]] = []
        rejections: list[tuple[int, Rejection]] = []
        for index, item in items:
            try:
                events.append((index, anonymous_event(campaign, item, now, self.max_skew, self.retention)))
            except Rejection as rejection:
                rejections.append((index, rejection))
        try:
            outcomes = await self.store.apply_anonymous(campaign, [event for _, event in events], now)
        except CampaignRefused as refused:
            if refused.reason in RELOAD:
                return items
            rejections += [(index, _refusal(campaign, refused.reason)) for index, _ in events]
            events, outcomes = [], []
        for index, refusal in rejections:
            ledger.reject(index, refusal)
        ledger.tally_anonymous(campaign, *_refusals_out(campaign, events, outcomes, ledger))
        return APPLIED


Event = TypeVar("Event", PreparedConversion, AnonymousEvent)


def _refusals_out(
    campaign: Campaign, items: list[tuple[int, Event]], outcomes: Sequence[Outcome | Uncredited], ledger: Ledger
) -> tuple[list[tuple[int, Event]], list[Outcome]]:
    """The events the store took and their outcomes, once those it refused (``Uncredited``: nothing changed,
    nothing recorded) are given to ``ledger`` as rejections."""
    taken: list[tuple[int, Event]] = []
    kept: list[Outcome] = []
    for (index, event), outcome in zip(items, outcomes, strict=True):
        if isinstance(outcome, Outcome):
            taken.append((index, event))
            kept.append(outcome)
        elif outcome is Uncredited.BEFORE_DECISION:
            ledger.reject(index, Rejection(Reason.BEFORE_DECISION, "it precedes the campaign's first decision"))
        else:
            ledger.reject(index, _out_of_range(campaign, event))
    return taken, kept


def _out_of_range(campaign: Campaign, event: PreparedConversion | AnonymousEvent) -> Rejection:
    if isinstance(event, PreparedConversion):
        return Rejection(Reason.VALUE_OUT_OF_RANGE, f"value {event.value!r} is outside [0, {campaign.reward.max:g}]")
    bounds = RewardBounds.of(campaign)
    if event.decision_id is not None:  # a conversion read as an aggregate: one decision's reward, within the total
        return Rejection(
            Reason.VALUE_OUT_OF_RANGE,
            f"value {event.value!r} is more than one decision's reward "
            f"({bounds.per_decision:g}) or would take the reward credited past {bounds.total:g}",
        )
    detail = (f"value {event.value!r} is more than this campaign's decisions could have produced "
              f"({bounds.per_decision:g} per decision made so far) or would take the reward it credited past "
              f"{bounds.total:g}")  # fmt: skip
    return Rejection(Reason.VALUE_OUT_OF_RANGE, detail)


def _refusal(campaign: Campaign, reason: DecisionStatus) -> Rejection:
    """The rejection of an event the store refused because its campaign is paused or archived."""
    if reason is DecisionStatus.ARCHIVED:
        return _archived(campaign)
    return Rejection(Reason.CAMPAIGN_PAUSED, f"campaign {campaign.id!r} is paused")


def _archived(campaign: Campaign) -> Rejection:
    return Rejection(
        Reason.CAMPAIGN_ARCHIVED, f"campaign {campaign.id!r} is archived and its feedback_until has passed"
    )


def _names_new_arm(campaign: Campaign, events: Sequence[tuple[int, Item]]) -> bool:
    """Whether a conversion names an arm past ``campaign``'s arms: one added since this copy was read."""
    arms = len(campaign.arms)
    return any(isinstance(event, Conversion) and event.arm >= arms for _, event in events)


class BatchIngest:
    """A /feedback batch: each event validated on its own (one bad event never rejects its neighbours),
    each campaign looked up once, then each campaign's events applied through ``Ingest``."""

    def __init__(
        self,
        ingest: Ingest,
        signer: TokenSigner,
        clock: Clock,
        campaigns: CampaignDirectory,
        durable: Callable[[], Awaitable[None]],
    ) -> None:
        self.ingest = ingest
        self.signer = signer
        self.clock = clock
        self.campaigns = campaigns
        self._durable = durable  # the engine's: the embedded mode makes each write durable before answering

    async def feedback(self, events: list[Any], served: Callable[[str], bool] | None = None) -> FeedbackResult:
        """Apply a batch sent with a key that serves the campaigns ``served`` accepts (None: every one).
        Raises StoreUnavailable (the caller answers 503) when the store cannot be reached; events already
        applied are recognised as duplicates when the client retries."""
        result = FeedbackResult()
        now = self.clock()
        skew, verifier = self.ingest.max_skew, BatchVerifier(self.signer)
        by_campaign: dict[str, list[tuple[int, Item]]] = defaultdict(list)
        refusals: dict[str, Rejection | None] = {}  # each campaign's, looked up once per batch
        lookups = 0
        for index, raw in enumerate(events):
            try:
                campaign_id, item = self._validate(raw, now, skew, verifier)
            except Rejection as rejection:
                result.reject(index, rejection)
                continue
            if campaign_id not in refusals:
                result.campaigns.append(campaign_id)
                uncached = not self.campaigns.knows(campaign_id)
                if served is not None and not served(campaign_id):  # not looked up: nothing said of others' campaigns
                    refusals[campaign_id] = Rejection(Reason.FORBIDDEN_CAMPAIGN, not_served(campaign_id))
                elif uncached and lookups >= LOOKUPS_PER_BATCH:
                    refusals[campaign_id] = Rejection(
                        Reason.UNKNOWN_CAMPAIGN, f"more than {LOOKUPS_PER_BATCH} campaigns this worker has not "
                        "seen yet in one batch: send this event again (the ones looked up are known now)",
                    )  # fmt: skip
                else:
                    lookups += uncached
                    refusals[campaign_id] = await self._unknown_campaign(campaign_id)
            refusal = refusals[campaign_id]
            if refusal is not None:
                result.reject(index, refusal)
                continue
            by_campaign[campaign_id].append((index, item))
        for campaign_id, conversions in by_campaign.items():
            await self._apply(result, campaign_id, conversions, now)
        await self._durable()
        return result

    async def _apply(
        self, result: FeedbackResult, campaign_id: str, events: Sequence[tuple[int, Item]], now: int
    ) -> None:
        """One campaign's events; when the store answers that its policy version moved (a policy change) or
        that it has no such campaign, those left are applied again against the reloaded campaign (an archived
        one rejects them; a campaign the store lost is a 503 until it is rebuilt)."""
        for attempt in range(MAX_MOVES):
            try:
                campaign = await self.campaigns.campaign(campaign_id, fresh=attempt > 0)
                if attempt == 0 and _names_new_arm(campaign, events):  # added on another worker since it was cached
                    campaign = await self.campaigns.campaign(campaign_id, fresh=True)
            except UnknownCampaign as unknown:  # known to this worker a moment ago, so the store lost it
                raise lost_campaign(campaign_id) from unknown
            events = await self.ingest.apply(campaign, events, now, result)
            if not events:
                return
        raise StoreUnavailable(f"campaign {campaign_id!r} changed policy {MAX_MOVES} times during one request")

    def _validate(self, raw: Any, now: int, skew: int, verifier: BatchVerifier) -> tuple[str, Item]:
        """The event's campaign and the event: a verified conversion, or an aggregate or watermark (whose
        fields are checked against the campaign's policy, which may change before it is applied)."""
        if type(raw) is not dict or raw.get("type") != "conversion":  # the common case's checks first
            named = campaign_of(raw)
            if named is not None:
                return named, raw
        conversion: Conversion = parse_conversion(raw, verifier, now, skew)
        return conversion.campaign, conversion

    async def _unknown_campaign(self, campaign_id: str) -> Rejection | None:
        """The refusal of events for a campaign no store or history knows; None when it is known."""
        try:
            await self.campaigns.campaign(campaign_id)
        except UnknownCampaign:
            return Rejection(Reason.UNKNOWN_CAMPAIGN, f"no campaign {campaign_id!r}")
        return None
