"""Scripts sent on the store's own connections (store/script_calls.py) keep redis-py's promises: a call cut
short never hands its reply to a later call, a call's time is bounded, a script Redis forgot is loaded again,
a burst shares a bounded number of connections, and a closed store leaves none open. Each test owns its
Redis server: a slow script blocks the whole server, and SCRIPT FLUSH would reach every other user of a
shared one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import DataError

from latebandit.campaign import Campaign
from latebandit.store.redis import RedisStore
from latebandit.store.script_calls import ScriptConnections
from tests.faults import redis_server
from tests.redis_probes import SLOW, answer_busy, connected_clients, running_a_script, turns_for, until_clients
from tests.waiting import until_async

ANSWER = "return ARGV[1]"


@pytest.fixture
async def client(tmp_path) -> AsyncIterator[aioredis.Redis]:
    with redis_server(tmp_path / "redis") as node:
        client = aioredis.Redis.from_url(node.url)
        yield client
        await client.aclose()


async def test_redis_receives_the_arguments_redis_py_would_send(client) -> None:
    """The store packs with hiredis, not redis-py: the keys and arguments of every kind the store sends reach
    Redis as redis-py's own script call delivers them."""
    calls = ScriptConnections(client, limit=1, timeout=5.0)
    echo = client.register_script("local out = {} for _, v in ipairs(KEYS) do out[#out + 1] = v end "
                                  "for _, v in ipairs(ARGV) do out[#out + 1] = v end return out")  # fmt: skip
    keys = ["lb:{c}:counters", "lb:{c}:é"]
    args = [0, -7, 2**63, 1.0, 0.1 + 0.2, -1e-300, 1e20, "", "ascii", "délai ⏳", b"", b"\x00\r\n$3\r\n\xff", repr(0.5)]
    assert await calls.run(echo, keys, args) == await echo(keys, args)
    await calls.disconnect()


async def test_an_argument_redis_py_would_refuse_is_refused_as_redis_py_refuses_it(client) -> None:
    """hiredis raises TypeError for a bool; the store maps redis-py's DataError (a RedisError) to
    StoreUnavailable, so the call raises that, and the connection stays usable."""
    calls = ScriptConnections(client, limit=1, timeout=5.0)
    answer = client.register_script(ANSWER)
    with pytest.raises(DataError):
        await calls.run(answer, [], [True])
    assert await calls.run(answer, [], ["next"]) == b"next"
    await calls.disconnect()


async def test_a_cancelled_call_never_hands_its_reply_to_the_next(client) -> None:
    calls = ScriptConnections(client, limit=1, timeout=30.0)  # one connection: the next call gets the same one
    slow, answer = client.register_script(SLOW), client.register_script(ANSWER)
    turns = await turns_for(client, 0.5)
    await answer_busy(client)
    first = asyncio.create_task(calls.run(slow, [], [turns, "first"]))
    await until_async(lambda: running_a_script(client), "Redis running the first call's script")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await until_async(lambda: is_idle(client), "the script's end")  # its reply is sent, and must reach no one
    assert await calls.run(answer, [], ["second"]) == b"second"
    await calls.disconnect()


async def test_a_call_past_its_timeout_fails_and_the_next_gets_its_own_reply(client) -> None:
    calls = ScriptConnections(client, limit=1, timeout=0.1)
    slow, answer = client.register_script(SLOW), client.register_script(ANSWER)
    turns = await turns_for(client, 0.5)
    await answer_busy(client)
    with pytest.raises(TimeoutError):
        await calls.run(slow, [], [turns, "late"])
    assert await running_a_script(client)  # failed by its timeout, not at the script's end
    await until_async(lambda: is_idle(client), "the script's end")  # its reply went to the closed connection
    assert await calls.run(answer, [], ["own"]) == b"own"
    await calls.disconnect()


async def test_a_script_redis_forgot_is_loaded_again(client) -> None:
    calls = ScriptConnections(client, limit=2, timeout=5.0)
    answer = client.register_script(ANSWER)
    assert await calls.run(answer, [], ["before"]) == b"before"
    await client.script_flush()
    assert await calls.run(answer, [], ["after"]) == b"after"
    assert (await client.script_exists(answer.sha)) == [True]
    await calls.disconnect()


async def test_a_burst_shares_at_most_limit_connections(client) -> None:
    calls = ScriptConnections(client, limit=2, timeout=30.0)
    slow = client.register_script(SLOW)
    turns = await turns_for(client, 0.05)
    before = await connected_clients(client)
    replies = await asyncio.gather(*(calls.run(slow, [], [turns, str(n)]) for n in range(8)))
    assert replies == [str(n).encode() for n in range(8)]
    assert await connected_clients(client) - before == 2
    await calls.close()
    await until_clients(client, before)


async def is_idle(client: aioredis.Redis) -> bool:
    return not await running_a_script(client)


async def test_the_wait_for_a_connection_counts_in_the_timeout(client) -> None:
    """A hung Redis sheds a burst: a call queued behind others fails by its own deadline, not theirs plus it."""
    calls = ScriptConnections(client, limit=1, timeout=0.3)
    slow = client.register_script(SLOW)
    turns = await turns_for(client, 1.0)
    started = time.perf_counter()
    first = asyncio.create_task(calls.run(slow, [], [turns, "first"]))
    queued = asyncio.create_task(calls.run(slow, [], [turns, "queued"]))
    for call in (first, queued):
        with pytest.raises(TimeoutError):
            await call
    assert time.perf_counter() - started < 0.5
    await client.ping()  # answered once Redis is done with the first script
    await calls.close()


async def test_dropping_the_idle_connections_never_hands_a_call_a_closing_one(client) -> None:
    calls = ScriptConnections(client, limit=4, timeout=5.0)
    answer = client.register_script(ANSWER)
    await calls.run(answer, [], ["warm"])  # one idle connection
    dropping = asyncio.create_task(calls.disconnect())  # as after another call met a dead connection
    await asyncio.sleep(0)  # the drop has started
    assert await calls.run(answer, [], ["meanwhile"]) == b"meanwhile"
    await dropping
    await calls.close()


async def test_closing_closes_a_connection_in_use_once_its_call_ends(client) -> None:
    before = await connected_clients(client)
    calls = ScriptConnections(client, limit=2, timeout=5.0)
    slow = client.register_script(SLOW)
    turns = await turns_for(client, 0.2)
    await answer_busy(client)
    call = asyncio.create_task(calls.run(slow, [], [turns, "in flight"]))
    await until_async(lambda: running_a_script(client), "Redis running the call's script")
    await calls.close()
    assert await call == b"in flight"
    await until_clients(client, before)


async def test_a_closed_store_leaves_no_connection_open(tmp_path) -> None:
    """Its pool's connections (reads) and its script connections alike."""
    with redis_server(tmp_path / "redis") as node:
        probe = aioredis.Redis.from_url(node.url)
        before = await connected_clients(probe)
        store = RedisStore(node.url, "lb")
        campaign = Campaign(id="c", arms=["a", "b"], policy={"name": "ucb1", "params": {}}, created_at=0)
        assert await store.create_campaign(campaign, {"type": "campaign", "campaign": "c", "action": "create"})
        assert await store.get_campaign("c") is not None
        await store.close()
        await until_clients(probe, before)
        await probe.aclose()
