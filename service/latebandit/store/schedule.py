"""The shared schedule of a campaign whose policy plays planned segments (ODAAF, ARS-UCB, ARS-EXP3, CLW).

Every API replica claims slots from one schedule in the store, so a slot belongs to exactly one segment
and a segment lasts exactly its planned number of slots. The schedule holds:

- the current plan (service/latebandit/policies/schedule.py), its version and the slot its first segment starts at;
- one *record* per segment as played: its arm, first slot and event-time span [start, next start), and the
  reward credited to it by aggregates whose interval overlaps the span (split in proportion to time);
- the watermark (every aggregate up to it has been sent) and ``closed_until``: records are closed in play
  order once the watermark or the allowed lateness has passed their end; a closed record goes to the
  ``closed`` list for the next plan and leaves the store, so state stays bounded by the open records.
  An aggregate reaching back before ``closed_until`` is refused (``phase_closed``), recorded, never lost.

Slots: one per decision (default), or wall-clock slots of ``slot_seconds`` counted from the campaign's
creation, in which every decision gets the slot's arm. When a plan has been played, the claim that finds
it so ends its last record there; if the next plan may be made (at once, or once its feedback is closed)
the claim takes nothing and asks for the plan (NEEDS_PLAN), so no slot is spent waiting; otherwise the
plan's ``hold`` segment is played (a new record) until the next plan is in place.

``ScheduleBook`` is the embedded store's implementation; lua/claim_slots.lua, commit_plan.lua and
apply_anonymous.lua mirror it line for line, and the same contract tests run against both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from latebandit.audit.records import Outcome
from latebandit.policies.schedule import Next, Observed, Plan, Segment

if TYPE_CHECKING:
    from latebandit.campaign import Campaign

CLOSE_PER_CALL = 1000  # records closed at most per operation (the rest on the next one)
NO_RECORD = -2  # ``current`` before the first record of a plan; -1 is the plan's hold
CREDIT_LIMIT = 1e300
"""The most reward a schedule credits in all, in value units and in the policy's units (value / reward_cap).
Every running sum of credited reward (a record's, an arm's closed total, the sums the policy and the state add
up, in any order) is a sum of parts of that total, so it stays 1e8 times below float64's largest number,
whatever the values sent and whatever the rounding."""


class Uncredited(StrEnum):
    """A feedback event the store refuses: nothing changed, nothing recorded (the ingest rejects it)."""

    BEFORE_DECISION = "before_decision"  # it precedes the campaign's first decision
    VALUE_OUT_OF_RANGE = "value_out_of_range"  # no decision of the campaign could have produced it


@dataclass(frozen=True)
class RewardBounds:
    """What a planning campaign's feedback may credit. ``per_decision``: the largest reward of one decision,
    the campaign's ``reward.max`` (which its policy's ``reward_cap``, the old name, equals); an aggregate is the
    total reward of the decisions made before its interval's end, so it is at most ``per_decision`` times the
    decisions the campaign has counted when it arrives (an upper bound of those: the counters hold the decisions
    made so far under the current policy version, which is what its schedule credits). ``total``: CREDIT_LIMIT,
    in value units and (divided by the cap) in the policy's."""

    per_decision: float
    total: float

    @classmethod
    def of(cls, campaign: Campaign) -> RewardBounds:
        cap = campaign.reward.max
        return cls(cap, CREDIT_LIMIT * min(1.0, cap))

    def admits(self, value: float, decisions: int | None, credited: float) -> bool:
        """Whether ``value`` may be credited on top of ``credited``: an aggregate over the campaign's
        ``decisions``, or a conversion (None: one decision's, at most ``per_decision``). NaN admits nothing."""
        most = self.per_decision if decisions is None else self.per_decision * decisions
        return 0.0 <= value <= most and credited + value <= self.total


class ClaimStatus(StrEnum):
    NEW = "new"
    REPEATED = "repeated"
    PAUSED = "paused"
    UNKNOWN = "unknown"
    NEEDS_PLAN = "needs_plan"  # a campaign with no plan yet (just created, or rebuilt)
    OTHER_ARM = "other_arm"  # the slot belongs to another arm or propensity than the caller expected: nothing done
    MOVED = "moved"  # the campaign is at another policy version than the caller's: it must reload it
    ARCHIVED = "archived"
    UNREADABLE = "unreadable"  # (the scheduler's, never the store's) no plan could be made: nothing taken


@dataclass(frozen=True)
class Claim:
    status: ClaimStatus
    arm: int = -1
    propensity: float = 0.0
    decision_id: str = ""
    version: int = 0


@dataclass
class PlayedSegment:
    """A segment as played: its span in slots and event time, and the reward credited so far."""

    id: int
    segment: Segment
    first: int
    start: int  # µs
    end: int | None = None  # µs: the start of the next record; None while it is the current one
    next_first: int | None = None
    reward: float = 0.0

    def observed(self, slot: int) -> Observed:
        """As the policy sees it; ``slot``: the last claimed slot, for the current record."""
        last = self.next_first if self.next_first is not None else slot + 1
        return Observed(self.segment, max(last - self.first, 0), self.reward)


@dataclass(frozen=True)
class ScheduleView:
    """What planning reads: the plan and its version, the closed records not yet given to a plan, and the
    open ones with their provisional sums."""

    version: int
    plan: Plan | None
    closed: list[Observed]
    open: list[Observed]
    slot: int
    watermark: int
    closed_until: int
    current: PlayedSegment | None
    credited: dict[int, tuple[int, float]]


def next_slot(last: int, now: int, created: int, slot_us: int | None) -> int:
    """The slot a decision at ``now`` takes: the next one, or the wall-clock slot it falls in."""
    return last + 1 if slot_us is None else max(last, (now - created) // slot_us + 1)


def slot_start(slot: int, now: int, created: int, slot_us: int | None) -> int:
    """The event time a slot starts at: the claim's time, or the wall-clock slot boundary."""
    return now if slot_us is None else created + (slot - 1) * slot_us


@dataclass
class ScheduleBook:
    version: int = 0
    plan: Plan | None = None
    start: int = 1  # the slot of the plan's first segment
    slot: int = 0  # the last claimed slot
    current: int = NO_RECORD  # the plan index of the current record
    first_record: int = 1  # the record id of the plan's first segment
    records: dict[int, PlayedSegment] = field(default_factory=dict)  # the open ones, by id
    last_record: int = 0
    closed_through: int = 0  # every record id up to this one is closed
    closed_until: int = 0  # µs: the end of the last closed record
    closed: list[Observed] = field(default_factory=list)
    watermark: int = 0
    credited: dict[int, tuple[int, float]] = field(default_factory=dict)  # arm: (slots, reward), closed counted
    total: float = 0.0  # all reward credited since the schedule began (open and closed records): RewardBounds

    def resolve(self, slot: int) -> tuple[int, Segment]:
        """The plan index (-1: the hold) and segment of ``slot``."""
        assert self.plan is not None
        position = slot - self.start
        for index, segment in enumerate(self.plan.segments):
            if position < segment.slots:
                return index, segment
            position -= segment.slots
        return -1, self.plan.hold

    def claim(self, slot: int, now: int, created: int, slot_us: int | None) -> PlayedSegment:
        """Take ``slot`` (>= the last one), opening a record for each segment entered on the way (several
        only with wall-clock slots, when no decision was asked for during a whole segment)."""
        target, _ = self.resolve(slot)
        self._enter(target, now, created, slot_us)
        self.slot = slot
        return self.records[self.last_record]

    def _enter(self, target: int, now: int, created: int, slot_us: int | None) -> None:
        """Open a record for each segment entered until plan index ``target``."""
        while self.current != target:
            index = self._following(self.current)
            first = self.first_slot(index)
            self._open(index, first, slot_start(first, now, created, slot_us))

    def _following(self, index: int) -> int:
        """The plan index entered after ``index`` (segments in order, then the hold)."""
        assert self.plan is not None
        following = 0 if index == NO_RECORD else index + 1
        return following if 0 <= following < len(self.plan.segments) else -1

    def first_slot(self, index: int) -> int:
        """The first slot of plan index ``index`` (-1: the hold)."""
        assert self.plan is not None
        segments = self.plan.segments if index == -1 else self.plan.segments[:index]
        return self.start + sum(segment.slots for segment in segments)

    def _open(self, index: int, first: int, start: int) -> None:
        assert self.plan is not None
        previous = self.records.get(self.last_record)
        if previous is not None:
            previous.end, previous.next_first = start, first
        segment = self.plan.hold if index == -1 else self.plan.segments[index]
        self.last_record += 1
        self.records[self.last_record] = PlayedSegment(self.last_record, segment, first, start)
        self.current = index

    def close_ready(self, now: int, lateness: int) -> None:
        """Close, in play order, the records whose feedback is complete (watermark or lateness passed)."""
        for _ in range(CLOSE_PER_CALL):
            record = self.records.get(self.closed_through + 1)
            if record is None or record.end is None:
                return
            if not (self.watermark >= record.end or now >= record.end + lateness):
                return
            observed = record.observed(self.slot)
            self.closed.append(observed)
            if record.segment.counted:
                slots, reward = self.credited.get(record.segment.arm, (0, 0.0))
                self.credited[record.segment.arm] = (slots + observed.slots, reward + observed.reward)
            del self.records[record.id]
            self.closed_through, self.closed_until = record.id, record.end

    def end_plan(self, now: int, created: int, slot_us: int | None) -> None:
        """A claim is past the plan: end its last record where the plan ends (the hold opens on a claim)."""
        assert self.plan is not None
        if self.current == -1 or not self.plan.segments:
            return
        self._enter(len(self.plan.segments) - 1, now, created, slot_us)  # wall-clock segments with no decision
        record = self.records[self.last_record]
        if record.end is None:
            ends = self.first_slot(-1)
            record.end, record.next_first = slot_start(ends, now, created, slot_us), ends

    def due(self) -> bool:
        """The plan has been played and the next plan may be made."""
        if self.plan is None or self.plan.next == Next.NEVER:
            return False
        if self.plan.next == Next.PLAYED:
            return True
        return self.closed_through >= self.first_record + len(self.plan.segments) - 1

    def commit(self, expected: int, plan: Plan, consumed: int, earliest: int) -> bool:
        """Install ``plan`` as version ``expected`` + 1 if no other plan was committed since ``expected``;
        its first segment starts at the next slot (at least ``earliest``)."""
        if self.version != expected:
            return False
        self.version += 1
        self.plan, self.start, self.current = plan, max(self.slot + 1, earliest), NO_RECORD
        self.first_record = self.last_record + 1
        del self.closed[:consumed]
        return True

    def credit(
        self, start: int, end: int, value: float, bounds: RewardBounds, decisions: int | None
    ) -> Outcome | Uncredited:
        """Credit an aggregate over [start, end) to the open records it overlaps, in proportion to time (an
        instant, start == end, to the record containing it). ``phase_closed`` if it reaches back before
        ``closed_until``; ``before_decision`` if it touches no record (it precedes the first decision);
        ``value_out_of_range`` unless ``bounds`` admit it (``decisions``: RewardBounds.admits)."""
        if start < self.closed_until:
            return Outcome.PHASE_CLOSED
        shares = []
        for record in self.records.values():  # in id (play) order: ids only grow, and a dict keeps insertion order
            upper = record.end if record.end is not None else max(end, start + 1)
            if end == start:
                if record.start <= start < upper:
                    shares.append((record, 1.0))
            elif min(end, upper) > max(start, record.start):
                shares.append((record, (min(end, upper) - max(start, record.start)) / (end - start)))
        if not shares:
            return Uncredited.BEFORE_DECISION
        if not bounds.admits(value, decisions, self.total):
            return Uncredited.VALUE_OUT_OF_RANGE
        for record, share in shares:
            record.reward += value * share
        self.total += value
        return Outcome.COUNTED

    def view(self) -> ScheduleView:
        open_ = [record.observed(self.slot) for record in self.records.values()]
        current = self.records.get(self.last_record)
        return ScheduleView(
            self.version, self.plan, list(self.closed), open_, self.slot, self.watermark, self.closed_until, current,
            dict(self.credited),
        )  # fmt: skip
