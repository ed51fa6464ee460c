"""The state-store interface and the plain data it exchanges with the decision engine.

The per-campaign state does not depend on the policy: raw counters per arm, a histogram of the
pulls still inside the censoring window (per arm and time bucket: count, summed offset (ms) inside the bucket,
summed exponential moments, conversions seen), and per arm the counts of observed conversion delays in the
fixed log-spaced buckets of latebandit/delays/tail.py. Every field only ever grows by addition, so the state does
not depend on the order in which events arrive, and a replay of the audit log rebuilds it exactly.
A bucket whose pulls are all older than the window is folded into the arm's ``matured`` counter, which
keeps the state bounded by the window, not by traffic.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import numpy as np

from latebandit.audit.queue import AuditQueue
from latebandit.audit.records import Outcome, Record
from latebandit.campaign import Campaign, CampaignStatus
from latebandit.delays.tail import BUCKETS
from latebandit.policies.linear import Inverses
from latebandit.policies.schedule import Plan
from latebandit.store.schedule import Claim, ScheduleView, Uncredited


class StoreUnavailable(RuntimeError):
    """The state store cannot be reached: decisions fall back, feedback answers 503."""


class CampaignRefused(RuntimeError):
    """Feedback for a campaign that is unknown, paused, archived past its ``feedback_until`` or at another
    policy version: ``reason`` is one of DecisionStatus.UNKNOWN, PAUSED, ARCHIVED or MOVED, the answers the
    decision path gives for the same states.
    ``applied`` holds the outcomes of the leading events that were applied before the refusal (a batch
    applied in several atomic chunks can be paused between two of them)."""

    def __init__(self, reason: DecisionStatus, applied: list[Outcome | Uncredited] | None = None) -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.applied = applied or []


class StateUnreadable(RuntimeError):
    """A campaign's stored state cannot be read: not what the store writes (corrupt, or a number that is not
    finite, as feedback could leave before such values were refused). Its decisions fall back to the default
    arm and GET /state answers an error, rather than every request failing, until an operator rebuilds the
    state from the audit log (``latebandit rebuild``) or changes the policy."""

    def __init__(self, campaign_id: str, problem: str) -> None:
        super().__init__(f"campaign {campaign_id!r}: its stored state cannot be read ({problem})")
        self.campaign_id = campaign_id


class CampaignMoved(RuntimeError):
    """The campaign is at another policy version than the caller's copy of it (a policy change happened in
    between): reload the campaign and try again."""


@dataclass
class Counters:
    """Per-campaign and per-arm counters (arrays of length K)."""

    decisions: int
    pulls: np.ndarray
    conversions: np.ndarray  # float S: Σ of credited conversion values, in value units ([0, reward.max] a decision)
    matured: np.ndarray
    counted: np.ndarray  # int64: the conversions that counted (a decision's first within its window)

    @classmethod
    def zeros(cls, arms: int) -> Counters:
        ints = np.zeros(arms, dtype=np.int64)
        return cls(0, pulls=ints, conversions=np.zeros(arms), matured=ints.copy(), counted=ints.copy())

    def with_pulls(self, arms: Iterable[int], decisions: int) -> Counters:
        """These counters with a pull of each of ``arms`` added and the decision count ``decisions``; S, the
        matured and counted conversions shared (unchanged)."""
        pulls = self.pulls.copy()
        for arm in arms:
            pulls[arm] += 1
        return Counters(decisions, pulls, self.conversions, self.matured, self.counted)

    def copy(self) -> Counters:
        arrays = (self.pulls, self.conversions, self.matured, self.counted)
        return Counters(self.decisions, *(array.copy() for array in arrays))


@dataclass
class Histogram:
    """Pulls inside the window, one row per (arm, bucket) cell."""

    arm: np.ndarray  # int64 (n,)
    bucket: np.ndarray  # int64 (n,): floor(decided_at / bucket width)
    count: np.ndarray  # int64 (n,)
    offset: np.ndarray  # int64 (n,): Σ (decided_at − bucket·width) in ms: the mean pull time to the millisecond
    converted: np.ndarray  # int64 (n,): counted conversions of these pulls
    moments: np.ndarray  # float64 (n, J): Σ exp(−λ_j·(bucket end − decided_at)) per exponential component
    # float64 (n,): Σ of the cell's decisions' footprints (a contextual campaign's window sum); None: none kept
    footprint: np.ndarray | None = None

    @classmethod
    def empty(cls, components: int) -> Histogram:
        arm, bucket, count, offset, converted = (np.zeros(0, dtype=np.int64) for _ in range(5))
        return cls(arm, bucket, count, offset, converted, moments=np.zeros((0, components)))


@dataclass(frozen=True)
class StateVersion:
    """Which statistics a snapshot holds, by value: two snapshots of one store at equal versions hold equal
    statistics, which is what lets the engine keep a choice computed from one for the next (engine/choosing.py).
    The parts: the campaign's policy version (a change starts a fresh state), the histogram read (numbered by
    the store, new for every read), the counters' write stamp (changed by every write other than a decision:
    a counted conversion, matured cells folded) and the decision count."""

    policy: int
    read: int
    stamp: bytes
    decisions: int


Decided = tuple[int, np.ndarray]  # a contextual decision's block (its arm) and features A


@dataclass(frozen=True)
class LinearSums:
    """A contextual campaign's model sums per block (an arm of a context campaign; the one block of an actions
    campaign): both only grow by addition, so replicas, Redis Cluster and replays add them in any order."""

    gram: np.ndarray  # float64 (K, d, d): Σ A Aᵀ over the block's recorded decisions
    reward: np.ndarray  # float64 (K, d): b = Σ value·A over its counted conversions (value units)
    # the inverses of λI + gram the policy computed (LinearStats.inverses): gram is never changed in place
    inverses: Inverses = field(default_factory=Inverses, compare=False, repr=False)

    @classmethod
    def zeros(cls, blocks: int, d: int) -> LinearSums:
        return cls(np.zeros((blocks, d, d)), np.zeros((blocks, d)))

    def with_blocks(self, blocks: int) -> LinearSums:
        """These sums with empty blocks appended up to ``blocks``: a context campaign's added arms, which
        start with no decisions (arms are only ever appended: their indices are their blocks)."""
        d, more = self.reward.shape[1], blocks - len(self.reward)
        return LinearSums(np.concatenate([self.gram, np.zeros((more, d, d))]),
                          np.concatenate([self.reward, np.zeros((more, d))]))  # fmt: skip

    def with_decisions(self, added: list[Decided]) -> LinearSums:
        """These sums with the decisions (block, A) added (a worker's own, before its next read), and the
        inverses held updated with them, or dropped (Inverses.with_decisions)."""
        gram = self.gram.copy()
        blocks = np.array([block for block, _ in added], dtype=np.int64)
        for block, batch in grams_by_block(blocks, np.array([a for _, a in added], dtype=np.float64)).items():
            gram[block] += batch
        return LinearSums(gram, self.reward, self.inverses.with_decisions(added))


def grams_by_block(blocks: np.ndarray, features: np.ndarray) -> dict[int, np.ndarray]:
    """Per block, the Σ AAᵀ of the decisions (blocks (n,), features (n, d)), one product per block: what a
    worker adds for its own decisions, and what a ``decided`` string holds (store/redis.py). The blocks are
    told apart by a set of Python ints, and rows are selected only where there are several: an actions
    campaign has one block, and a worker's own decisions are mostly one (np.unique and a mask were most of
    what the decision made ready after each answer cost, docs/benchmarks.md)."""
    distinct = set(blocks.tolist())
    if len(distinct) == 1:
        return {distinct.pop(): features.T @ features}
    return {k: (rows := features[blocks == k]).T @ rows for k in distinct}


@dataclass
class StateSnapshot:
    counters: Counters
    histogram: Histogram
    delays: np.ndarray | None = None  # int64 (K, delay_tail.BUCKETS): first conversions of counted pulls
    version: StateVersion | None = None  # None: no later snapshot is known to hold the same statistics
    model: LinearSums | None = None  # a contextual campaign's (None: none, or nothing recorded yet)

    def delay_counts(self) -> np.ndarray:
        arms = len(self.counters.pulls)
        return self.delays if self.delays is not None else np.zeros((arms, BUCKETS), dtype=np.int64)


# The records made per decision or event (Pull, DecisionResult, AnonymousEvent, PreparedConversion) are plain
# dataclasses, treated as immutable: a frozen one's __init__ sets each field through object.__setattr__, five
# times the cost of a plain one's, a large part of what a /feedback conversion costs (docs/benchmarks.md).
@dataclass
class Pull:
    """A decision to record: the arm pulled, where it falls in the histogram, and its audit record."""

    arm: int
    bucket: int
    offset: int
    moments: tuple[float, ...]
    decision_id: str
    propensity: float
    record: Record
    features: np.ndarray | None = None  # float64 (d,): a contextual decision's chosen features (A_s)
    footprint: float = 0.0  # what a contextual decision adds to its block's window sum while inside the window
    action: str | None = None  # an actions campaign's chosen action id (its arm is the model's one block)


def features_field(decision_id: str) -> str:
    """Under which name a contextual decision's features are kept for its conversion: the id's signature,
    unique per decision (it signs the nonce) and a third of the id's length."""
    return decision_id.rpartition(".")[2]


class DecisionStatus(StrEnum):
    NEW = "new"
    REPEATED = "repeated"  # a retried request_id: the earlier decision is returned
    PAUSED = "paused"
    UNKNOWN = "unknown"
    MOVED = "moved"  # the campaign's policy version changed: reload it (CampaignMoved)
    ARCHIVED = "archived"  # no decisions any more; feedback only until its ``feedback_until``


@dataclass
class DecisionResult:
    status: DecisionStatus
    decision_id: str = ""
    arm: int = -1
    propensity: float = 0.0
    counters: Counters | None = None
    action: str | None = None  # an actions campaign's chosen action id


@dataclass
class AnonymousEvent:
    """A verified aggregate (an attributed conversion is one over the instant it occurred at) or watermark,
    for a campaign whose policy learns from sums."""

    kind: str  # "aggregate" or "watermark"
    start: int  # µs; the watermark's time for a watermark
    end: int
    value: float
    event_id: str | None
    decision_id: str | None  # a conversion's decision: one conversion per decision, as for attributed ones
    dedup_ttl: int
    record: Record = field(default_factory=dict)
    counts: bool = True  # False for a conversion of a fallback or of an earlier policy version: recorded, stale


@dataclass
class PreparedConversion:
    """A verified conversion, classified by everything that does not need the store's memory."""

    decision_id: str
    arm: int
    bucket: int
    value: float
    counts: bool  # within the window, of a counted pull of the current policy version (the store checks it is)
    censored: bool  # later than the window
    event_id: str | None
    dedup_ttl: int  # seconds the event_id and the decision's conversion are remembered
    record: Record = field(default_factory=dict)
    delay_bucket: int = 0  # delay_tail bucket of the delay, counted with the decision's first conversion


class StateStore(AuditQueue, Protocol):
    async def ping(self) -> None: ...

    async def create_campaign(self, campaign: Campaign, record: Record) -> bool:
        """False if the id exists."""
        ...

    async def get_campaign(self, campaign_id: str) -> Campaign | None: ...

    async def list_campaigns(self) -> list[str]:
        """The live campaigns (not archived)."""
        ...

    async def list_archived(self) -> list[str]:
        """The archived campaigns, those whose state is purged too: their ids are never reused."""
        ...

    async def set_status(self, campaign_id: str, status: CampaignStatus, record: Record) -> Campaign | None:
        """The campaign with its new status, None if unknown; an archived campaign is answered unchanged
        (nothing recorded)."""
        ...

    async def archive(self, campaign: Campaign, record: Record) -> Campaign | None:
        """Archive ``campaign`` (as ``Campaign.archived`` made it) atomically with its audit record, so that
        decisions are refused from now on and feedback after its ``feedback_until``. None if unknown; a
        campaign archived already is answered as it was archived (nothing recorded: a retry is harmless)."""
        ...

    async def purge_archived(self, now: int) -> list[str]:
        """Remove the state of every archived campaign whose ``feedback_until`` is before ``now`` (µs) and whose
        audit queue is drained (what it still owes the audit log stays); the ids purged. The campaign stays
        listed as archived. Idempotent: any number of workers may sweep at once."""
        ...

    async def change_policy(
        self, campaign: Campaign, record: Record, arms_before: int | None = None
    ) -> Campaign | None:
        """Store ``campaign`` (the next policy version, ``version`` one above the stored one) and reset its
        counters and histogram, atomically with its audit record; None if unknown, CampaignMoved if the
        stored version is not the one before or the stored arms version not ``arms_before`` (default: the
        campaign's own; a restart with new arms passes the one it read); an archived campaign is answered unchanged."""
        ...

    async def change_arms(self, campaign: Campaign, record: Record) -> Campaign | None:
        """Store ``campaign`` (its next arms version at the same policy version: arms added or retired),
        keeping its statistics (an added arm's start at zero), atomically with its audit record; None if
        unknown, CampaignMoved if the stored policy version is not the campaign's or its arms version not the
        one before; an archived campaign is answered unchanged. Decisions of a caller holding another arms
        version are refused from then on (MOVED)."""
        ...

    async def snapshot(self, campaign: Campaign, max_age: float) -> StateSnapshot:
        """The campaign's state. With ``max_age`` > 0 a store may serve a histogram (and delay counts) read up
        to ``max_age`` seconds ago, with counters as of this worker's last write; with 0, everything is read
        now. What the engine relies on: while a store serves the same histogram read, ``histogram`` is the
        same object (the engine caches Ñ by its identity: a new read must be a new object), and no snapshot's
        arrays are modified after it is returned (a later write builds new ones)."""
        ...

    def held(self, campaign: Campaign, max_age: float) -> StateSnapshot | None:
        """What ``snapshot(campaign, max_age)`` would return now without any I/O, the same objects, if the
        store holds it; else None (a store that builds new arrays for every snapshot holds nothing)."""
        ...

    async def record_decision(self, campaign: Campaign, pull: Pull, request_id: str | None, ttl: int) -> DecisionResult:
        """Atomically: return the earlier decision of ``request_id``; else refuse (UNKNOWN, MOVED, ARCHIVED,
        PAUSED, in that order: store/lua/campaign_lib.lua); else count the pull and queue its audit record. A
        contextual pull (``features`` set) also adds AAᵀ to its block's Σ AAᵀ, its footprint to its cell and
        keeps its features for its conversion until ``Campaign.features_expire_at`` its bucket."""
        ...

    async def record_decisions(
        self, campaign: Campaign, pulls: Sequence[Pull], request_ids: Sequence[str | None], ttl: int
    ) -> list[DecisionResult]:
        """``record_decision`` of each pull in order, in one atomic step (the engine's group commit)."""
        ...

    async def record_fallback(self, campaign: Campaign, pull: Pull, request_id: str | None, ttl: int) -> DecisionResult:
        """Audit a fallback decision (its pull is not counted) and remember its request_id; a retried
        request_id gets its earlier decision."""
        ...

    async def apply_conversions(
        self, campaign: Campaign, events: list[PreparedConversion]
    ) -> list[Outcome | Uncredited]:
        """Atomically deduplicate, credit and queue for audit one campaign's conversions of a batch; one outcome
        per event (``Uncredited.VALUE_OUT_OF_RANGE`` for a value outside [0, reward.max], which changes
        nothing). A decision's first conversion within its window counts (its value credited); on a ``sum``
        campaign each later one, a repeat, adds ``RewardSpec.credit`` of its value (none once censored). On a
        contextual campaign a counted conversion adds value·A to its block's b, A its decision's kept features
        (``STALE`` if they are gone: reported past the window plus the allowed lateness)."""
        ...

    async def fold_matured(self, campaign: Campaign, arms: np.ndarray, buckets: np.ndarray) -> None:
        """Move matured histogram cells into the arms' ``matured`` counters (idempotent)."""
        ...

    async def claim_slot(self, campaign: Campaign, pull: Pull, request_id: str | None, ttl: int) -> Claim:
        """Atomically: the earlier decision of ``request_id``; or refuse (paused, unknown, no plan); or, if
        the next slot's segment has the arm and propensity of ``pull``, take the slot, count the decision
        and queue its audit record; else MOVED with the slot's arm and propensity, nothing changed."""
        ...

    async def claim_slots(
        self, campaign: Campaign, pulls: Sequence[Pull], request_ids: Sequence[str | None], ttl: int
    ) -> list[Claim]:
        """``claim_slot`` of each pull in order, in one atomic step (the engine's group commit): pulls made at
        one moment, expecting one arm and propensity."""
        ...

    async def schedule_view(self, campaign: Campaign) -> ScheduleView: ...

    async def commit_plan(
        self, campaign: Campaign, expected: int, plan: Plan, consumed: int, record: Record, now: int
    ) -> bool:
        """Install ``plan`` unless a plan was committed since version ``expected``; drop the ``consumed``
        first closed records (the plan has learnt from them) and queue ``record`` for audit. Times (here
        ``now``, a claim's ``pull.record["at"]``) are the engine's, so that a replay of the log repeats them."""
        ...

    async def apply_anonymous(
        self, campaign: Campaign, events: list[AnonymousEvent], now: int
    ) -> list[Outcome | Uncredited]:
        """Atomically deduplicate and credit aggregates, move the watermark, close what is complete; one
        outcome per event (an ``Outcome``, or an ``Uncredited`` refusal: store/schedule.py's RewardBounds)."""
        ...
