"""After Redis restarts, the connections a store pooled before are all dead. The first command to meet one
fails (the store cannot know whether a script ran before the connection broke, so it never retries); none
after it may: a stale connection left in the pool would fail some later request, long after Redis is back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from latebandit.campaign import Campaign
from latebandit.store.base import StoreUnavailable
from latebandit.store.redis import RedisStore
from tests.faults import redis_server


async def test_one_failure_after_a_restart_then_none(tmp_path) -> None:
    with redis_server(tmp_path / "redis") as node:
        store = RedisStore(node.url, "lb")
        await asyncio.gather(*(store.client.blpop(["nothing"], timeout=0.05) for _ in range(20)))  # 20 pooled
        node.restart()
        with pytest.raises(StoreUnavailable):
            await store.ping()
        await asyncio.gather(*(store.ping() for _ in range(20)))  # every one on a fresh connection
        await store.close()


async def test_script_connections_too(tmp_path) -> None:
    """Scripts go on the store's own connections (store/script_calls.py): those are dropped the same way."""

    def campaign(n: int) -> Campaign:
        return Campaign(id=f"c{n}", arms=["a", "b"], policy={"name": "ucb1", "params": {}}, created_at=0)

    def create(n: int) -> Awaitable[bool]:
        return store.create_campaign(campaign(n), {"type": "campaign", "campaign": f"c{n}", "action": "create"})

    with redis_server(tmp_path / "redis") as node:
        store = RedisStore(node.url, "lb")
        assert all(await asyncio.gather(*(create(n) for n in range(20))))  # 20 script connections in flight at once
        node.restart()
        with pytest.raises(StoreUnavailable):
            await create(20)
        assert all(await asyncio.gather(*(create(n) for n in range(21, 41))))  # every one on a fresh connection
        await store.close()
