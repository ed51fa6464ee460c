"""Watching a Redis server from a test: kept busy by a script (Redis runs one script at a time, and nothing
else meanwhile), for a call in flight or a hung Redis; and the connections it counts. Use a server the test
owns (redis_server of tests/faults.py): a busy shared one would hold up every other test."""

from __future__ import annotations

import time

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from tests.waiting import until_async

# Busy for ARGV[1] loop turns, then answers ARGV[2].
SLOW = "local n = 0 for i = 1, tonumber(ARGV[1]) do n = n + 1 end return ARGV[2]"
BUSY_AFTER_MS = 10  # busy-reply-threshold set by ``answer_busy``: a script runs this long before others hear BUSY


async def turns_for(client: aioredis.Redis, seconds: float) -> int:
    """Loop turns of SLOW that keep this server busy about ``seconds`` (machines differ tenfold)."""
    turns, slow = 100_000, client.register_script(SLOW)
    while True:
        started = time.perf_counter()
        await slow(args=[turns, "calibrating"])
        if time.perf_counter() - started >= seconds / 4:
            return int(turns * seconds / (time.perf_counter() - started))
        turns *= 4


async def answer_busy(client: aioredis.Redis) -> None:
    """From now on, once a script has run BUSY_AFTER_MS (instead of 5 s, the default), the server answers
    every other command BUSY until the script ends, so that ``running_a_script`` can tell."""
    await client.config_set("busy-reply-threshold", BUSY_AFTER_MS)


async def running_a_script(client: aioredis.Redis) -> bool:
    """Whether the server is running a script (after ``answer_busy``; else this waits for the script's end)."""
    try:
        await client.ping()
    except ResponseError as error:
        if str(error).startswith("BUSY"):
            return True
        raise
    return False


async def connected_clients(client: aioredis.Redis) -> int:
    """Connections the server counts (``client``'s own among them); it learns of a close asynchronously."""
    return int((await client.info("clients"))["connected_clients"])


async def until_clients(client: aioredis.Redis, expected: int) -> None:
    """Until the server counts ``expected`` connections."""

    async def counted() -> bool:
        return await connected_clients(client) == expected

    await until_async(counted, f"the server counting {expected} connections")
