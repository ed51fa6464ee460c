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

# Busy for ARGV[1] loop turns, then answers ARGV[2]: Redis runs one script at a time, so this holds the server.
SLOW = "local n = 0 for i = 1, tonumber(ARGV[1]) do n = n + 1 end return ARGV[2]"
ANSWER = "return ARGV[1]"


@pytest.fixture
async def client(tmp_path) -> AsyncIterator[aioredis.Redis]:
    with redis_server(tmp_path / "redis") as node:
        client = aioredis.Redis.from_url(node.url)
        yield client
        await client.aclose()


async def turns_for(client: aioredis.Redis, seconds: float) -> int:
    """Loop turns that keep this server's Lua busy about ``seconds`` (machines differ tenfold)."""
    turns, slow = 100_000, client.register_script(SLOW)
    while True:
        started = time.perf_counter()
        await slow(args=[turns, "calibrating"])
        if time.perf_counter() - started >= seconds / 4:
            return int(turns * seconds / (time.perf_counter() - started))
        turns *= 4


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
    first = asyncio.create_task(calls.run(slow, [], [turns, "first"]))
    await asyncio.sleep(0.1)  # sent, and Redis is busy with it
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await calls.run(answer, [], ["second"]) == b"second"
    await calls.disconnect()


async def test_a_call_past_its_timeout_fails_and_the_next_gets_its_own_reply(client) -> None:
    calls = ScriptConnections(client, limit=1, timeout=0.1)
    slow, answer = client.register_script(SLOW), client.register_script(ANSWER)
    turns = await turns_for(client, 0.5)
    started = time.perf_counter()
    with pytest.raises(TimeoutError):
        await calls.run(slow, [], [turns, "late"])
    assert time.perf_counter() - started < 0.4  # bounded by the timeout, not by the script
    await client.ping()  # answered once the slow script has finished: its reply went to the closed connection
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
    before = (await client.info("clients"))["connected_clients"]
    replies = await asyncio.gather(*(calls.run(slow, [], [turns, str(n)]) for n in range(8)))
    assert replies == [str(n).encode() for n in range(8)]
    assert (await client.info("clients"))["connected_clients"] - before == 2
    await calls.close()
    assert await clients_settle(client, before)


async def clients_settle(client: aioredis.Redis, expected: int) -> bool:
    """Whether the server counts ``expected`` clients within a second (it learns of a close asynchronously)."""
    for _ in range(100):
        if (await client.info("clients"))["connected_clients"] == expected:
            return True
        await asyncio.sleep(0.01)
    return False


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
    await asyncio.sleep(1.0)  # Redis done with the first script
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
    before = (await client.info("clients"))["connected_clients"]
    calls = ScriptConnections(client, limit=2, timeout=5.0)
    slow = client.register_script(SLOW)
    turns = await turns_for(client, 0.2)
    call = asyncio.create_task(calls.run(slow, [], [turns, "in flight"]))
    await asyncio.sleep(0.05)
    await calls.close()
    assert await call == b"in flight"
    assert await clients_settle(client, before)


async def test_a_closed_store_leaves_no_connection_open(tmp_path) -> None:
    """Its pool's connections (reads) and its script connections alike."""
    with redis_server(tmp_path / "redis") as node:
        probe = aioredis.Redis.from_url(node.url)
        before = (await probe.info("clients"))["connected_clients"]
        store = RedisStore(node.url, "lb")
        campaign = Campaign(id="c", arms=["a", "b"], policy={"name": "ucb1", "params": {}}, created_at=0)
        assert await store.create_campaign(campaign, {"type": "campaign", "campaign": "c", "action": "create"})
        assert await store.get_campaign("c") is not None
        await store.close()
        assert await clients_settle(probe, before)
        await probe.aclose()
