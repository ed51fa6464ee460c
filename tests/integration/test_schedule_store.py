"""The shared schedule of planning policies, the same contract for both stores (Redis: Lua scripts)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latebandit.campaign import Campaign, CampaignStatus
from latebandit.policies.schedule import Next, Observed, Plan, Segment
from latebandit.store.base import AnonymousEvent, CampaignRefused, Pull, StateStore
from latebandit.store.memory import MemoryStore
from latebandit.store.redis import RedisStore
from latebandit.store.schedule import ClaimStatus

T0 = 1_800_000_000_000_000
SECOND = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def make_campaign(slot_seconds: float | None = None, lateness: float = 60.0) -> Campaign:
    return Campaign(
        id="s1", arms=["a", "b", "c"], policy={"name": "odaaf", "params": {"mean_delay": 1, "horizon": 10_000}},
        slot_seconds=slot_seconds, allowed_lateness=lateness, created_at=T0,
    )  # fmt: skip


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def stores(request) -> AsyncIterator[Callable[[Clock], StateStore]]:
    made: list[RedisStore] = []

    def build(clock: Clock) -> StateStore:
        if request.param == "memory":
            return MemoryStore(clock=clock)
        prefix = request.getfixturevalue("redis_prefix")
        made.append(RedisStore(request.getfixturevalue("redis_url"), f"{prefix}:{uuid.uuid4().hex[:4]}", clock=clock))
        return made[-1]

    yield build
    for store in made:
        await store.close()


def plan(*segments: tuple[int, int, bool], hold: int = 0, after: Next = Next.CLOSED) -> Plan:
    return Plan(tuple(Segment(arm, slots, counted) for arm, slots, counted in segments), Segment(hold, 1, False),
                after, {"n": len(segments)})  # fmt: skip


def pull(arm: int, name: str, at: int = T0, propensity: float = 1.0) -> Pull:
    return Pull(arm, 0, 0, (), name, propensity, {"type": "decision", "decision_id": name, "arm": arm, "at": at})


def aggregate(start: float, end: float, value: float, event_id: str | None = None) -> AnonymousEvent:
    record = {"type": "aggregate", "event_id": event_id, "value": value}
    return AnonymousEvent("aggregate", T0 + round(start * SECOND), T0 + round(end * SECOND), value, event_id, None,
                          3600, record)  # fmt: skip


def watermark(at: float) -> AnonymousEvent:
    return AnonymousEvent("watermark", T0 + round(at * SECOND), T0 + round(at * SECOND), 0.0, None, None, 3600,
                          {"type": "watermark"})  # fmt: skip


async def claim(store: StateStore, campaign: Campaign, clock: Clock, at: float, name: str) -> int | None:
    """Claim a slot at ``at`` seconds, following OTHER_ARM answers as the engine does: the arm, or None
    when the store asks for the next plan."""
    clock.now = T0 + round(at * SECOND)
    arm = 0
    for _ in range(4):
        result = await store.claim_slot(campaign, pull(arm, name, clock.now), None, 60)
        if result.status is ClaimStatus.NEEDS_PLAN:
            return None
        if result.status is not ClaimStatus.OTHER_ARM:
            assert result.status is ClaimStatus.NEW
            return result.arm
        arm = result.arm
    raise AssertionError("claims kept moving")


async def test_claims_follow_the_plan_in_order_and_report_when_the_next_is_due(stores) -> None:
    clock = Clock()
    store, campaign = stores(clock), make_campaign(lateness=60)
    await store.create_campaign(campaign, {"type": "campaign"})
    assert (await store.claim_slot(campaign, pull(0, "x"), None, 60)).status is ClaimStatus.NEEDS_PLAN
    assert await store.commit_plan(campaign, 0, plan((0, 3, True), (1, 2, True), hold=2), 0, _plan_record(), clock.now)
    assert not await store.commit_plan(campaign, 0, plan((1, 1, True)), 0, _plan_record(), clock.now)  # stale version
    moved = await store.claim_slot(campaign, pull(1, "y"), None, 60)
    assert (moved.status, moved.arm) == (ClaimStatus.OTHER_ARM, 0)
    arms = [await claim(store, campaign, clock, i, f"d{i}") for i in range(1, 9)]
    assert arms == [0, 0, 0, 1, 1, 2, 2, 2]  # blocks of exactly 3 and 2, then the hold: their feedback is open
    view = await store.schedule_view(campaign)
    assert view.version == 1 and view.slot == 8 and len(view.open) == 3 and view.closed == []
    assert [(o.segment.arm, o.slots) for o in view.open] == [(0, 3), (1, 2), (2, 3)]
    await store.apply_anonymous(campaign, [watermark(6)], clock.now)  # both blocks ended by t = 6 s (the hold began)
    view = await store.schedule_view(campaign)
    assert [(o.segment.arm, o.slots) for o in view.closed] == [(0, 3), (1, 2)]
    assert view.closed_until == T0 + 6 * SECOND
    assert await claim(store, campaign, clock, 9, "d9") is None  # now the next plan is due: no slot taken
    assert await store.commit_plan(campaign, 1, plan((1, 2, True)), 2, _plan_record(), clock.now)
    view = await store.schedule_view(campaign)
    assert view.version == 2 and view.closed == [] and view.credited == {0: (3, 0.0), 1: (2, 0.0)}
    assert [await claim(store, campaign, clock, 10 + i, f"e{i}") for i in range(3)] == [1, 1, 0]
    view = await store.schedule_view(campaign)
    assert view.slot == 11 and [(o.segment.arm, o.slots) for o in view.open] == [(2, 3), (1, 2), (0, 1)]


async def test_aggregates_are_split_over_segments_in_proportion_to_time(stores) -> None:
    clock = Clock()
    store, campaign = stores(clock), make_campaign(lateness=1000)
    await store.create_campaign(campaign, {"type": "campaign"})
    await store.commit_plan(campaign, 0, plan((0, 2, True), (1, 2, True), hold=2), 0, _plan_record(), clock.now)
    for i in range(1, 6):
        await claim(store, campaign, clock, 10 * i, f"d{i}")  # segments start at 10 s (a), 30 s (b), 50 s (hold)
    outcomes = await store.apply_anonymous(
        campaign,
        [aggregate(20, 40, 4.0, "e1"), aggregate(35, 35, 1.0, "e2"), aggregate(45, 55, 2.0), aggregate(0, 5, 9.0),
         aggregate(20, 40, 4.0, "e1")],
        clock.now,
    )  # fmt: skip
    assert outcomes == ["counted", "counted", "counted", "before_decision", "duplicate"]
    view = await store.schedule_view(campaign)
    assert [(o.segment.arm, o.reward) for o in view.open] == [(0, 2.0), (1, 2.0 + 1.0 + 1.0), (2, 1.0)]
    assert (await store.apply_anonymous(campaign, [watermark(30)], clock.now)) == ["counted"]
    view = await store.schedule_view(campaign)
    assert [(o.segment.arm, o.slots, o.reward) for o in view.closed] == [(0, 2, 2.0)]
    late = await store.apply_anonymous(campaign, [aggregate(25, 31, 1.0, "late")], clock.now)
    assert late == ["phase_closed"]  # it reaches back before the closed segment's end: refused, recorded
    assert (await store.apply_anonymous(campaign, [aggregate(25, 31, 1.0, "late")], clock.now)) == ["duplicate"]
    entries = await store.read_audit(campaign.id, 100)
    outcomes = [record.get("outcome") for entry in entries for record in entry.records if record["type"] == "aggregate"]
    assert outcomes == ["counted", "counted", "counted", "phase_closed"]


async def test_lateness_closes_without_a_watermark(stores) -> None:
    clock = Clock()
    store, campaign = stores(clock), make_campaign(lateness=30)
    await store.create_campaign(campaign, {"type": "campaign"})
    await store.commit_plan(campaign, 0, plan((0, 1, True), hold=1), 0, _plan_record(), clock.now)
    await claim(store, campaign, clock, 1, "d1")
    assert await claim(store, campaign, clock, 2, "d2") == 1  # the hold starts: the block ended at 2 s
    assert await claim(store, campaign, clock, 31, "d3") == 1
    assert await claim(store, campaign, clock, 32, "d4") is None  # 2 s + 30 s of lateness: the next plan


async def test_wall_clock_slots(stores) -> None:
    """Every decision in a slot gets its arm; segments with no decision at all are still played."""
    clock = Clock()
    store, campaign = stores(clock), make_campaign(slot_seconds=10, lateness=0)
    await store.create_campaign(campaign, {"type": "campaign"})
    await store.commit_plan(
        campaign, 0, plan((0, 2, True), (1, 1, True), (2, 1, True), hold=0), 0, _plan_record(), clock.now
    )
    assert [await claim(store, campaign, clock, at, f"d{at}") for at in (0.5, 3, 19.9)] == [0, 0, 0]
    # Slots 3 (b) and 4 (c) went by with no decision: still played; lateness 0 closes them, so at 45 s the
    # plan is over and the next one is due (no slot is spent on the hold).
    assert await claim(store, campaign, clock, 45, "late") is None
    view = await store.schedule_view(campaign)
    assert [(o.segment.arm, o.slots) for o in view.closed + view.open] == [(0, 2), (1, 1), (2, 1)]
    assert view.closed_until == T0 + 40 * SECOND  # lateness 0: closed as soon as the next segment began


async def test_paused_and_unknown_campaigns(stores) -> None:
    clock = Clock()
    store, campaign = stores(clock), make_campaign()
    assert (await store.claim_slot(campaign, pull(0, "x"), None, 60)).status is ClaimStatus.UNKNOWN
    with pytest.raises(CampaignRefused, match="unknown"):
        await store.apply_anonymous(campaign, [watermark(1)], clock.now)
    await store.create_campaign(campaign, {"type": "campaign"})
    await store.set_status(campaign.id, CampaignStatus.PAUSED, {"type": "campaign"})
    assert (await store.claim_slot(campaign, pull(0, "x"), None, 60)).status is ClaimStatus.PAUSED
    with pytest.raises(CampaignRefused, match="paused"):
        await store.apply_anonymous(campaign, [watermark(1)], clock.now)


def _plan_record() -> dict:
    return {"type": "campaign", "campaign": "s1", "at": T0, "action": "plan", "config": {"plan": {}}}


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("claim"), st.integers(1, 5_000_000)),
        st.tuples(
            st.just("aggregate"),
            st.integers(-3_000_000, 3_000_000),
            st.integers(0, 4_000_000),
            st.floats(0, 5, allow_nan=False),
            st.sampled_from([None, "e1", "e2", "e3"]),
        ),
        st.tuples(st.just("watermark"), st.integers(-8_000_000, 0)),
        st.tuples(
            st.just("plan"),
            st.lists(st.tuples(st.integers(0, 2), st.integers(1, 4), st.booleans()), max_size=3),
            st.integers(0, 2),
            st.sampled_from(list(Next)),
        ),
    ),
    min_size=1,
    max_size=40,
)


@pytest.mark.parametrize("slot_seconds", [None, 2.0])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=OPERATIONS)
async def test_memory_and_redis_agree_on_any_sequence(redis_url, redis_prefix, slot_seconds, operations) -> None:
    """The Lua scripts and ScheduleBook give the same answers and the same schedule on any history."""
    clocks = (Clock(), Clock())
    memory = MemoryStore(clock=clocks[0])
    redis_store = RedisStore(redis_url, f"{redis_prefix}:{uuid.uuid4().hex[:6]}", clock=clocks[1])
    campaign = make_campaign(slot_seconds=slot_seconds, lateness=3)
    try:
        answers: list[list[object]] = [[], []]
        for store, clock, out in zip((memory, redis_store), clocks, answers, strict=True):
            await store.create_campaign(campaign, {"type": "campaign"})
            for step, operation in enumerate(operations):
                out.append(await _apply(store, campaign, clock, step, operation))
            view = await store.schedule_view(campaign)
            out.append((view.version, view.plan, view.closed, view.open, view.slot, view.watermark,
                        view.closed_until, view.credited))  # fmt: skip
        assert answers[0] == answers[1]
    finally:
        await redis_store.close()


async def _apply(store: StateStore, campaign: Campaign, clock: Clock, step: int, operation: tuple) -> object:
    kind = operation[0]
    if kind == "claim":
        clock.now += operation[1]
        claimed = await store.claim_slot(campaign, pull(step % 3, f"d{step}", clock.now), None, 60)
        return (claimed.status, claimed.arm, claimed.version)
    if kind == "plan":
        view = await store.schedule_view(campaign)
        new = plan(*operation[1], hold=operation[2], after=operation[3])
        return await store.commit_plan(campaign, view.version, new, min(len(view.closed), 1), _plan_record(), clock.now)
    if kind == "watermark":
        at = clock.now + operation[1]
        return await store.apply_anonymous(
            campaign, [AnonymousEvent("watermark", at, at, 0.0, None, None, 60, {})], clock.now
        )
    start = clock.now + operation[1]
    event = AnonymousEvent("aggregate", start, start + operation[2], operation[3], operation[4], None, 60, {})
    return await store.apply_anonymous(campaign, [event], clock.now)


def test_observed_of_a_record_counts_its_slots() -> None:
    from latebandit.store.schedule import PlayedSegment

    record = PlayedSegment(1, Segment(0, 5, True), first=10, start=T0)
    assert record.observed(12) == Observed(Segment(0, 5, True), 3, 0.0)
    record.next_first = 15
    assert record.observed(99).slots == 5


async def test_a_worker_that_asked_for_the_first_plan_does_not_plan_past_it(stores) -> None:
    """Two workers find no plan; one commits the first. The other must not then plan from it (that would
    replace ODAAF's phase 1 by phase 2 before a slot was played): it plans only after the version it saw."""
    from latebandit.engine.scheduling import Scheduler

    clock = Clock()
    store, campaign = stores(clock), make_campaign()
    await store.create_campaign(campaign, {"type": "campaign"})

    def make_pull(campaign: Campaign, arm: int, propensity: float, now: int, request_id: str | None) -> Pull:
        return pull(arm, f"d{now}", now, propensity)

    first, second = (Scheduler(store, np.random.default_rng(seed), make_pull) for seed in (1, 2))
    asked = await store.claim_slot(campaign, pull(0, "x", clock.now), None, 60)
    assert asked.status is ClaimStatus.NEEDS_PLAN and asked.version == 0
    assert await first.plan(campaign, clock.now, 0)
    assert not await second.plan(campaign, clock.now, asked.version)  # too late: version 1 is there
    view = await store.schedule_view(campaign)
    assert view.version == 1 and view.plan is not None and view.plan.state["m"] == 1
    claimed = await second.claim(campaign, clock.now + SECOND, None, 60)
    assert claimed.status is ClaimStatus.NEW and claimed.arm == 0 and claimed.version == 1


async def test_claims_of_one_batch_take_slots_as_one_by_one_claims_would(stores) -> None:
    """claim_slots (the engine's group commit): in order, one slot each until the segment's arm changes;
    the rest answer OTHER_ARM with the slot's arm, nothing taken; a retried request_id gets its decision, until
    the campaign is archived."""
    clock = Clock()
    store, campaign = stores(clock), make_campaign(lateness=60)
    await store.create_campaign(campaign, {"type": "campaign"})
    waiting = await store.claim_slots(campaign, [pull(0, "w1"), pull(0, "w2")], [None, "r0"], 60)
    assert [claim.status for claim in waiting] == [ClaimStatus.NEEDS_PLAN] * 2
    assert await store.commit_plan(campaign, 0, plan((0, 3, True), (1, 2, True), hold=2), 0, _plan_record(), clock.now)
    names = ["d1", "d2", "d3", "d4", "d5"]
    claims = await store.claim_slots(campaign, [pull(0, name) for name in names], [None, "r1", None, "r1", None], 60)
    assert [claim.status for claim in claims] == [ClaimStatus.NEW, ClaimStatus.NEW, ClaimStatus.NEW,
                                                  ClaimStatus.REPEATED, ClaimStatus.OTHER_ARM]  # fmt: skip
    assert [claims[i].decision_id for i in range(3)] == ["d1", "d2", "d3"] and claims[3].decision_id == "d2"
    assert (claims[4].arm, claims[4].version) == (1, 1)
    view = await store.schedule_view(campaign)
    assert view.slot == 3 and [(o.segment.arm, o.slots) for o in view.open] == [(0, 3)]
    rest = await store.claim_slots(campaign, [pull(1, "e1"), pull(1, "e2"), pull(1, "e3")], [None, None, "r1"], 60)
    assert [claim.status for claim in rest] == [ClaimStatus.NEW, ClaimStatus.NEW, ClaimStatus.REPEATED]
    assert (await store.schedule_view(campaign)).slot == 5
    assert (await store.snapshot(campaign, 0.0)).counters.decisions == 5
    await store.archive(campaign.archived(clock.now), {})
    retried = await store.claim_slots(campaign, [pull(1, "e4")], ["r1"], 60)
    assert [claim.status for claim in retried] == [ClaimStatus.ARCHIVED]


async def test_expired_dedup_entries_of_aggregates_are_swept(redis_url: str, redis_prefix: str) -> None:
    """A planning campaign's deduplication memory shrinks once its entries expire, as an attributed one's
    does: without the sweep it grew for ever (issue 19). Sizes read straight from Redis."""
    import redis.asyncio as aioredis

    clock = Clock()
    store = RedisStore(redis_url, f"{redis_prefix}:{uuid.uuid4().hex[:6]}", clock=clock)
    campaign = make_campaign(lateness=10**6)
    client = aioredis.Redis.from_url(redis_url)
    try:
        await store.create_campaign(campaign, {"type": "campaign"})
        await store.commit_plan(campaign, 0, plan((0, 50, True)), 0, _plan_record(), clock.now)
        await claim(store, campaign, clock, 1, "d1")
        batch = [aggregate(1, 2, 1.0, f"e{i}") for i in range(20)]  # each remembered for 3600 s
        assert await store.apply_anonymous(campaign, batch, clock.now) == ["counted"] * 20
        seen = store.keys.dedup(campaign.id)
        assert await client.zcard(seen) == 20
        clock.now += 3601 * SECOND
        late = [aggregate(3601, 3602, 1.0, "late1"), aggregate(3601, 3602, 1.0, "late2")]  # sweeps up to 2·2 + 16
        assert await store.apply_anonymous(campaign, late, clock.now) == ["counted"] * 2
        assert await client.zcard(seen) == 2  # only the new ones are left
    finally:
        await client.aclose()
        await store.close()


async def test_claims_past_the_plan_close_records_as_the_mirror_does_past_the_cap(
    redis_url: str, redis_prefix: str
) -> None:
    """A claim past the plan makes two closing passes of up to CLOSE_PER_CALL records each (those whose
    allowed lateness has passed), in the Lua scripts as in ScheduleBook: with more ready than one pass
    closes, both stores close the same ones at each claim."""
    from latebandit.store.schedule import CLOSE_PER_CALL

    segments = CLOSE_PER_CALL + CLOSE_PER_CALL // 2
    clocks = (Clock(), Clock())
    memory = MemoryStore(clock=clocks[0])
    redis_store = RedisStore(redis_url, f"{redis_prefix}:{uuid.uuid4().hex[:6]}", clock=clocks[1])
    campaign = make_campaign(lateness=60)
    seen: list[list[object]] = [[], []]
    try:
        for store, clock, out in zip((memory, redis_store), clocks, seen, strict=True):
            await store.create_campaign(campaign, {"type": "campaign"})
            played = plan(*[(0, 1, True)] * segments, hold=0)
            assert await store.commit_plan(campaign, 0, played, 0, _plan_record(), clock.now)
            for first in range(0, segments + 1, 64):  # every slot, then the hold's first
                clock.now += SECOND
                names = [f"d{n}" for n in range(first, min(first + 64, segments + 1))]
                pulls = [pull(0, name, clock.now) for name in names]
                claims = await store.claim_slots(campaign, pulls, [None] * len(names), 60)
                assert {claim.status for claim in claims} == {ClaimStatus.NEW}
            clock.now += 120 * SECOND  # every record's lateness passed: the claims close them
            for n in range(3):
                claimed = await store.claim_slot(campaign, pull(0, f"h{n}", clock.now), None, 60)
                view = await store.schedule_view(campaign)
                out.append((claimed.status, len(view.closed), len(view.open)))
    finally:
        await redis_store.close()
    assert seen[0] == seen[1]
    assert [closed for _, closed, _ in seen[0]] == [segments] * 3  # the first claim closed all, in two passes
    assert [status for status, _, _ in seen[0]] == [ClaimStatus.NEW, ClaimStatus.NEEDS_PLAN, ClaimStatus.NEEDS_PLAN]


async def test_a_schedule_unreadable_at_planning_time_spares_the_claims_already_taken(stores, monkeypatch) -> None:
    """A batch whose first decisions take the plan's last slots and whose others need the next plan, which
    cannot be made because the schedule cannot be read: the claims taken stand (recorded, so answered), the
    others are UNREADABLE with nothing taken (an exception for the whole batch would have answered the
    recorded ones with a second, fallback decision)."""
    from latebandit.engine.scheduling import Scheduler
    from latebandit.store.base import StateUnreadable

    clock = Clock()
    store, campaign = stores(clock), make_campaign()
    await store.create_campaign(campaign, {"type": "campaign"})
    assert await store.commit_plan(campaign, 0, plan((0, 2, True), after=Next.PLAYED), 0, _plan_record(), clock.now)

    def make_pull(campaign: Campaign, arm: int, propensity: float, now: int, request_id: str | None) -> Pull:
        return pull(arm, f"d{request_id}", now, propensity)

    async def unreadable(campaign: Campaign) -> None:
        raise StateUnreadable(campaign.id, "test")

    monkeypatch.setattr(store, "schedule_view", unreadable)
    claims = await Scheduler(store, np.random.default_rng(1), make_pull).claim_together(
        campaign, clock.now, ["r1", "r2", "r3", "r4"], 60
    )
    assert [claim.status for claim in claims] == [ClaimStatus.NEW] * 2 + [ClaimStatus.UNREADABLE] * 2
    assert (await store.snapshot(campaign, 0.0)).counters.decisions == 2
