"""The embedded state store: everything in process memory, for one process (``latebandit serve`` with no
Redis, replays, rebuilds and tests).

Every method runs to completion without awaiting, so on one event loop each is atomic, as the Redis
store's Lua scripts are. The semantics mirror store/lua/*.lua line for line; the same contract tests run
against both stores.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from latebandit.audit.queue import QueueEntry
from latebandit.audit.records import Outcome, Record
from latebandit.campaign import Campaign, CampaignStatus
from latebandit.delays.tail import BUCKETS
from latebandit.policies.schedule import Plan
from latebandit.store.base import (
    AnonymousEvent,
    CampaignMoved,
    CampaignRefused,
    Counters,
    DecisionResult,
    DecisionStatus,
    Histogram,
    LinearSums,
    PreparedConversion,
    Pull,
    StateSnapshot,
    StateVersion,
    features_field,
)
from latebandit.store.schedule import (
    Claim,
    ClaimStatus,
    RewardBounds,
    ScheduleBook,
    ScheduleView,
    Uncredited,
    next_slot,
)
from latebandit.timeutil import MICROS

_SWEEP_MINIMUM = 1024
# The outcomes of anonymous events that are audited: those that change nothing but may matter (recorded)
AUDITED_ANONYMOUS = (Outcome.COUNTED, Outcome.PHASE_CLOSED, Outcome.REPEAT, Outcome.STALE)
# A value of ``CampaignMemory.expiring``: True for a dedup entry (``ev:``, ``cv:``), except, on a ``sum``
# campaign, a float for the ``cv:`` entry of a decision whose first conversion counted: the reward credited to
# it so far (value units); for a ``req:`` key the decision that request id got, (decision id, arm, propensity,
# action id or None); for an ``ft:`` key a contextual decision's features, kept for its conversion.
Remembered = bool | float | tuple[str, int, float, str | None] | np.ndarray


@dataclass
class Cell:
    count: int = 0
    offset: int = 0
    converted: int = 0
    moments: list[float] = field(default_factory=list)
    footprint: float = 0.0  # Σ of its contextual decisions' footprints


@dataclass
class CampaignMemory:
    campaign: Campaign
    counters: Counters
    delays: np.ndarray  # (K, delay_tail.BUCKETS) observed delays; zeros at creation
    cells: dict[tuple[int, int], Cell] = field(default_factory=dict)
    expiring: dict[str, tuple[int, Remembered]] = field(default_factory=dict)  # key -> (expiry in s, value)
    audit: dict[str, list[Record]] = field(default_factory=dict)
    sweep_at: int = 1024  # expired keys are dropped when ``expiring`` reaches this size (amortised O(1))
    histogram: Histogram | None = None  # the cells as arrays, built at ``histogram_at`` (µs)
    histogram_at: int = 0
    histogram_read: int = 0  # which build of the arrays it is (StateVersion.read)
    stamp: int = 0  # counts the writes other than decisions: counted conversions, folds (StateVersion.stamp)
    schedule: ScheduleBook = field(default_factory=ScheduleBook)  # planning policies only
    model: LinearSums | None = None  # contextual campaigns only

    def __post_init__(self) -> None:
        if self.model is None:
            self.model = fresh_model(self.campaign)


def fresh_model(campaign: Campaign) -> LinearSums | None:
    """A contextual campaign's model before any decision (None for another campaign)."""
    return LinearSums.zeros(len(campaign.arms), int(campaign.features or 0)) if campaign.contextual else None


class MemoryStore:
    def __init__(self, clock: Callable[[], int], keep_audit: bool = True) -> None:
        self._clock = clock
        self._keep_audit = keep_audit  # replays re-apply logged events and must not queue them again
        self._campaigns: dict[str, CampaignMemory] = {}
        self._archived: dict[str, Campaign] = {}  # kept after their state is purged, as Redis's archived registry
        self._last_entry = (0, 0)
        self._reads = itertools.count(1)  # numbers the histogram builds, as the Redis store numbers its reads

    async def ping(self) -> None:
        return None

    # campaigns ------------------------------------------------------------------------------------

    async def create_campaign(self, campaign: Campaign, record: Record) -> bool:
        if campaign.id in self._campaigns or campaign.id in self._archived:
            return False
        arms = len(campaign.arms)
        memory = CampaignMemory(campaign, Counters.zeros(arms), np.zeros((arms, BUCKETS), dtype=np.int64))
        self._campaigns[campaign.id] = memory
        self._queue(memory, [record])
        return True

    async def get_campaign(self, campaign_id: str) -> Campaign | None:
        memory = self._campaigns.get(campaign_id)
        return memory.campaign if memory else self._archived.get(campaign_id)

    async def list_campaigns(self) -> list[str]:
        return sorted(name for name, memory in self._campaigns.items() if memory.campaign.archived_at is None)

    async def list_archived(self) -> list[str]:
        return sorted(self._archived)

    async def set_status(self, campaign_id: str, status: CampaignStatus, record: Record) -> Campaign | None:
        memory = self._campaigns.get(campaign_id)
        if memory is None or memory.campaign.archived_at is not None:
            return await self.get_campaign(campaign_id)
        memory.campaign = memory.campaign.model_copy(update={"status": status})
        self._queue(memory, [record])
        return memory.campaign

    async def change_policy(
        self, campaign: Campaign, record: Record, arms_before: int | None = None
    ) -> Campaign | None:
        memory = self._campaigns.get(campaign.id)
        if memory is None:
            return None
        before = campaign.arms_version if arms_before is None else arms_before
        if memory.campaign.version + 1 != campaign.version or memory.campaign.arms_version != before:
            raise CampaignMoved(campaign.id)
        if memory.campaign.archived_at is not None:
            return memory.campaign
        memory.campaign = campaign.model_copy(update={"status": memory.campaign.status})
        memory.counters = Counters.zeros(len(campaign.arms))
        memory.delays = _grown(memory.delays, len(campaign.arms))
        memory.cells, memory.histogram, memory.schedule = {}, None, ScheduleBook()
        memory.model = fresh_model(campaign)  # a contextual policy's model starts afresh with the version
        self._queue(memory, [record])
        return memory.campaign

    async def archive(self, campaign: Campaign, record: Record) -> Campaign | None:
        memory = self._campaigns.get(campaign.id)
        if memory is None or memory.campaign.archived_at is not None:
            return await self.get_campaign(campaign.id)
        assert campaign.archived_at is not None
        memory.campaign = self._archived[campaign.id] = memory.campaign.archived(campaign.archived_at)
        self._queue(memory, [record])
        return memory.campaign

    async def purge_archived(self, now: int) -> list[str]:
        purged = [
            name for name, memory in self._campaigns.items()
            if (until := memory.campaign.feedback_until) is not None and until < now and not memory.audit
        ]  # fmt: skip
        for name in purged:
            del self._campaigns[name]
        return purged

    async def change_arms(self, campaign: Campaign, record: Record) -> Campaign | None:
        memory = self._campaigns.get(campaign.id)
        if memory is None:
            return None
        stored = memory.campaign
        if stored.archived_at is not None:
            return stored
        if (stored.version, stored.arms_version + 1) != (campaign.version, campaign.arms_version):
            raise CampaignMoved(campaign.id)
        memory.campaign = campaign.model_copy(update={"status": stored.status})
        arms, counters = len(campaign.arms), memory.counters
        grown = Counters.zeros(arms)
        grown.decisions = counters.decisions
        for mine, theirs in ((grown.pulls, counters.pulls), (grown.conversions, counters.conversions),
                             (grown.matured, counters.matured), (grown.counted, counters.counted)):  # fmt: skip
            mine[: len(theirs)] = theirs
        memory.counters, memory.delays = grown, _grown(memory.delays, arms)
        if memory.model is not None:  # a context campaign: its added arms are new, empty model blocks
            memory.model = memory.model.with_blocks(arms)
        memory.histogram, memory.stamp = None, memory.stamp + 1  # a new read: statistics of another arm set
        self._queue(memory, [record])
        return memory.campaign

    # state ----------------------------------------------------------------------------------------

    async def snapshot(self, campaign: Campaign, max_age: float = 0.0) -> StateSnapshot:
        """Counters are always fresh; with ``max_age`` > 0 the histogram arrays built at most that many
        seconds ago are reused, as the Redis store does, so /choose costs O(K) and not O(K·B); with 0 they are
        built now (a replay's clock may stand still while cells change)."""
        memory = self._campaigns[campaign.id]
        if memory.campaign.arms_version != campaign.arms_version:
            raise CampaignMoved(campaign.id)  # the caller's arms are not the stored ones: it reloads the campaign
        now = self._clock()
        if max_age <= 0 or memory.histogram is None or now - memory.histogram_at > max_age * MICROS:
            memory.histogram, memory.histogram_at = self._histogram(memory), now
            memory.histogram_read = next(self._reads)
        counters = memory.counters.copy()
        version = StateVersion(campaign.version, memory.histogram_read, b"%d" % memory.stamp, counters.decisions)
        model = None if memory.model is None else LinearSums(memory.model.gram.copy(), memory.model.reward.copy())
        return StateSnapshot(counters, memory.histogram, memory.delays.copy(), version, model)

    def held(self, campaign: Campaign, max_age: float) -> StateSnapshot | None:
        """None: every snapshot copies the counters, so none is held."""
        return None

    @staticmethod
    def _histogram(memory: CampaignMemory) -> Histogram:
        cells = list(memory.cells.items())
        components = len(memory.campaign.exact_components)
        if not cells:
            return Histogram.empty(components)
        keys = np.array([key for key, _ in cells], dtype=np.int64)
        return Histogram(
            arm=keys[:, 0],
            bucket=keys[:, 1],
            count=np.array([cell.count for _, cell in cells], dtype=np.int64),
            offset=np.array([cell.offset for _, cell in cells], dtype=np.int64),
            converted=np.array([cell.converted for _, cell in cells], dtype=np.int64),
            moments=np.array([cell.moments for _, cell in cells], dtype=np.float64).reshape(len(cells), components),
            footprint=np.array([cell.footprint for _, cell in cells], dtype=np.float64),
        )

    async def record_decision(self, campaign: Campaign, pull: Pull, request_id: str | None, ttl: int) -> DecisionResult:
        return self._record(campaign, pull, request_id, ttl)

    async def record_decisions(
        self, campaign: Campaign, pulls: Sequence[Pull], request_ids: Sequence[str | None], ttl: int
    ) -> list[DecisionResult]:
        return [self._record(campaign, pull, rid, ttl) for pull, rid in zip(pulls, request_ids, strict=True)]

    def _record(self, campaign: Campaign, pull: Pull, request_id: str | None, ttl: int) -> DecisionResult:
        memory = self._campaigns.get(campaign.id)
        earlier = None if memory is None else self._earlier(memory, request_id)
        if earlier is not None:
            return earlier
        refusal = _refusal(memory, campaign)
        if refusal is None and memory is not None and memory.campaign.arms_version != campaign.arms_version:
            refusal = DecisionStatus.MOVED  # chosen among another arm set (store/lua/record_decisions.lua)
        if refusal is not None:
            return DecisionResult(refusal)
        assert memory is not None
        counters = memory.counters
        counters.decisions += 1
        counters.pulls[pull.arm] += 1
        cell = memory.cells.setdefault((pull.arm, pull.bucket), Cell(moments=[0.0] * len(pull.moments)))
        cell.count += 1
        cell.offset += pull.offset
        cell.moments = [total + moment for total, moment in zip(cell.moments, pull.moments, strict=True)]
        if pull.features is not None and memory.model is not None:
            memory.model.gram[pull.arm] += np.outer(pull.features, pull.features)
            cell.footprint += pull.footprint
            kept = max(1, campaign.features_expire_at(pull.bucket) - self._clock() // MICROS)
            self._set(memory, _features_key(pull.bucket, pull.decision_id), pull.features, kept)
        self.remember_request(campaign, request_id, pull, ttl)
        self._queue(memory, [{**pull.record, "seq": counters.decisions}])
        return DecisionResult(
            DecisionStatus.NEW, pull.decision_id, pull.arm, pull.propensity, counters.copy(), pull.action
        )

    async def record_fallback(self, campaign: Campaign, pull: Pull, request_id: str | None, ttl: int) -> DecisionResult:
        memory = self._campaigns.get(campaign.id)
        if memory is None:  # lost since the caller read it: as the Redis script answers
            return DecisionResult(DecisionStatus.UNKNOWN)
        if memory.campaign.archived_at is not None:
            return DecisionResult(DecisionStatus.ARCHIVED)
        earlier = self._earlier(memory, request_id)
        if earlier is not None:
            return earlier
        self.remember_request(campaign, request_id, pull, ttl)
        self._queue(memory, [pull.record])
        return DecisionResult(DecisionStatus.NEW, pull.decision_id, pull.arm, pull.propensity, action=pull.action)

    async def apply_conversions(
        self, campaign: Campaign, events: list[PreparedConversion]
    ) -> list[Outcome | Uncredited]:
        memory = self._accepting_feedback(campaign, self._clock())
        outcomes: list[Outcome | Uncredited] = []
        recorded: list[Record] = []
        for event in events:
            outcome = self._classify(memory, event)
            outcomes.append(outcome)
            if isinstance(outcome, Outcome) and outcome is not Outcome.DUPLICATE:
                recorded.append({**event.record, "outcome": outcome.value})
        if recorded:
            self._queue(memory, recorded)
        return outcomes

    def _classify(self, memory: CampaignMemory, event: PreparedConversion) -> Outcome | Uncredited:
        reward = memory.campaign.reward
        if not 0.0 <= event.value <= reward.max:  # NaN too: S grows by at most max a decision, so it stays finite
            return Uncredited.VALUE_OUT_OF_RANGE
        if event.event_id is not None and not self._set_new(memory, f"ev:{event.event_id}", event.dedup_ttl):
            return Outcome.DUPLICATE
        converted = f"cv:{event.decision_id}"
        credited = self._get(memory, converted)
        if credited is not None:
            if event.event_id is None:
                return Outcome.DUPLICATE
            if event.censored:
                return Outcome.CENSORED
            if type(credited) is float and event.counts:  # a sum campaign's counted decision (this policy version's)
                self._credit_repeat(memory, event, converted, credited)
            return Outcome.REPEAT
        counted = event.counts and not event.censored
        self._set(memory, converted, event.value if counted and reward.sums else True, event.dedup_ttl)
        if event.counts:  # a counted pull's first conversion, censored or not: its delay is data
            memory.delays[event.arm, event.delay_bucket] += 1
            memory.stamp += 1  # the delay counts, and S below, change: statistics of a new version
        if event.censored:
            return Outcome.CENSORED
        if not event.counts:
            return Outcome.STALE
        if memory.model is not None:  # a contextual campaign: b += value·A of the decision's kept features
            features = self._get(memory, _features_key(event.bucket, event.decision_id))
            if not isinstance(features, np.ndarray):  # gone only for one arriving past window + lateness
                return Outcome.STALE
            memory.model.reward[event.arm] += event.value * features
        memory.counters.conversions[event.arm] += event.value
        memory.counters.counted[event.arm] += 1
        cell = memory.cells.get((event.arm, event.bucket))
        if cell is not None:
            cell.converted += 1
        return Outcome.COUNTED

    @staticmethod
    def _credit_repeat(memory: CampaignMemory, event: PreparedConversion, converted: str, credited: float) -> None:
        """Add a sum campaign's repeat to S and to its decision's credited reward, whose expiry stays."""
        added = memory.campaign.reward.credit(event.value, credited)
        if added > 0.0:
            memory.counters.conversions[event.arm] += added
            memory.expiring[converted] = (memory.expiring[converted][0], credited + added)
            memory.stamp += 1  # S changed: statistics of a new version

    async def fold_matured(self, campaign: Campaign, arms: np.ndarray, buckets: np.ndarray) -> None:
        memory = self._campaigns[campaign.id]
        for arm, bucket in zip(arms.tolist(), buckets.tolist(), strict=True):
            cell = memory.cells.pop((arm, bucket), None)
            if cell is not None:
                memory.counters.matured[arm] += cell.count
        memory.histogram, memory.stamp = None, memory.stamp + 1  # its folded cells now count in ``matured``

    # schedules (planning policies) ---------------------------------------------------------------------

    async def claim_slots(
        self, campaign: Campaign, pulls: Sequence[Pull], request_ids: Sequence[str | None], ttl: int
    ) -> list[Claim]:
        return [await self.claim_slot(campaign, pull, rid, ttl) for pull, rid in zip(pulls, request_ids, strict=True)]

    async def claim_slot(self, campaign: Campaign, pull: Pull, request_id: str | None, ttl: int) -> Claim:
        memory = self._campaigns.get(campaign.id)
        earlier = None if memory is None else self._earlier(memory, request_id)
        if earlier is not None:
            return Claim(ClaimStatus.REPEATED, earlier.arm, earlier.propensity, earlier.decision_id)
        refusal = _refusal(memory, campaign)
        if refusal is not None:
            return Claim(ClaimStatus(refusal.value))
        assert memory is not None
        book = memory.schedule
        if book.plan is None:
            return Claim(ClaimStatus.NEEDS_PLAN)
        now = pull.record["at"]
        slot = next_slot(book.slot, now, campaign.created_at, campaign.slot_us)
        index, segment = book.resolve(slot)
        if index == -1:
            book.end_plan(now, campaign.created_at, campaign.slot_us)
            book.close_ready(now, campaign.lateness_us)
            if book.due():
                return Claim(ClaimStatus.NEEDS_PLAN, version=book.version)
        if (segment.arm, segment.propensity) != (pull.arm, pull.propensity):
            return Claim(ClaimStatus.OTHER_ARM, segment.arm, segment.propensity, version=book.version)
        book.claim(slot, now, campaign.created_at, campaign.slot_us)
        book.close_ready(now, campaign.lateness_us)
        memory.counters.decisions += 1
        memory.counters.pulls[pull.arm] += 1
        self.remember_request(campaign, request_id, pull, ttl)
        self._queue(memory, [{**pull.record, "seq": memory.counters.decisions}])
        return Claim(ClaimStatus.NEW, pull.arm, pull.propensity, pull.decision_id, book.version)

    async def schedule_view(self, campaign: Campaign) -> ScheduleView:
        return self._campaigns[campaign.id].schedule.view()

    async def commit_plan(
        self, campaign: Campaign, expected: int, plan: Plan, consumed: int, record: Record, now: int
    ) -> bool:
        memory = self._campaigns.get(campaign.id)
        if memory is None:
            return False
        earliest = next_slot(0, now, campaign.created_at, campaign.slot_us)
        if not memory.schedule.commit(expected, plan, consumed, earliest if campaign.slot_us else 0):
            return False
        self._queue(memory, [{**record, "config": {**record["config"], "version": memory.schedule.version}}])
        return True

    async def apply_anonymous(
        self, campaign: Campaign, events: list[AnonymousEvent], now: int
    ) -> list[Outcome | Uncredited]:
        memory = self._accepting_feedback(campaign, now)
        book, bounds = memory.schedule, RewardBounds.of(campaign)
        outcomes: list[Outcome | Uncredited] = []
        recorded = []
        for event in events:
            outcome = self._classify_anonymous(memory, event, bounds)
            outcomes.append(outcome)
            if outcome in AUDITED_ANONYMOUS:
                recorded.append({**event.record, "outcome": outcome})
        book.close_ready(now, campaign.lateness_us)
        if recorded:
            self._queue(memory, recorded)
        return outcomes

    def _accepting_feedback(self, campaign: Campaign, now: int) -> CampaignMemory:
        """The campaign's memory, or CampaignRefused: unknown, at another policy version, archived and past
        its feedback_until at ``now`` (µs), or paused."""
        memory = self._campaigns.get(campaign.id)
        refusal = _refusal(memory, campaign, now)
        if refusal is not None:
            raise CampaignRefused(refusal)
        assert memory is not None
        return memory

    def _classify_anonymous(
        self, memory: CampaignMemory, event: AnonymousEvent, bounds: RewardBounds
    ) -> Outcome | Uncredited:
        book = memory.schedule
        if event.kind == "watermark":
            book.watermark = max(book.watermark, event.start)
            return Outcome.COUNTED
        if event.event_id is not None and self._get(memory, f"ev:{event.event_id}") is not None:
            return Outcome.DUPLICATE
        if event.decision_id is not None and self._get(memory, f"cv:{event.decision_id}") is not None:
            if event.event_id is None:
                return Outcome.DUPLICATE
            self._set(memory, f"ev:{event.event_id}", True, event.dedup_ttl)
            return Outcome.REPEAT
        outcome: Outcome | Uncredited = Outcome.STALE
        if event.counts:  # an aggregate is bounded by the campaign's decisions, a conversion is within [0, 1]
            decisions = memory.counters.decisions if event.decision_id is None else None
            outcome = book.credit(event.start, event.end, event.value, bounds, decisions)
            if isinstance(outcome, Uncredited):
                return outcome
        if event.event_id is not None:
            self._set(memory, f"ev:{event.event_id}", True, event.dedup_ttl)
        if event.decision_id is not None:
            self._set(memory, f"cv:{event.decision_id}", True, event.dedup_ttl)
        return outcome

    # rebuilds -------------------------------------------------------------------------------------

    def export_campaign(self, campaign_id: str) -> CampaignMemory:
        return self._campaigns[campaign_id]

    def import_campaign(self, memory: CampaignMemory, clock_shift: int) -> None:
        """Adopt a campaign's state replayed elsewhere; expiry times move by ``clock_shift`` seconds (from
        the replay's virtual clock to this store's clock). Its audit entries are already in the log."""
        expiring = {key: (expires + clock_shift, value) for key, (expires, value) in memory.expiring.items()}
        if memory.campaign.archived_at is not None:
            self._archived[memory.campaign.id] = memory.campaign
        self._campaigns[memory.campaign.id] = CampaignMemory(
            memory.campaign, memory.counters, memory.delays, memory.cells, expiring, schedule=memory.schedule,
            model=memory.model,
        )  # fmt: skip

    # audit queue ----------------------------------------------------------------------------------

    async def audit_campaigns(self) -> list[str]:
        return [name for name, memory in self._campaigns.items() if memory.audit]

    async def read_audit(self, campaign: str, limit: int) -> list[QueueEntry]:
        memory = self._campaigns.get(campaign)
        if memory is None:
            return []
        return [
            QueueEntry(campaign, entry_id, records)
            for entry_id, records in itertools.islice(memory.audit.items(), limit)
        ]

    async def ack_audit(self, campaign: str, entry_ids: list[str]) -> None:
        memory = self._campaigns.get(campaign)
        if memory is None:
            return
        for entry_id in entry_ids:
            memory.audit.pop(entry_id, None)

    async def claim_audit(self, campaign: str, seconds: float) -> bool:
        return True  # one process

    async def audit_backlog(self) -> int:
        return sum(len(memory.audit) for memory in self._campaigns.values())

    # helpers --------------------------------------------------------------------------------------

    def _queue(self, memory: CampaignMemory, records: list[Record]) -> None:
        if self._keep_audit:
            memory.audit[self._next_entry_id()] = records

    def continue_after(self, entry: tuple[int, int]) -> None:
        """Issue queue ids after ``entry`` (the last one in the audit log), even if the clock went back."""
        self._last_entry = max(self._last_entry, entry)

    def _next_entry_id(self) -> str:
        """``<ms>-<seq>`` from the clock, never going backwards, as Redis stream ids: ids of a later
        process life sort after, and never collide with, the ones already in the audit log."""
        millis, sequence = self._last_entry
        now = self._clock() // 1000
        self._last_entry = (now, 0) if now > millis else (millis, sequence + 1)
        return "{}-{}".format(*self._last_entry)

    def _earlier(self, memory: CampaignMemory, request_id: str | None) -> DecisionResult | None:
        """The decision a retried request_id already got, if it is still remembered and the campaign is not
        archived (which decides nothing, retried or not)."""
        if request_id is None or memory.campaign.archived_at is not None:
            return None
        earlier = self._get(memory, f"req:{request_id}")
        if not isinstance(earlier, tuple):  # None: not remembered (``req:`` keys hold decisions only)
            return None
        decision_id, arm, propensity, action = earlier
        return DecisionResult(DecisionStatus.REPEATED, decision_id, arm, propensity, memory.counters.copy(), action)

    def remember_request(self, campaign: Campaign, request_id: str | None, pull: Pull, ttl: int) -> None:
        """Remember which decision ``request_id`` got (replays restore this for rebuilds)."""
        if request_id is not None:
            memory = self._campaigns[campaign.id]
            self._set(memory, f"req:{request_id}", (pull.decision_id, pull.arm, pull.propensity, pull.action), ttl)

    def _get(self, memory: CampaignMemory, key: str) -> Remembered | None:
        entry = memory.expiring.get(key)
        if entry is None or entry[0] <= self._clock() // MICROS:
            memory.expiring.pop(key, None)
            return None
        return entry[1]

    def _set(self, memory: CampaignMemory, key: str, value: Remembered, ttl: int) -> None:
        now = self._clock() // MICROS  # whole seconds, as Redis expires keys and the dedup sorted set
        if len(memory.expiring) >= memory.sweep_at:
            memory.expiring = {k: entry for k, entry in memory.expiring.items() if entry[0] > now}
            memory.sweep_at = max(_SWEEP_MINIMUM, 2 * len(memory.expiring))
        memory.expiring[key] = (now + ttl, value)

    def _set_new(self, memory: CampaignMemory, key: str, ttl: int) -> bool:
        """SET NX EX: True if the key was absent (or expired) and is now set."""
        if self._get(memory, key) is not None:
            return False
        self._set(memory, key, True, ttl)
        return True


def _features_key(bucket: int, decision_id: str) -> str:
    return f"ft:{bucket}:{features_field(decision_id)}"


def _grown(delays: np.ndarray, arms: int) -> np.ndarray:
    """The delay counts with rows of zeros for arms added since (an arm change keeps the others')."""
    if len(delays) >= arms:
        return delays
    return np.vstack([delays, np.zeros((arms - len(delays), BUCKETS), dtype=np.int64)])


def _refusal(memory: CampaignMemory | None, campaign: Campaign, now: int | None = None) -> DecisionStatus | None:
    """Why the campaign refuses a write from a caller holding ``campaign`` (its policy version), or None: in
    the order of store/lua/campaign_lib.lua, which every script shares (``now``: feedback received then, µs;
    None: a decision). A retried request_id is answered before this check, in both stores, unless archived."""
    if memory is None:
        return DecisionStatus.UNKNOWN
    if memory.campaign.version != campaign.version:
        return DecisionStatus.MOVED
    until = memory.campaign.feedback_until
    if until is not None:
        return DecisionStatus.ARCHIVED if now is None or now > until else None
    if memory.campaign.status is CampaignStatus.PAUSED:
        return DecisionStatus.PAUSED
    return None
