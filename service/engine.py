"""The decision engine: /choose, /feedback and the state object, independent of HTTP.

The API, replays and rebuilds all go through this one class, with an injected clock and RNG, so the
live service and a replay of its log apply exactly the same rules.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service import metrics
from service.audit.records import Outcome, Record
from service.campaign import Campaign, CampaignSpec, CampaignStatus
from service.exposure import Exposure, bucket_moments, exposure
from service.feedback import Conversion, Reason, Rejection, campaign_of, parse_conversion, prepare
from service.policies.base import EPS_N, ArmStats
from service.store.base import (
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
from service.timeutil import MICROS, Clock, format_time
from service.tokens import DecisionToken, TokenSigner, new_nonce


class UnknownCampaign(LookupError):
    pass


class CampaignExists(ValueError):
    pass


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
    ) -> None:
        self.store = store
        self.signer = signer
        self.clock = clock
        self.rng = rng
        self.options = options
        self._after_write = after_write  # the embedded mode makes each write durable before answering
        # The campaign as the audit log knows it: the store may have lost it, or be unreachable.
        self._from_history = from_history
        self._campaigns: dict[str, Campaign] = {}
        self._exposures: dict[str, tuple[Histogram, Exposure]] = {}

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
        self._campaigns[campaign.id] = campaign
        return campaign

    async def campaign(self, campaign_id: str, fresh: bool = False) -> Campaign:
        """The campaign's configuration; cached per worker (only the status changes, and the store's
        scripts check the status themselves)."""
        campaign = None if fresh else self._campaigns.get(campaign_id)
        if campaign is None:
            campaign = await self.store.get_campaign(campaign_id)
            if campaign is None:
                if await self._remembered(campaign_id) is not None:
                    raise lost_campaign(campaign_id)  # the same answer on every worker: retry after rebuild
                raise UnknownCampaign(campaign_id)
            self._campaigns[campaign_id] = campaign
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
        self._campaigns[campaign_id] = campaign
        return campaign

    # decisions ------------------------------------------------------------------------------------

    async def choose(self, campaign_id: str, request_id: str | None = None) -> Decision:
        """A decision is always answered while the campaign can be known: with the store down (or emptied)
        a worker that never cached the campaign reads its configuration from the audit log."""
        now = self.clock()
        try:
            campaign = await self.campaign(campaign_id)
        except StoreUnavailable:
            campaign = await self._remembered(campaign_id)
            if campaign is None:
                raise
            self._campaigns[campaign_id] = campaign
            return self._store_down(campaign, now)
        try:
            return await self._decide(campaign, now, request_id)
        except StoreUnavailable:
            return self._store_down(campaign, now)

    def _store_down(self, campaign: Campaign, now: int) -> Decision:
        """Nothing can be recorded: the decision id alone marks the pull as uncounted."""
        metrics.STORE_ERRORS.labels("choose").inc()
        pull = self._pull(campaign, self._default_arm(campaign), 1.0, now, None, fallback=True)
        return self._answer(campaign, DecisionResult(DecisionStatus.NEW, pull.decision_id, pull.arm, 1.0),
                            "fallback_store_down")  # fmt: skip

    async def _decide(self, campaign: Campaign, now: int, request_id: str | None) -> Decision:
        state = await self.store.snapshot(campaign, self.options.snapshot_interval)
        stats = await self._stats(campaign, state, now)
        choice = campaign.policy_impl.choose(stats, self.rng)
        pull = self._pull(campaign, int(choice.arm[0]), float(choice.propensity[0]), now, request_id)
        ttl = math.ceil(self.options.request_ttl)
        result = await self.store.record_decision(campaign, pull, request_id, ttl)
        if result.status is DecisionStatus.UNKNOWN:
            raise lost_campaign(campaign.id)
        outcome = result.status.value
        if result.status is DecisionStatus.PAUSED:
            fallback = self._pull(campaign, self._default_arm(campaign), 1.0, now, request_id, fallback=True)
            result, outcome = await self.store.record_fallback(campaign, fallback, request_id, ttl), "fallback_paused"
        try:
            await self._durable()
        except StoreUnavailable:  # recorded and queued: the audit catches up; never answer a second decision
            metrics.STORE_ERRORS.labels("choose_audit").inc()
        return self._answer(campaign, result, outcome)

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
        metrics.publish_arms(campaign.id, arm_rows(campaign, state, seen))
        if seen.matured_cells.any():
            hist = state.histogram
            await self.store.fold_matured(campaign, hist.arm[seen.matured_cells], hist.bucket[seen.matured_cells])
        return arm_stats(state, seen)

    # feedback -------------------------------------------------------------------------------------

    async def feedback(self, events: list[Any]) -> FeedbackResult:
        """Apply a batch. Raises StoreUnavailable (the caller answers 503) when the store cannot be
        reached; events already applied are recognised as duplicates when the client retries."""
        result = FeedbackResult()
        now = self.clock()
        by_campaign: dict[str, list[tuple[int, PreparedConversion]]] = defaultdict(list)
        for index, raw in enumerate(events):
            try:
                campaign, prepared = await self._validate(raw, now)
            except Rejection as rejection:
                result.reject(index, rejection)
                continue
            by_campaign[campaign.id].append((index, prepared))
        for campaign_id, items in by_campaign.items():
            campaign = await self.campaign(campaign_id)
            try:
                outcomes = await self.store.apply_conversions(campaign, [prepared for _, prepared in items])
            except CampaignRefused as refused:
                if str(refused) == "unknown":  # known to this worker, so the store lost it: retry later
                    raise lost_campaign(campaign_id) from refused
                applied = len(refused.applied)
                self._tally(result, campaign, items[:applied], refused.applied)
                for index, _ in items[applied:]:
                    result.reject(index, Rejection(Reason.CAMPAIGN_PAUSED, f"campaign {campaign_id!r} is paused"))
                continue
            self._tally(result, campaign, items, outcomes)
        await self._durable()
        return result

    async def _validate(self, raw: Any, now: int) -> tuple[Campaign, PreparedConversion]:
        skew = round(self.options.max_skew * MICROS)
        named = campaign_of(raw)
        if named is not None:
            campaign = await self._known(named)
            raise Rejection(
                Reason.WRONG_FEEDBACK_KIND,
                f"policy {campaign.policy.name!r} learns from attributed conversions, not {raw['type']} events",
            )
        conversion: Conversion = parse_conversion(raw, self.signer, now, skew)
        campaign = await self._known(conversion.campaign)
        return campaign, prepare(campaign, conversion, now, self.options.dedup_retention)

    async def _known(self, campaign_id: str) -> Campaign:
        try:
            return await self.campaign(campaign_id)
        except UnknownCampaign as error:
            raise Rejection(Reason.UNKNOWN_CAMPAIGN, f"no campaign {campaign_id!r}") from error

    @staticmethod
    def _tally(
        result: FeedbackResult, campaign: Campaign, items: list[tuple[int, PreparedConversion]], outcomes: list[Outcome]
    ) -> None:
        label = metrics.campaign_label(campaign.id)
        delays = metrics.CONVERSION_DELAY.labels(label)
        tally = Counter(outcomes)
        for (_, prepared), outcome in zip(items, outcomes, strict=True):
            if outcome is not Outcome.DUPLICATE:
                delays.observe(max(0, prepared.record["occurred_at"] - prepared.record["decided_at"]) / MICROS)
        for outcome, count in tally.items():
            metrics.FEEDBACK.labels(label, outcome.value).inc(count)
        result.duplicates += tally[Outcome.DUPLICATE]
        result.accepted += len(outcomes) - tally[Outcome.DUPLICATE]
        result.censored += tally[Outcome.CENSORED]

    # state ----------------------------------------------------------------------------------------

    async def state(self, campaign_id: str, at: int | None = None) -> dict[str, Any]:
        campaign = await self.campaign(campaign_id, fresh=True)
        as_of = self.clock() if at is None else at
        body = describe_state(campaign, await self.store.snapshot(campaign, 0.0), as_of)
        metrics.publish_arms(campaign.id, body["arms"])
        return body

    async def _durable(self) -> None:
        if self._after_write is not None:
            await self._after_write()


def arm_stats(state: StateSnapshot, seen: Exposure) -> ArmStats:
    """One campaign's statistics as the policies take them: a batch of one run, t = decisions + 1."""
    counters = state.counters
    return ArmStats(
        pulls=counters.pulls[None, :].astype(np.float64),
        conversions=counters.conversions[None, :],
        effective=seen.effective[None, :],
        t=np.array([counters.decisions + 1]),
    )


def _number(value: float) -> float | None:
    return None if not math.isfinite(value) else float(value)


def describe_state(campaign: Campaign, state: StateSnapshot, as_of: int) -> dict[str, Any]:
    """The CONTRACT.md ``state`` object, computed the same way for the live service and for replays."""
    return {
        "campaign": campaign.id,
        "policy": campaign.policy.name,
        "decisions": int(state.counters.decisions),
        "as_of": format_time(as_of),
        "arms": arm_rows(campaign, state, exposure(campaign, state, as_of)),
        "policy_state": {
            "status": campaign.status.value,
            "window": campaign.window,
            "bucket_width": campaign.bucket_width_us / MICROS,
        },
    }


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
