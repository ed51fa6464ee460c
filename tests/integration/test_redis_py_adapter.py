"""What store/redis_py_adapter.py takes from redis-py beyond its public API, each piece checked on its own
against a real Redis: a redis-py version that changes one of them fails here, naming it, before it fails the
store (pyproject.toml pins the versions that passed). Each test owns its Redis server: SCRIPT FLUSH and a busy
script would reach every other user of a shared one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import hiredis
import pytest
import redis.asyncio as aioredis
from redis.exceptions import DataError, NoScriptError

from latebandit.store.redis_py_adapter import close_now, evalsha, must_reconnect, reload, untimed_connection
from tests.faults import RedisServer, redis_server
from tests.redis_probes import SLOW, connected_clients, turns_for, until_clients

ANSWER = "return {KEYS[1], ARGV[1]}"


@pytest.fixture
async def node(tmp_path) -> AsyncIterator[RedisServer]:
    with redis_server(tmp_path / "redis") as server:
        yield server


@pytest.fixture
async def client(node: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(node.url)
    yield client
    await client.aclose()


async def test_a_connection_takes_the_pools_settings_but_not_its_timeout(node: RedisServer) -> None:
    """``connection_kwargs`` and ``connection_class`` carry the URL's database, RESP version and client name;
    the socket timeout is gone, and a maintenance notice's reset (``orig_socket_timeout``) does not restore it."""
    url = node.url.removesuffix("/0") + "/3?protocol=3&client_name=adapter"
    pool = aioredis.BlockingConnectionPool.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    connection = untimed_connection(pool)
    await connection.send_command("CLIENT", "INFO")
    info = await connection.read_response()
    info = info.decode() if isinstance(info, bytes) else info
    assert {"db=3", "resp=3", "name=adapter"} <= set(info.split())
    assert connection.socket_timeout is None
    connection.reset_tmp_settings(reset_relaxed_timeout=True)  # what the end of a maintenance window does
    assert connection.socket_timeout is None
    await close_now(connection)
    await pool.aclose()


async def test_a_connection_marked_for_reconnection_must_reconnect(client: aioredis.Redis) -> None:
    connection = untimed_connection(client.connection_pool)
    assert not must_reconnect(connection)
    connection.mark_for_reconnect()  # what a maintenance notice (the host is moving) does
    assert must_reconnect(connection)


async def test_evalsha_sends_what_redis_pys_encoder_would_and_refuses_what_it_refuses(client: aioredis.Redis) -> None:
    """hiredis packs the bytes redis-py's ``pack_command`` packs for every kind of argument the store sends,
    Redis answers them as redis-py's own script call, and a bool is refused as redis-py refuses it, a
    DataError, leaving the connection usable."""
    connection = untimed_connection(client.connection_pool)
    echo = client.register_script("local out = {} for _, v in ipairs(KEYS) do out[#out + 1] = v end "
                                  "for _, v in ipairs(ARGV) do out[#out + 1] = v end return out")  # fmt: skip
    keys = ["lb:{c}:counters", "lb:{c}:é"]
    args = [0, -7, 2**63, 1.0, 0.1 + 0.2, -1e-300, 1e20, "", "délai ⏳", b"", b"\x00\r\n$3\r\n\xff", repr(0.5)]
    command = ("EVALSHA", echo.sha, len(keys), *keys, *args)
    assert hiredis.pack_command(command) == b"".join(connection.pack_command(*command))  # type: ignore[arg-type]
    assert await evalsha(connection, await reload(client, echo), keys, args) == await echo(keys, args)
    with pytest.raises(DataError):
        await evalsha(connection, echo.sha, keys, [True])
    assert await evalsha(connection, echo.sha, [], ["after"]) == [b"after"]
    await close_now(connection)


async def test_a_call_cut_short_leaves_its_connection_disconnected(client: aioredis.Redis) -> None:
    """``send_packed_command`` and ``read_response`` disconnect on any exception: the reply of a call cut short
    can reach no later call, and the connection reconnects when used again."""
    connection = untimed_connection(client.connection_pool)
    slow, answer = client.register_script(SLOW), client.register_script(ANSWER)
    for script in (slow, answer):
        await reload(client, script)
    turns = await turns_for(client, 0.5)
    await connection.connect()  # so that the timeout below cuts the wait for the reply, not the connecting
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await evalsha(connection, slow.sha, [], [turns, "late"])
    assert not connection.is_connected
    assert await evalsha(connection, answer.sha, ["k"], ["own"]) == [b"k", b"own"]  # after the slow one's end
    await close_now(connection)


async def test_a_script_redis_lost_is_loaded_again_and_its_digest_kept(client: aioredis.Redis) -> None:
    connection = untimed_connection(client.connection_pool)
    script = client.register_script(ANSWER)
    await client.script_flush()
    with pytest.raises(NoScriptError):  # NOSCRIPT: it did not run
        await evalsha(connection, script.sha, ["k"], ["before"])
    script.sha = "0" * 40  # a digest the script object must have replaced
    sha = await reload(client, script)
    assert sha == script.sha == (await client.script_load(script.script))
    assert await evalsha(connection, sha, ["k"], ["after"]) == [b"k", b"after"]
    await close_now(connection)


async def test_close_now_closes_the_connection_on_the_server(client: aioredis.Redis) -> None:
    before = await connected_clients(client)
    connection = untimed_connection(client.connection_pool)
    await connection.connect()
    assert await connected_clients(client) == before + 1
    await close_now(connection)
    assert not connection.is_connected
    await until_clients(client, before)
