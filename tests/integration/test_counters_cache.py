"""A worker's cached counters after each of its decisions are Redis's, whichever way the record script
answered: all of the counters, or (while the worker's were current) only the new decision count, the
worker adding its own pulls. Two workers share a campaign; a third store reads Redis afresh."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latebandit.campaign import Campaign
from latebandit.store.base import Counters
from latebandit.store.redis import RedisStore
from tests.integration.test_store_contract import T0, _apply, conversion, make_campaign, operations, pull

pytestmark = pytest.mark.redis

LONG = 3600.0  # seconds a snapshot may be reused: the cache is what the worker holds, never re-read meanwhile


def same(left: Counters | None, right: Counters) -> bool:
    def values(counters: Counters) -> tuple:
        return counters.decisions, counters.pulls.tolist(), counters.conversions.tolist(), counters.matured.tolist()

    return left is not None and values(left) == values(right)


class Replies:
    """Counts how record_decisions answered: the decision count alone, or the whole counters hash."""

    def __init__(self, store: RedisStore) -> None:
        self.count_only = self.whole = 0
        run = store._run

        async def counted(script: str, keys: list[str], args: list[object]) -> object:
            reply = await run(script, keys, args)
            if script == "record_decisions" and reply[2] != []:
                if isinstance(reply[2], int):
                    self.count_only += 1
                else:
                    self.whole += 1
            return reply

        store._run = counted  # type: ignore[method-assign]


@pytest.fixture
async def stores(redis_url: str) -> AsyncIterator[tuple[RedisStore, RedisStore, RedisStore]]:
    prefix = f"lbcache{uuid.uuid4().hex[:10]}"
    first, second, reader = (RedisStore(redis_url, prefix, clock=lambda: T0) for _ in range(3))
    yield first, second, reader
    for key in [key async for key in reader.client.scan_iter(match=f"{prefix}:*")]:
        await reader.client.delete(key)
    for store in (first, second, reader):
        await store.close()


async def decide(store: RedisStore, reader: RedisStore, campaign: Campaign, arm: int, name: str) -> None:
    """One decision; then the counters it answered and the ones its store keeps are Redis's."""
    result = await store.record_decision(campaign, pull(campaign, arm, T0, name), None, 60)
    fresh = (await reader.snapshot(campaign)).counters
    assert same(result.counters, fresh)
    assert same((await store.snapshot(campaign, LONG)).counters, fresh)


async def test_only_the_count_while_the_workers_counters_are_current(stores) -> None:
    first, second, reader = stores
    replies = Replies(first)
    campaign = make_campaign()
    await first.create_campaign(campaign, {})
    await first.snapshot(campaign, LONG)
    for i in range(5):
        await decide(first, reader, campaign, i % 3, f"a{i}")
    assert (replies.count_only, replies.whole) == (5, 0)
    changes = [
        lambda: second.record_decision(campaign, pull(campaign, 1, T0, "other"), None, 60),  # another worker's
        lambda: second.apply_conversions(campaign, [conversion(campaign, "a0", 0, T0, "e1")]),  # S
        lambda: second.fold_matured(campaign, *_cells(reader, campaign)),  # matured
    ]
    for change in changes:
        await change()
        await decide(first, reader, campaign, 2, f"after{replies.whole}")
        await decide(first, reader, campaign, 0, f"then{replies.whole}")
    assert (replies.count_only, replies.whole) == (8, 3)  # after each change, the whole hash once


def _cells(reader: RedisStore, campaign: Campaign):
    """Every cell of the histogram as (arms, buckets), read synchronously from the reader's last snapshot."""
    cached = reader._cache[campaign.id]
    return cached.histogram.arm, cached.histogram.bucket


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=operations, workers=st.lists(st.integers(0, 1), min_size=40, max_size=40),
       reads=st.lists(st.booleans(), min_size=40, max_size=40))  # fmt: skip
async def test_two_workers_caches_follow_redis_through_any_sequence(redis_url, steps, workers, reads) -> None:
    prefix = f"lbcache{uuid.uuid4().hex[:10]}"
    pair = [RedisStore(redis_url, prefix, clock=lambda: T0) for _ in range(2)]
    reader = RedisStore(redis_url, prefix, clock=lambda: T0)
    campaign = make_campaign()
    try:
        await reader.create_campaign(campaign, {})
        for position, (step, worker, read) in enumerate(zip(steps, workers, reads, strict=False)):
            store = pair[worker]
            if read:  # the worker (re)reads its snapshot, as /choose does each snapshot_interval
                await store.snapshot(campaign)
            if step[0] != "decide":
                await _apply(store, campaign, step)
                continue
            result = await store.record_decision(campaign, pull(campaign, step[1], T0, f"d{position}"), step[3], 60)
            fresh = (await reader.snapshot(campaign)).counters
            if result.counters is None:  # the campaign refused (paused): the cache is left as it was
                continue
            assert same(result.counters, fresh)
            if campaign.id in store._cache:
                assert same(store._cache[campaign.id].counters, fresh)
    finally:
        for key in [key async for key in reader.client.scan_iter(match=f"{prefix}:*")]:
            await reader.client.delete(key)
        for each in (*pair, reader):
            await each.close()
