"""The decision engine: /choose, the campaigns' lifecycle and the state object, independent of HTTP.

It is composed of a worker's view of its campaigns (engine/directory.py), how arms are chosen from a
campaign's statistics (engine/choosing.py), the feedback ingest (engine/ingest.py) and the description of
state (engine/describe.py). It records decisions through a group commit (service/latebandit/group_commit.py), with an
injected clock and RNG. Replays and rebuilds choose nothing: they record the logged
decisions and apply the logged feedback through the same ingest and store semantics, and describe the
result with the same code (replay/apply.py), so a replay of the log applies exactly the live rules.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from latebandit import metrics
from latebandit.audit.records import Record
from latebandit.audit.spool import Spool, SpoolFull
from latebandit.campaign import Campaign, CampaignSpec, CampaignStatus, PolicyChange
from latebandit.engine.choosing import Chooser
from latebandit.engine.contextual import (
    ContextualChoice,
    Offer,
    OfferInvalid,
    PreparedModels,
    choose_offers,
    decision_fields,
    fallback_choice,
    matured_cells,
    model_state,
)
from latebandit.engine.describe import describe_state
from latebandit.engine.directory import MAX_MOVES, CampaignArchived, CampaignDirectory, UnknownCampaign
from latebandit.engine.exposure import bucket_moments
from latebandit.engine.ingest import BatchIngest, Ingest
from latebandit.engine.scheduling import UNSETTLED, Scheduler, describe_schedule, unclaimed
from latebandit.group_commit import GroupCommit
from latebandit.store.base import (
    CampaignMoved,
    DecisionResult,
    DecisionStatus,
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
DecisionRequest = tuple[Campaign, str | None, Offer | None]  # what a /choose hands the group commit


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
        self.chooser = Chooser(store, rng, options.snapshot_interval, GROUP_LIMIT)
        self.planner = self.chooser.planner
        self.scheduler = Scheduler(store, rng, self._pull)
        self._decisions = GroupCommit(self._decide_together, GROUP_LIMIT)
        self._claims = GroupCommit(self._claim_together, GROUP_LIMIT)
        self._unreadable_reported: dict[str, int] = {}  # per campaign, when its unreadable state was last logged
        self._model_published: dict[str, tuple[int, int]] = {}  # per contextual campaign, the (policy, read) shown
        self._models = PreparedModels()  # per contextual campaign, its policy's model at a state version

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
        self.chooser.forget(campaign_id)
        self._models.forget(campaign_id)
        self._model_published.pop(campaign_id, None)
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

    async def change_arms(
        self, campaign_id: str, added: list[str], retired: list[str], restart: bool = False
    ) -> Campaign:
        """Add and retire arms (Campaign.with_arms: ArmsRefused if the campaign cannot take the change). Its
        statistics stay, unless ``restart`` starts the next policy version with a fresh state, as a policy
        change does (what a policy that plays a schedule over its arms needs). CampaignMoved if another change
        won the race; CampaignArchived if the campaign is archived, which takes no change. Workers holding the
        earlier arm set learn of it when the store refuses their next decision (MOVED) or a conversion names an
        arm they do not know (engine/ingest.py)."""
        current = _changeable(campaign_id, await self.campaigns.campaign(campaign_id, fresh=True))
        campaign = current.with_arms(added, retired, restart)
        record: Record = {"type": "campaign", "campaign": campaign_id, "at": self.clock(), "action": "arms",
                          "config": {"added": added, "retired": retired, "restart": restart}}  # fmt: skip
        if campaign.version != current.version:
            changed = await self.store.change_policy(campaign, record, arms_before=current.arms_version)
        else:
            changed = await self.store.change_arms(campaign, record)
        changed = _changeable(campaign_id, changed)  # archived meanwhile: the store changed nothing
        await self._durable()
        self.campaigns.remember(changed)
        return changed

    # decisions ------------------------------------------------------------------------------------

    async def choose(self, campaign_id: str, request_id: str | None = None, offer: Offer | None = None) -> Decision:
        """A decision is always answered while the campaign can be known: with the store down (or emptied)
        a worker that never cached the campaign reads its configuration from the audit log. ``offer``: a
        contextual campaign's actions or context (OfferInvalid unless it fits the campaign)."""
        now = self.clock()
        for attempt in range(MAX_MOVES):
            try:
                campaign = await self.campaigns.campaign(campaign_id, fresh=attempt > 0)
            except StoreUnavailable:
                known = await self.campaigns.while_store_down(campaign_id)
                if known is None:
                    raise
                return await self._store_down(known, now, request_id, _fitting(known, offer))
            if campaign.archived_at is not None:
                raise CampaignArchived(campaign_id)
            try:
                return await self._decide(campaign, now, request_id, _fitting(campaign, offer))
            except CampaignMoved:
                continue
            except StoreUnavailable:
                return await self._store_down(campaign, now, request_id, offer)
        raise StoreUnavailable(f"campaign {campaign_id!r} changed policy {MAX_MOVES} times during one request")

    async def _store_down(self, campaign: Campaign, now: int, request_id: str | None, offer: Offer | None) -> Decision:
        """Nothing can be recorded in the store: the decision id alone marks the pull as uncounted, and its
        audit record waits in the spool (answered only once it is on disk there)."""
        metrics.STORE_ERRORS.labels("choose").inc()
        pull = self._fallback_pull(campaign, now, request_id, offer)
        if self.spool is not None:
            try:
                await self.spool.append(pull.record)
            except (SpoolFull, OSError) as error:
                raise StoreUnavailable(f"store unreachable and the decision cannot be audited: {error}") from error
        result = DecisionResult(DecisionStatus.NEW, pull.decision_id, pull.arm, 1.0, action=pull.action)
        return self._answer(campaign, result, "fallback_store_down")

    async def _decide(self, campaign: Campaign, now: int, request_id: str | None, offer: Offer | None) -> Decision:
        # one batch per configuration: the decisions of a batch are chosen among, and named by, one arm set
        key = (campaign.id, campaign.version, campaign.arms_version)
        try:
            if campaign.plays_schedule:
                claim = await self._claims.submit(key, (campaign, request_id))
                if claim.status is ClaimStatus.UNREADABLE:
                    raise StateUnreadable(campaign.id, "its schedule, to plan")
                if claim.status in UNSETTLED:
                    raise unclaimed(campaign)
                status = DecisionStatus(claim.status.value)
                result = DecisionResult(status, claim.decision_id, claim.arm, claim.propensity)
            else:
                result = await self._decisions.submit(key, (campaign, request_id, offer))
        except StateUnreadable as unreadable:
            self._report_unreadable(unreadable, now)
            result, outcome = await self._fallback(campaign, now, request_id, offer), "fallback_unreadable"
        else:
            if result.status in (DecisionStatus.MOVED, DecisionStatus.ARCHIVED):  # reloaded: a change, or archived
                raise CampaignMoved(campaign.id)
            if result.status is DecisionStatus.UNKNOWN:
                raise await self.campaigns.refused_unknown(campaign.id)
            outcome = result.status.value
            if result.status is DecisionStatus.PAUSED:
                result, outcome = await self._fallback(campaign, now, request_id, offer), "fallback_paused"
        try:
            await self._durable()
        except StoreUnavailable:  # recorded and queued: the audit catches up; never answer a second decision
            metrics.STORE_ERRORS.labels("choose_audit").inc()
        return self._answer(campaign, result, outcome)

    async def _fallback(
        self, campaign: Campaign, now: int, request_id: str | None, offer: Offer | None
    ) -> DecisionResult:
        """The default arm, recorded as a fallback (its pull never counts), for a campaign that cannot decide."""
        fallback = self._fallback_pull(campaign, now, request_id, offer)
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
        self, key: tuple[str, int, int], requests: list[DecisionRequest]
    ) -> list[DecisionResult]:
        """The decisions of one group commit, taken at the batch's time from the same statistics (engine/choosing.py
        picks their arms, each its own draw; engine/contextual.py a contextual campaign's, in turn) and recorded
        by one store call. Once a lone decision is answered, the next one's choice is made ready from the
        statistics then held; a lone contextual decision's successor model is prepared sooner, while the store
        records it (the callback runs once this coroutine waits for the store's reply, or right after a store
        that does not wait), and serves once the store counted the decision."""
        campaign = requests[0][0]
        request_ids = [request_id for _, request_id, _ in requests]
        now = self.clock()
        state = await self.store.snapshot(campaign, self.options.snapshot_interval)
        if campaign.contextual:
            pulls = await self._contextual_pulls(campaign, state, now, requests)
            if len(pulls) == 1:  # its successor model, prepared while the store records it (the worker waits)
                asyncio.get_running_loop().call_soon(self._models.follow, campaign, state.version, pulls[0])
        else:
            chosen = await self.chooser.choose(campaign, state, now, len(requests))
            pulls = [
                self._pull(campaign, arm, propensity, now, request_id)
                for (arm, propensity), request_id in zip(chosen, request_ids, strict=True)
            ]
        results = await self.store.record_decisions(campaign, pulls, request_ids, math.ceil(self.options.request_ttl))
        if campaign.contextual and len(pulls) == 1 and results[0].status is DecisionStatus.NEW:
            self._models.counted(campaign.id, pulls[0].decision_id)
        if len(requests) == 1 and results[0].status in ANSWERED:
            asyncio.get_running_loop().call_soon(self._answered, key, campaign)  # after the answer is sent
        return results

    async def _contextual_pulls(
        self, campaign: Campaign, state: StateSnapshot, now: int, requests: list[DecisionRequest]
    ) -> list[Pull]:
        """A contextual campaign's decisions of one group, each chosen among its own offer from the policy's
        model of ``state``: the one kept for its version, else prepared now, when the cells that left the
        window are folded away (the next read no longer carries them) and the read's gauges published."""
        model = self._models.kept(campaign.id, state.version)
        if model is None:
            matured = matured_cells(campaign, state, now)
            if matured.any():
                hist = state.histogram
                await self.store.fold_matured(campaign, hist.arm[matured], hist.bucket[matured])
            model = self._models.prepare(campaign, state, now)  # first: the gauges then read the V⁻¹ it computed
            self._publish_model(campaign, state, now)
        offers = [offer for _, _, offer in requests if offer is not None]  # all: _fitting checked each request
        chosen = choose_offers(campaign, model, offers, self.rng)
        return [
            self._pull(campaign, choice.block, choice.propensity, now, request_id, contextual=(offer, choice))
            for (_, request_id, _), offer, choice in zip(requests, offers, chosen, strict=True)
        ]

    def _publish_model(self, campaign: Campaign, state: StateSnapshot, now: int) -> None:
        """The model gauges of a snapshot read the campaign has not shown yet: an operator watches a serving
        campaign without asking GET /state, and a read (at most one per ``snapshot_interval``), not every
        decision, pays the d×d solves per block."""
        if state.version is None:
            return
        read = (state.version.policy, state.version.read)
        if self._model_published.get(campaign.id) != read:
            self._model_published[campaign.id] = read
            metrics.publish_model(campaign.id, model_state(campaign, state, now))

    def _answered(self, key: tuple[str, int, int], campaign: Campaign) -> None:
        """The next decision made ready from the statistics held now: an arm campaign's next choice, a contextual
        campaign's prepared model. Not while a decision of the campaign is queued or being recorded: the
        statistics held lack its pull, so what they would make ready could not serve the next request (that
        decision's answer prepares it)."""
        if self._decisions.busy(key):
            return
        if campaign.contextual:
            self._models.prepare_next(campaign, self.store.held(campaign, self.options.snapshot_interval), self.clock())
        else:
            self.chooser.prepare_next(campaign)

    async def _claim_together(
        self, _: tuple[str, int, int], requests: list[tuple[Campaign, str | None]]
    ) -> list[Claim]:
        """The slot claims of one group commit (a planning campaign), made at the batch's time."""
        request_ids = [request_id for _, request_id in requests]
        return await self.scheduler.claim_together(
            requests[0][0], self.clock(), request_ids, math.ceil(self.options.request_ttl)
        )

    def _pull(
        self,
        campaign: Campaign,
        arm: int,
        propensity: float,
        now: int,
        request_id: str | None,
        fallback: bool = False,
        contextual: tuple[Offer, ContextualChoice] | None = None,
    ) -> Pull:
        """A decision to record: its signed id, where it falls in the histogram, and its audit record. A
        fallback's id marks its pull as uncounted, so a later conversion of it never enters S
        (docs/design-notes.md, "Decision ids"). A contextual decision also carries its offer and choice: the
        features its conversion will add to b, its footprint, the action id an actions campaign answers."""
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
        if contextual is None:
            return Pull(arm, bucket, offset, moments, decision_id, propensity, record)
        offer, choice = contextual
        record["arm"] = choice.label
        record |= decision_fields(campaign, offer, choice.features, choice.footprint)
        action = choice.label if offer.labels is not None else None
        return Pull(
            arm, bucket, offset, moments, decision_id, propensity, record, choice.features, choice.footprint, action
        )

    def _fallback_pull(self, campaign: Campaign, now: int, request_id: str | None, offer: Offer | None) -> Pull:
        """The fallback decision: the default arm (a contextual campaign's, with the offer's features:
        engine/contextual.py's ``fallback_choice``)."""
        if offer is None:
            default = campaign.arm_index[campaign.default_arm or campaign.arms[0]]
            return self._pull(campaign, default, 1.0, now, request_id, fallback=True)
        choice = fallback_choice(campaign, offer)
        return self._pull(campaign, choice.block, 1.0, now, request_id, fallback=True, contextual=(offer, choice))

    def _answer(self, campaign: Campaign, result: DecisionResult, outcome: str) -> Decision:
        """The answer names the arm, or an actions campaign's chosen action; its metrics count the arm (the
        model's one block for an actions campaign: action ids are the client's, unbounded in number)."""
        arm = campaign.arms[result.arm]
        fallback = outcome.startswith("fallback") or (
            result.status is DecisionStatus.REPEATED and self.signer.verify(result.decision_id).fallback
        )
        metrics.decision_counter(campaign.id, arm, outcome).inc()
        named = result.action if result.action is not None else arm
        return Decision(result.decision_id, campaign.id, named, campaign.policy.name, result.propensity, fallback)

    def publish_diagnostics(self) -> None:
        """The per-arm gauges of the histogram reads since the last call (Chooser.publish_diagnostics)."""
        self.chooser.publish_diagnostics()

    # state ----------------------------------------------------------------------------------------

    async def state(self, campaign_id: str, at: int | None = None) -> dict[str, Any]:
        """The state object now (or at the future time ``at``); read again if the arms change meanwhile."""
        for _ in range(MAX_MOVES):
            try:
                campaign = _changeable(campaign_id, await self.campaigns.campaign(campaign_id, fresh=True))
                return await self._state(campaign, at)
            except CampaignMoved:
                continue
        raise StoreUnavailable(f"campaign {campaign_id!r} changed {MAX_MOVES} times during one request")

    async def _state(self, campaign: Campaign, at: int | None) -> dict[str, Any]:
        as_of = self.clock() if at is None else at
        if campaign.plays_schedule:
            snapshot, view = await self.store.snapshot(campaign, 0.0), await self.store.schedule_view(campaign)
            return describe_schedule(campaign, snapshot.counters, view, as_of)
        body = describe_state(campaign, await self.store.snapshot(campaign, 0.0), as_of)
        if campaign.contextual:
            metrics.publish_model(campaign.id, body["model"])
            return body
        planned = self.planner.planned(campaign)
        if planned is not None or self.planner.solves_for(campaign):
            body["policy_state"]["plan"] = planned.plan_state() if planned is not None else {"status": "solving"}
        self.chooser.unpublished(campaign.id)  # an older read: a later scrape must not publish it over this
        metrics.publish_arms(campaign.id, body["arms"])
        metrics.publish_delays(campaign.id, {arm: row["delays"] for arm, row in body["arms"].items()})
        return body

    async def _durable(self) -> None:
        if self._after_write is not None:
            await self._after_write()


def _fitting(campaign: Campaign, offer: Offer | None) -> Offer | None:
    """``offer`` if it fits the campaign (OfferInvalid if not, or if a contextual campaign is offered none)."""
    if offer is None:
        if campaign.contextual:
            field = "actions" if campaign.offers == "actions" else "context"
            raise OfferInvalid(field, f"campaign {campaign.id!r} is contextual: its requests give {field}")
        return None
    offer.check(campaign)
    return offer


def _changeable(campaign_id: str, campaign: Campaign | None) -> Campaign:
    """``campaign`` as the store answered a change or a read of it: UnknownCampaign if none, CampaignArchived
    if archived (its state is going; GET /state?at= replays its past from the audit log)."""
    if campaign is None:
        raise UnknownCampaign(campaign_id)
    if campaign.archived_at is not None:
        raise CampaignArchived(campaign_id)
    return campaign
