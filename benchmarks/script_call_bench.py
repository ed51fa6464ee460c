"""Benchmark: the CPU a script call costs the worker, through redis-py's client against the store's own
script connections (store/script_calls.py), on one Redis node, in one run.

    .venv/bin/python -m benchmarks.script_call_bench [--calls 20000] [--rounds 3]

Both send the same EVALSHA of a one-line script with the arguments of one decision's record call (three keys,
fifteen arguments: integers, floats' reprs, the signed id, the audit record's JSON), one call at a time (a
/choose at one connection makes one per request), on uvloop as the service runs; the client is the store's
(a blocking pool, socket timeouts).
CPU is this process's (time.process_time), which the machine's other load moves less than wall time.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Awaitable, Callable

import hiredis
import redis.asyncio as aioredis
import uvloop
from rich.console import Console
from rich.table import Table

from latebandit.store.redis import MAX_CONNECTIONS, SOCKET_TIMEOUT, RedisStore
from latebandit.store.script_calls import ScriptConnections

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
ANSWER = "return ARGV[1]"
KEYS = ["bench-script-calls:{c}:counters", "bench-script-calls:{c}:cells", "bench-script-calls:{c}:audit"]
ARGS = [1, 86_400, 2, 4, 29_503_551, 713_000_000, "c.AgABaMqD1wYBAQGnbq5E1Wb8Qb7m3V0sW3dM0FqLJ9Hc1yWv6V5k", "1.0",
        b'{"type":"decision","campaign":"bench","decision_id":"c.AgABaMqD1wYBAQGnbq5E1Wb8Qb7m3V0sW3dM0FqLJ9Hc1yWv6V5k",'
        b'"arm":"arm4","at":1764180000000000,"propensity":1.0,"policy":"delayed-klucb","version":1,'
        b'"fallback":false,"request_id":null}', 0, "0.9394130628134758", "0.8824969025845955"]  # fmt: skip


async def cpu_per_call(call: Callable[[], Awaitable[object]], calls: int) -> float:
    """Microseconds of CPU a call, after a warm-up."""
    for _ in range(200):
        await call()
    started = time.process_time()
    for _ in range(calls):
        await call()
    return (time.process_time() - started) * 1e6 / calls


async def measure(calls: int, rounds: int) -> dict[str, list[float]]:
    store = RedisStore(REDIS_URL, "bench-script-calls")  # its client: the pool and timeouts the service uses
    assert isinstance(store.client, aioredis.Redis), "a single Redis node is needed"
    direct = ScriptConnections(store.client, MAX_CONNECTIONS, SOCKET_TIMEOUT)
    script = store.client.register_script(ANSWER)
    command = ("EVALSHA", script.sha, len(KEYS), *KEYS, *ARGS)
    connection = store.client.connection_pool.connection_class()  # never connected: it only packs

    async def pack_as_redis_py() -> object:
        return connection.pack_command(*command)

    async def pack_as_hiredis() -> object:
        return hiredis.pack_command(command)

    paths: dict[str, Callable[[], Awaitable[object]]] = {
        "redis-py's script call": lambda: script(KEYS, ARGS),
        "the store's script connections": lambda: direct.run(script, KEYS, ARGS),
        "packing the command: redis-py's pack_command": pack_as_redis_py,
        "packing the command: hiredis (the store's)": pack_as_hiredis,
    }
    figures: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):  # alternated, so that a noisy moment of the machine hits both
        for name, call in paths.items():
            figures[name].append(await cpu_per_call(call, calls))
    await direct.disconnect()
    await store.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    figures = uvloop.run(measure(args.calls, args.rounds))
    baseline = min(figures["redis-py's script call"])
    table = Table(title=f"CPU a script call, {args.calls:,} calls a round, best of {args.rounds} rounds")
    for column in ("path", "µs a call", "ratio to redis-py's"):
        table.add_column(column)
    for name, rounds in figures.items():
        table.add_row(name, f"{min(rounds):.1f}", f"{min(rounds) / baseline:.2f}")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
