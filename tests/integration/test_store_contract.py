"""The same contract for both state stores: the real Redis server and the in-process memory store."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latebandit.audit.records import Outcome
from latebandit.campaign import Campaign, CampaignStatus
from latebandit.engine.exposure import bucket_moments
from latebandit.store.base import CampaignRefused, DecisionStatus, PreparedConversion, Pull, StateStore
from latebandit.store.keys import Keys
from latebandit.store.memory import MemoryStore
from latebandit.store.redis import RedisStore
from latebandit.store.schedule import Uncredited
from latebandit.timeutil import MICROS
from tests.conftest import delete_keys

T0 = 1_800_000_000_000_000  # a fixed epoch in µs; the stores never read a clock except for key expiry


REVENUE = {"max": 250.0, "per_decision": "sum"}


def make_campaign(campaign_id: str = "c1", delay: dict | None = None, reward: dict | None = None) -> Campaign:
    return Campaign(
        id=campaign_id,
        arms=["a", "b", "c"],
        policy={"name": "delayed-klucb", "params": {}},
        delay=delay or {"family": "exponential", "mean": 3600},
        window=86_400,
        created_at=T0,
        **({} if reward is None else {"reward": reward}),
    )


@pytest.fixture(params=["memory", *(pytest.param(name, marks=pytest.mark.redis) for name in ("redis", "cluster"))])
async def store(request) -> AsyncIterator[StateStore]:
    if request.param == "memory":
        yield MemoryStore(clock=lambda: T0)
        return
    if request.param == "cluster":  # a session's own cluster: its keys go with it
        url, prefix, cluster = request.getfixturevalue("redis_cluster_url"), f"lb{uuid.uuid4().hex[:12]}", True
    else:
        url, prefix, cluster = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix"), False
    redis_store = RedisStore(url, prefix, cluster=cluster)
    yield redis_store
    await redis_store.close()


def pull(campaign: Campaign, arm: int, at: int, name: str) -> Pull:
    bucket, offset, moments = bucket_moments(campaign, at)
    record = {"type": "decision", "campaign": campaign.id, "decision_id": name, "arm": campaign.arms[arm], "at": at}
    return Pull(arm, bucket, offset, moments, name, 0.5, record)


def conversion(campaign: Campaign, name: str, arm: int, at: int, event_id: str | None, **flags) -> PreparedConversion:
    options = {"counts": True, "censored": False} | flags
    record = {"type": "conversion", "campaign": campaign.id, "decision_id": name, "event_id": event_id}
    bucket = at // campaign.bucket_width_us
    return PreparedConversion(name, arm, bucket, 1.0, event_id=event_id, dedup_ttl=3600, record=record, **options)


async def test_create_is_exclusive_and_campaign_round_trips(store: StateStore) -> None:
    campaign = make_campaign()
    assert await store.create_campaign(campaign, {"type": "campaign", "campaign": "c1"})
    assert not await store.create_campaign(campaign, {"type": "campaign", "campaign": "c1"})
    loaded = await store.get_campaign("c1")
    assert loaded is not None and loaded.model_dump() == campaign.model_dump()
    assert await store.get_campaign("nope") is None
    assert await store.list_campaigns() == ["c1"]


async def test_decisions_update_counters_histogram_and_audit(store: StateStore) -> None:
    campaign = make_campaign()
    await store.create_campaign(campaign, {"type": "campaign"})
    arms = [0, 1, 1, 2, 1]
    for i, arm in enumerate(arms):
        result = await store.record_decision(campaign, pull(campaign, arm, T0 + i * 1_000_000, f"d{i}"), None, 60)
        assert result.status is DecisionStatus.NEW
        assert result.counters is not None and result.counters.decisions == i + 1
    state = await store.snapshot(campaign)
    assert state.counters.decisions == 5
    assert state.counters.pulls.tolist() == [1, 3, 1]
    assert int(state.histogram.count.sum()) == 5
    assert state.histogram.moments.shape == (len(state.histogram.count), 1)
    entries = await store.read_audit("c1", 100)
    seqs = [record["seq"] for entry in entries for record in entry.records if record.get("type") == "decision"]
    assert seqs == [1, 2, 3, 4, 5]
    assert await store.audit_backlog() == 6
    await store.ack_audit("c1", [entry.entry_id for entry in entries])
    await store.ack_audit("c1", [entry.entry_id for entry in entries])  # twice is harmless
    assert await store.read_audit("c1", 100) == []


async def test_request_id_returns_the_earlier_decision(store: StateStore) -> None:
    campaign = make_campaign()
    await store.create_campaign(campaign, {})
    first = await store.record_decision(campaign, pull(campaign, 2, T0, "d1"), "req-1", 60)
    assert first.status is DecisionStatus.NEW
    again = await store.record_decision(campaign, pull(campaign, 0, T0 + 5, "d2"), "req-1", 60)
    assert again.status is DecisionStatus.REPEATED
    assert (again.decision_id, again.arm, again.propensity) == ("d1", 2, 0.5)
    assert (await store.snapshot(campaign)).counters.decisions == 1


async def test_conversion_outcomes(store: StateStore) -> None:
    campaign = make_campaign()
    await store.create_campaign(campaign, {})
    for i in range(4):
        await store.record_decision(campaign, pull(campaign, 1, T0 + i, f"d{i}"), None, 60)
    events = [
        conversion(campaign, "d0", 1, T0, "e1"),  # counted
        conversion(campaign, "d0", 1, T0, "e1"),  # same event id: duplicate
        conversion(campaign, "d0", 1, T0, "e2"),  # new event id, decision converted already: repeat
        conversion(campaign, "d1", 1, T0, None),  # counted, deduplicated by decision
        conversion(campaign, "d1", 1, T0, None),  # duplicate by decision
        conversion(campaign, "d2", 1, T0, "e3", censored=True),  # recorded, never counted
        conversion(campaign, "d3", 1, T0, "e4", counts=False),  # a fallback / old-version pull
    ]
    outcomes = await store.apply_conversions(campaign, events)
    assert outcomes == [
        Outcome.COUNTED, Outcome.DUPLICATE, Outcome.REPEAT, Outcome.COUNTED,
        Outcome.DUPLICATE, Outcome.CENSORED, Outcome.STALE,
    ]  # fmt: skip
    state = await store.snapshot(campaign)
    assert state.counters.conversions.tolist() == [0.0, 2.0, 0.0]
    assert int(state.histogram.converted.sum()) == 2
    recorded = [
        r for entry in await store.read_audit("c1", 100) for r in entry.records if r.get("type") == "conversion"
    ]
    assert [r["outcome"] for r in recorded] == ["counted", "repeat", "counted", "censored", "stale"]
    # A retry of the whole batch changes nothing.
    again = await store.apply_conversions(campaign, events)
    assert set(again) == {Outcome.DUPLICATE} | {Outcome.REPEAT, Outcome.CENSORED, Outcome.STALE} & set(again)
    assert (await store.snapshot(campaign)).counters.conversions.tolist() == [0.0, 2.0, 0.0]


def valued(event: PreparedConversion, value: float) -> PreparedConversion:
    return PreparedConversion(**{**event.__dict__, "value": value})


async def test_a_sum_campaign_adds_a_decisions_conversions_up_to_its_max(store: StateStore) -> None:
    """Revenue: the first conversion counts, each later one (new event id) adds its value as a repeat until the
    decision's reward reaches max; a retried event id adds nothing; censored and stale ones add nothing."""
    campaign = make_campaign(reward=REVENUE)
    await store.create_campaign(campaign, {})
    for i in range(3):
        await store.record_decision(campaign, pull(campaign, 1, T0 + i, f"d{i}"), None, 60)
    events = [
        valued(conversion(campaign, "d0", 1, T0, "e1"), 100.0),  # counted: 100
        valued(conversion(campaign, "d0", 1, T0, "e2"), 120.0),  # repeat: 220
        valued(conversion(campaign, "d0", 1, T0, "e2"), 120.0),  # duplicate event id: nothing
        valued(conversion(campaign, "d0", 1, T0, "e3"), 80.0),  # repeat: capped at 250, adds 30
        valued(conversion(campaign, "d0", 1, T0, "e4"), 5.0),  # repeat at the cap: adds nothing
        valued(conversion(campaign, "d1", 1, T0, "e5"), 250.5),  # above max: refused, not remembered
        valued(conversion(campaign, "d1", 1, T0, "e5"), 40.0),  # the same id resent in range: counted
        valued(conversion(campaign, "d1", 1, T0, "e6", censored=True), 60.0),  # censored: nothing
        valued(conversion(campaign, "d2", 1, T0, "e7", counts=False), 60.0),  # stale
        valued(conversion(campaign, "d2", 1, T0, "e8", counts=False), 60.0),  # a stale decision's repeat: nothing
    ]
    outcomes = await store.apply_conversions(campaign, events)
    assert outcomes == [
        Outcome.COUNTED, Outcome.REPEAT, Outcome.DUPLICATE, Outcome.REPEAT, Outcome.REPEAT,
        Uncredited.VALUE_OUT_OF_RANGE, Outcome.COUNTED, Outcome.CENSORED, Outcome.STALE, Outcome.REPEAT,
    ]  # fmt: skip
    state = await store.snapshot(campaign)
    assert state.counters.conversions.tolist() == [0.0, 290.0, 0.0]
    assert state.counters.counted.tolist() == [0, 2, 0]
    assert int(state.histogram.converted.sum()) == 2  # converted pulls, whatever their conversions add
    assert await store.apply_conversions(campaign, events[:5]) == [Outcome.DUPLICATE] * 5  # a retry adds nothing
    more = await store.apply_conversions(campaign, [valued(conversion(campaign, "d1", 1, T0, "e9"), 300.0)])
    assert more == [Uncredited.VALUE_OUT_OF_RANGE]
    assert (await store.snapshot(campaign)).counters.conversions.tolist() == [0.0, 290.0, 0.0]


async def test_a_first_campaign_counts_a_decisions_first_value_up_to_its_max(store: StateStore) -> None:
    """reward.max without sum: values up to max are taken, a repeat adds nothing (today's rule, scaled)."""
    campaign = make_campaign(reward={"max": 250.0})
    await store.create_campaign(campaign, {})
    await store.record_decision(campaign, pull(campaign, 0, T0, "d0"), None, 60)
    events = [
        valued(conversion(campaign, "d0", 0, T0, "e1"), 200.0),
        valued(conversion(campaign, "d0", 0, T0, "e2"), 40.0),
    ]
    assert await store.apply_conversions(campaign, events) == [Outcome.COUNTED, Outcome.REPEAT]
    counters = (await store.snapshot(campaign)).counters
    assert (counters.conversions.tolist(), counters.counted.tolist()) == ([200.0, 0.0, 0.0], [1, 0, 0])


async def test_first_conversions_of_counted_pulls_fill_the_delay_histogram(store: StateStore) -> None:
    """manegueu2020 issue: the delay of a counted pull's first conversion, censored or not, is counted once in
    the same atomic step; duplicates, repeats and conversions of uncounted pulls are not."""
    campaign = make_campaign()
    await store.create_campaign(campaign, {})
    events = [
        conversion(campaign, "d1", 0, T0, "e1", delay_bucket=5),
        conversion(campaign, "d1", 0, T0, "e1", delay_bucket=5),  # duplicate event
        conversion(campaign, "d1", 0, T0, "e2", delay_bucket=7),  # repeat of a converted decision
        conversion(campaign, "d2", 0, T0, None, delay_bucket=40, censored=True),  # censored: still data
        conversion(campaign, "d3", 1, T0, None, delay_bucket=5, counts=False),  # stale pull: not counted
        conversion(campaign, "d4", 2, T0, None, delay_bucket=0),
    ]
    await store.apply_conversions(campaign, events)
    delays = (await store.snapshot(campaign)).delay_counts()
    expected = np.zeros_like(delays)
    expected[0, 5] = expected[0, 40] = expected[2, 0] = 1
    np.testing.assert_array_equal(delays, expected)


async def test_paused_and_unknown_campaigns(store: StateStore) -> None:
    campaign = make_campaign()
    await store.create_campaign(campaign, {})
    paused = await store.set_status("c1", CampaignStatus.PAUSED, {"type": "campaign", "action": "pause"})
    assert paused is not None and paused.status is CampaignStatus.PAUSED
    assert (await store.get_campaign("c1")).status is CampaignStatus.PAUSED  # type: ignore[union-attr]
    result = await store.record_decision(campaign, pull(campaign, 0, T0, "d0"), None, 60)
    assert result.status is DecisionStatus.PAUSED
    with pytest.raises(CampaignRefused, match="paused"):
        await store.apply_conversions(campaign, [conversion(campaign, "d0", 0, T0, None)])
    await store.set_status("c1", CampaignStatus.ACTIVE, {})
    assert (await store.record_decision(campaign, pull(campaign, 0, T0, "d0"), None, 60)).status is DecisionStatus.NEW
    ghost = make_campaign("ghost")
    assert (await store.record_decision(ghost, pull(ghost, 0, T0, "x"), None, 60)).status is DecisionStatus.UNKNOWN
    assert (await store.record_fallback(ghost, pull(ghost, 0, T0, "y"), None, 60)).status is DecisionStatus.UNKNOWN
    assert await store.read_audit("ghost", 10) == []  # a refused fallback is not audited under an unknown id
    with pytest.raises(CampaignRefused) as refused:
        await store.apply_conversions(ghost, [conversion(ghost, "x", 0, T0, None)])
    assert refused.value.reason is DecisionStatus.UNKNOWN
    assert await store.set_status("ghost", CampaignStatus.PAUSED, {}) is None


async def test_refusals_come_in_one_order_in_both_stores(store: StateStore) -> None:
    """Moved before paused, for decisions and feedback alike (store/lua/campaign_lib.lua, memory.py)."""
    campaign = make_campaign()
    await store.create_campaign(campaign, {})
    await store.set_status("c1", CampaignStatus.PAUSED, {"type": "campaign", "action": "pause"})
    stale = campaign.model_copy(update={"version": campaign.version + 1})
    assert (await store.record_decision(stale, pull(stale, 0, T0, "d0"), None, 60)).status is DecisionStatus.MOVED
    with pytest.raises(CampaignRefused) as refused:
        await store.apply_conversions(stale, [conversion(stale, "d0", 0, T0, None)])
    assert refused.value.reason is DecisionStatus.MOVED


async def test_fallback_decisions_are_audited_and_keep_their_request_id(store: StateStore) -> None:
    campaign = make_campaign()
    await store.create_campaign(campaign, {})
    await store.ack_audit("c1", [entry.entry_id for entry in await store.read_audit("c1", 10)])
    first = await store.record_fallback(campaign, pull(campaign, 0, T0, "f1"), "req-9", 60)
    again = await store.record_fallback(campaign, pull(campaign, 0, T0, "f2"), "req-9", 60)
    assert first.status is DecisionStatus.NEW and again.status is DecisionStatus.REPEATED
    assert again.decision_id == "f1"
    await store.record_fallback(campaign, pull(campaign, 0, T0, "f3"), None, 60)
    recorded = [r["decision_id"] for entry in await store.read_audit("c1", 10) for r in entry.records]
    assert recorded == ["f1", "f3"]
    assert (await store.snapshot(campaign)).counters.decisions == 0


async def test_fold_matured_moves_counts_once(store: StateStore) -> None:
    campaign = make_campaign(delay={"family": "uniform", "low": 0, "high": 100})
    await store.create_campaign(campaign, {})
    for i in range(3):
        await store.record_decision(campaign, pull(campaign, 0, T0 + i, f"d{i}"), None, 60)
    await store.record_decision(campaign, pull(campaign, 1, T0 + 10 * campaign.bucket_width_us, "late"), None, 60)
    state = await store.snapshot(campaign)
    old = state.histogram.arm == 0
    for _ in range(2):  # idempotent
        await store.fold_matured(campaign, state.histogram.arm[old], state.histogram.bucket[old])
    after = await store.snapshot(campaign)
    assert after.counters.matured.tolist() == [3, 0, 0]
    assert after.histogram.arm.tolist() == [1]
    assert after.counters.pulls.tolist() == [3, 1, 0]


async def test_concurrent_decisions_are_all_counted(store: StateStore) -> None:
    campaign = make_campaign()
    await store.create_campaign(campaign, {})
    rng = np.random.default_rng(3)
    arms = rng.integers(0, 3, size=200)
    await asyncio.gather(
        *(
            store.record_decision(campaign, pull(campaign, int(a), T0 + i, f"d{i}"), None, 60)
            for i, a in enumerate(arms)
        )
    )
    state = await store.snapshot(campaign)
    assert state.counters.decisions == 200
    assert state.counters.pulls.tolist() == np.bincount(arms, minlength=3).tolist()


async def test_audit_lease(store: StateStore) -> None:
    """One writer at a time drains a campaign's queue on Redis (several workers), and no lease is taken on an
    empty queue there; memory has one process."""
    if isinstance(store, RedisStore):
        assert not await store.claim_audit("c1", 5.0)
        await store.client.xadd(store.keys.audit("c1"), {"r": b"{}"})
    assert await store.claim_audit("c1", 5.0)
    assert await store.claim_audit("c1", 5.0)  # the holder keeps it
    if isinstance(store, RedisStore):
        other = RedisStore("redis://unused", store.keys.prefix, client=store.client)
        assert not await other.claim_audit("c1", 5.0)


async def test_value_sums_are_ieee_doubles_in_arrival_order(store: StateStore) -> None:
    """Redis must add like Python (a replay recomputes the sums): HINCRBYFLOAT's long double would not."""
    campaign = make_campaign()
    await store.create_campaign(campaign, {})
    values = [0.1, 0.2, 0.7, 0.7, 0.7, 1 / 3]
    for i, value in enumerate(values):
        await store.record_decision(campaign, pull(campaign, 0, T0 + i, f"d{i}"), None, 60)
        event = conversion(campaign, f"d{i}", 0, T0, f"e{i}")
        await store.apply_conversions(campaign, [PreparedConversion(**{**event.__dict__, "value": value})])
    expected = 0.0
    for value in values:
        expected += value
    assert (await store.snapshot(campaign)).counters.conversions[0] == expected  # exact, not approximate


async def test_a_pause_between_chunks_reports_what_was_applied(redis_url: str, redis_prefix: str) -> None:
    """Redis applies a large batch in atomic chunks; a pause landing between two of them must leave the
    first chunk's outcomes visible to the caller, not report the whole batch as refused."""
    from latebandit.store import redis as redis_module

    store = RedisStore(redis_url, redis_prefix)
    campaign = make_campaign()
    await store.create_campaign(campaign, {})
    size = redis_module.CONVERSIONS_PER_SCRIPT + 5
    events = [conversion(campaign, f"d{i}", 0, T0, f"e{i}") for i in range(size)]
    original = store._apply_chunk
    calls = 0

    async def pause_after_first(campaign_: Campaign, chunk: list[PreparedConversion]) -> list[Outcome]:
        nonlocal calls
        calls += 1
        if calls == 2:
            await store.set_status("c1", CampaignStatus.PAUSED, {})
        return await original(campaign_, chunk)

    store._apply_chunk = pause_after_first  # type: ignore[method-assign]
    with pytest.raises(CampaignRefused) as refused:
        await store.apply_conversions(campaign, events)
    assert len(refused.value.applied) == redis_module.CONVERSIONS_PER_SCRIPT
    assert set(refused.value.applied) == {Outcome.COUNTED}
    await store.close()


operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("decide"), st.integers(0, 2), st.integers(0, 3 * 86_400), st.sampled_from([None, "r1", "r2"])
        ),
        st.tuples(
            st.just("convert"),
            st.integers(0, 30),  # which decision (by order; missing ones are attributed all the same)
            st.sampled_from([None, "e1", "e2", "e3", "e4"]),
            st.sampled_from([0.0, 0.1, 0.7, 1.0, 1.5]),  # times the campaign's reward.max
            st.booleans(),  # censored
            st.integers(0, 63),  # delay bucket
            st.booleans(),  # counts (a counted pull of the current version)
        ),
        st.tuples(st.just("pause"), st.booleans()),
        st.tuples(st.just("fold")),
        st.tuples(st.just("wait"), st.sampled_from([1800, 3601])),  # seconds: past a dedup entry's 3600 s
    ),
    max_size=40,
)


@pytest.mark.parametrize("reward", [None, REVENUE], ids=["first", "sum"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=operations)
async def test_memory_and_redis_agree_on_any_sequence(redis_url: str, reward: dict | None, steps: list[tuple]) -> None:
    """The Lua scripts and the memory store must be one semantics: same outcomes, same state, same audit; on a
    sum campaign too, through dedup entries (and the credited rewards kept with them) expiring."""
    prefix = f"lbprop{uuid.uuid4().hex[:10]}"
    clocks = [[T0], [T0]]
    redis_store = RedisStore(redis_url, prefix, clock=lambda: clocks[1][0])
    stores: list[StateStore] = [MemoryStore(clock=lambda: clocks[0][0]), redis_store]
    campaign = make_campaign(reward=reward)
    seen: list[list[object]] = [[], []]
    try:
        for position, store in enumerate(stores):
            await store.create_campaign(campaign, {"type": "campaign"})
            for step in steps:
                if step[0] == "wait":
                    clocks[position][0] += step[1] * MICROS
                    continue
                seen[position].append(await _apply(store, campaign, step))
            state = await store.snapshot(campaign)
            audit = [r for entry in await store.read_audit("c1", 1000) for r in entry.records]
            hist = state.histogram
            cells = zip(
                hist.arm.tolist(), hist.bucket.tolist(), hist.count.tolist(), hist.converted.tolist(), strict=True
            )
            counters = state.counters
            seen[position] += [counters.decisions, counters.pulls.tolist(), counters.conversions.tolist()]
            seen[position] += [counters.counted.tolist()]
            seen[position] += [counters.matured.tolist(), sorted(cells), audit, state.delay_counts().tolist()]
        assert seen[0] == seen[1]
    finally:
        await delete_keys(redis_store.client, prefix)
        await redis_store.close()


async def _apply(store: StateStore, campaign: Campaign, step: tuple) -> object:
    kind = step[0]
    if kind == "decide":
        _, arm, seconds, request_id = step
        at = T0 - seconds * 1_000_000
        # a request id outlives the waits: Redis expires it by its own clock, the memory store by the test's
        result = await store.record_decision(campaign, pull(campaign, arm, at, f"d{at}-{arm}"), request_id, 86_400)
        return (result.status, result.decision_id)
    if kind == "convert":
        _, which, event_id, value, censored, delay_bucket, counts = step
        at = T0 - which * 3_600_000_000
        event = conversion(campaign, f"d{which}", which % 3, at, event_id, censored=censored, counts=counts)
        changed = {**event.__dict__, "value": value * campaign.reward.max, "delay_bucket": delay_bucket}
        try:
            return await store.apply_conversions(campaign, [PreparedConversion(**changed)])
        except CampaignRefused as refused:
            return str(refused)
    if kind == "pause":
        status = CampaignStatus.PAUSED if step[1] else CampaignStatus.ACTIVE
        return (await store.set_status("c1", status, {"type": "campaign", "action": status.value})).status
    state = await store.snapshot(campaign)
    old = state.histogram.bucket < (T0 - 2 * 86_400 * 1_000_000) // campaign.bucket_width_us
    await store.fold_matured(campaign, state.histogram.arm[old], state.histogram.bucket[old])
    return int(old.sum())


@pytest.mark.redis
async def test_what_each_script_keeps_is_bounded(redis_url: str, redis_prefix: str) -> None:
    """Sizes and expiry read straight from Redis, script by script: a script that stopped expiring or sweeping
    what it adds fails here (apply_anonymous and the schedule scripts: tests/integration/test_schedule_store.py;
    outcomes are compared with the memory store above, sizes only exist in Redis)."""
    clock = [T0]
    store = RedisStore(redis_url, redis_prefix, clock=lambda: clock[0])
    keys, client = Keys(redis_prefix), store.client
    try:
        campaign = make_campaign()
        await store.create_campaign(campaign, {})
        await store.record_decision(campaign, pull(campaign, 0, T0, "d0"), "r1", 60)  # record_decisions
        await store.record_fallback(campaign, pull(campaign, 0, T0, "f0"), "r2", 60)
        for request in ("r1", "r2"):
            assert 0 < await client.ttl(keys.request("c1", request)) <= 60
        early = [conversion(campaign, f"d{i}", 0, T0, f"e{i}") for i in range(50)]
        await store.apply_conversions(campaign, early)
        assert await client.zcard(keys.dedup("c1")) == 100
        clock[0] += 3601 * MICROS  # past the entries' dedup_ttl (3600 s): the next batch sweeps them
        await store.apply_conversions(campaign, [conversion(campaign, f"n{i}", 0, T0, f"m{i}") for i in range(50)])
        assert await client.zcard(keys.dedup("c1")) == 100
        assert await client.zscore(keys.dedup("c1"), "ev:e0") is None
        state = await store.snapshot(campaign)
        assert await client.hlen(keys.cells("c1")) > 0
        await store.fold_matured(campaign, state.histogram.arm, state.histogram.bucket)
        assert await client.hlen(keys.cells("c1")) == 0  # folded cells leave the hash
        revenue = make_campaign("c2", reward=REVENUE)  # apply_conversions of a sum campaign: credited rewards
        await store.create_campaign(revenue, {})
        await store.apply_conversions(revenue, [conversion(revenue, f"d{i}", 0, T0, f"e{i}") for i in range(50)])
        assert await client.hlen(keys.credited("c2")) == 50
        clock[0] += 3601 * MICROS  # they leave with their dedup entries
        await store.apply_conversions(revenue, [conversion(revenue, f"n{i}", 0, T0, f"m{i}") for i in range(50)])
        assert await client.hlen(keys.credited("c2")) == 50 and await client.zcard(keys.dedup("c2")) == 100
        assert await client.hget(keys.credited("c2"), "cv:d0") is None
    finally:
        await store.close()


@pytest.mark.redis
async def test_feedback_entries_of_either_layout_are_read(redis_url: str, redis_prefix: str) -> None:
    """A batch is queued as two fields (records and outcomes, duplicates left out); the per-event fields that
    workers of earlier versions queued are still read, so that an upgrade loses none left in the queue."""
    store = RedisStore(redis_url, redis_prefix, clock=lambda: T0)
    keys, client = Keys(redis_prefix), store.client
    try:
        campaign = make_campaign()
        await store.create_campaign(campaign, {})
        await store.ack_audit("c1", [entry.entry_id for entry in await store.read_audit("c1", 10)])
        batch = [conversion(campaign, "d1", 0, T0, "e1"), conversion(campaign, "d1", 0, T0, "e1"),
                 conversion(campaign, "d1", 0, T0, "e2")]  # fmt: skip
        assert await store.apply_conversions(campaign, batch) == ["counted", "duplicate", "repeat"]
        await client.xadd(keys.audit("c1"), {"1:counted": b'{"event_id": "old1"}', "3:repeat": b'{"event_id": "old3"}'})
        entries = await store.read_audit("c1", 10)
        assert [(r["event_id"], r["outcome"]) for entry in entries for r in entry.records] == [
            ("e1", "counted"), ("e2", "repeat"), ("old1", "counted"), ("old3", "repeat")
        ]  # fmt: skip
        fields = await client.xrange(keys.audit("c1"), count=1)
        assert set(fields[0][1]) == {b"o", b"b"}
    finally:
        await store.close()
