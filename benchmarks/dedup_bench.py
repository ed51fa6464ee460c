"""Benchmark: what Redis spends on a conversion's deduplication entries, by structure, and on decoding a
batch, as the conversion script does it (store/lua/feedback_lib.lua, apply_conversions.lua).

    .venv/bin/python -m benchmarks.dedup_bench [--entries 2000000] [--rounds 50]

Each structure is filled with ``--entries`` entries, then ``--rounds`` script calls add 2,000 new ones each
from a Lua loop: the sorted set by expiry the store uses (``ZADD NX``), a key per entry with its own expiry
(``SET NX EX``) and a hash without expiry (``HSETNX``, the floor a lookup could reach). Then
``cjson.decode`` of a batch of 1,000 conversions in the script's own argument format. Redis CPU from
``INFO cpu`` per entry or per conversion, in a database of its own (``--db``, flushed before and after).
"""

from __future__ import annotations

import argparse
import os
import time

import orjson
import redis
from rich.console import Console
from rich.table import Table

from latebandit.tokens import DecisionToken, TokenSigner, new_nonce

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
BATCH = 2_000
STRUCTURES = {
    "sorted set by expiry, ZADD NX (the store's)": "redis.call('ZADD', KEYS[1], 'NX', 1000000, m)",
    "key per entry, SET NX EX": "redis.call('SET', 'dedup:{c}:' .. m, 1, 'NX', 'EX', 86400)",
    "hash, HSETNX (no expiry)": "redis.call('HSETNX', KEYS[1], m, 1000000)",
}


def redis_cpu(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def per_entry(client: redis.Redis, statement: str, entries: int, rounds: int) -> tuple[float, float]:
    """Redis CPU µs per added entry once ``entries`` are there, and the memory per entry."""
    script = client.register_script(f"for _, m in ipairs(ARGV) do {statement} end return #ARGV")
    empty = client.info("memory")["used_memory"]
    for start in range(0, entries, 10_000):
        script(keys=["dedup"], args=[f"ev:{n:012d}" for n in range(start, start + 10_000)])
    memory = (client.info("memory")["used_memory"] - empty) / entries
    before = redis_cpu(client)
    for turn in range(rounds):
        first = entries + turn * BATCH
        script(keys=["dedup"], args=[f"ev:{n:012d}" for n in range(first, first + BATCH)])
    return (redis_cpu(client) - before) * 1e6 / (rounds * BATCH), memory


def decode_per_conversion(client: redis.Redis, rounds: int) -> float:
    """Redis CPU µs per conversion of ``cjson.decode`` on a batch in apply_conversions' argument format."""
    signer, now = TokenSigner("x" * 40), int(time.time())
    events = [[f"ev{n}", signer.sign(DecisionToken("c", n % 10, now * 10**6, 1, new_nonce())), True, False, n % 10,
               n % 64, "1.0", now + 86_400 + n % 3_600, 3] for n in range(1_000)]  # fmt: skip
    payload = orjson.dumps(events)
    decode, empty = client.register_script("return #cjson.decode(ARGV[1])"), client.register_script("return 0")
    costs = []
    for script in (decode, empty):  # the empty script: receiving the same argument, the call itself
        script(args=[payload])
        before = redis_cpu(client)
        for _ in range(rounds):
            script(args=[payload])
        costs.append((redis_cpu(client) - before) * 1e6 / (rounds * len(events)))
    return costs[0] - costs[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--db", type=int, default=14)
    args = parser.parse_args()
    client = redis.Redis.from_url(REDIS_URL, db=args.db)
    table = Table(title=f"Redis CPU a deduplication entry, {args.entries:,} there already")
    for column in ("structure", "µs an entry", "bytes an entry"):
        table.add_column(column)
    try:
        for name, statement in STRUCTURES.items():
            client.flushdb()
            cost, memory = per_entry(client, statement, args.entries, args.rounds)
            table.add_row(name, f"{cost:.2f}", f"{memory:.0f}")
        client.flushdb()
        decoded = decode_per_conversion(client, args.rounds)
    finally:
        client.flushdb()
    console = Console(width=120)
    console.print(table)
    console.print(f"cjson.decode of a batch of 1,000 conversions: {decoded:.2f} µs of Redis CPU a conversion")


if __name__ == "__main__":
    main()
