"""Benchmark: latebandit /choose and /feedback against a bare FastAPI endpoint, in one run, one machine.

    .venv/bin/python -m benchmarks.service_bench [--duration 10] [--concurrency 32]

Both servers run as one uvicorn worker each on real Redis (latebandit also drains its audit into a fresh
PostgreSQL database); this process is the load generator. The latebandit campaign is `delayed-klucb`
with 10 arms and a full window of history (every histogram bucket of every arm populated); a second one is
`odaaf` with 10 arms (a shared schedule: each /choose claims a slot in Redis). The bare and latebandit
runs alternate (two rounds each) and the figures are reported as ratios to the bare endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import orjson
import psycopg
from rich.console import Console
from rich.table import Table

from latebandit.campaign import Campaign
from latebandit.loadtest.client import LoadResult, Repeat, post, run_load
from latebandit.store.base import Counters, Histogram
from latebandit.store.redis import RedisStore
from latebandit.timeutil import MICROS, format_time, wall_clock
from latebandit.tokens import DecisionToken, TokenSigner, new_nonce
from tests.e2e.server import Server, free_port, stop, wait_ready

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_ADMIN = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
SECRET = "bench-secret"
ARMS = [f"arm{k}" for k in range(10)]
CAMPAIGN = {
    "id": "bench", "arms": ARMS, "policy": {"name": "delayed-klucb", "params": {}},
    "delay": {"family": "exponential", "mean": 3600}, "window": 86_400, "buckets": 64,
}  # fmt: skip
ODAAF = {
    "id": "bench-odaaf",
    "arms": ARMS,
    "policy": {"name": "odaaf", "params": {"mean_delay": 100, "horizon": 10**8}},
}
RESULTS = Path(__file__).parent / "results"


def start(command: list[str], env: dict[str, str], port: int, log: Path) -> Server:
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", process, env, log)
    wait_ready(server) if "latebandit.cli" in command else _wait_port(server, port)
    return server


def _wait_port(server: Server, port: int) -> None:
    import socket

    for _ in range(300):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(server.log.read_text())


async def fill_history(prefix: str) -> None:
    """A full window of history: every bucket of every arm holds pulls, some converted."""
    store = RedisStore(REDIS_URL, prefix)
    campaign = await store.get_campaign("bench")
    assert campaign is not None
    now, width = wall_clock(), campaign.bucket_width_us
    last = now // width
    buckets = np.arange(last - campaign.buckets, last + 1)
    rng = np.random.default_rng(0)
    rows = len(ARMS) * len(buckets)
    count = rng.integers(200, 400, size=rows)
    arm = np.repeat(np.arange(len(ARMS)), len(buckets))
    rate = 1 / 3600
    moments = (count * np.exp(-rate * width / MICROS / 2))[:, None]
    histogram = Histogram(arm, np.tile(buckets, len(ARMS)), count, count * (width // 2),
                          (count * 0.05).astype(np.int64), moments)  # fmt: skip
    pulls = np.bincount(arm, count, minlength=len(ARMS)).astype(np.int64) + 10_000
    counters = Counters(int(pulls.sum()), pulls, np.round(pulls * np.linspace(0.02, 0.06, len(ARMS))),
                        np.full(len(ARMS), 10_000, dtype=np.int64))  # fmt: skip
    await store.replace_state(campaign, counters, histogram, {})
    await store.close()


def forget_keys(prefix: str) -> None:
    """Leave the shared Redis as it was: a run leaves ~100,000 deduplication entries behind otherwise."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=f"{prefix}:*", count=10_000):
        client.delete(key)
    client.delete("bench:{bench}:counter")


def feedback_requests(campaign: Campaign, batch: int) -> itertools.Iterator[bytes]:
    signer = TokenSigner(SECRET)
    now = wall_clock()
    occurred = format_time(now)
    serial = itertools.count()
    while True:
        events = []
        for _ in range(batch):
            n = next(serial)
            token = DecisionToken("bench", n % len(ARMS), now - (n % 3600) * MICROS, 1, new_nonce())
            events.append({"type": "conversion", "event_id": f"ev{n}", "decision_id": signer.sign(token),
                           "occurred_at": occurred})  # fmt: skip
        yield post("/feedback", orjson.dumps({"events": events}))


def measure(port: int, requests: itertools.Iterator[bytes] | bytes, duration: float, concurrency: int) -> LoadResult:
    next_request = (lambda: requests) if isinstance(requests, bytes) else requests.__next__
    return asyncio.run(run_load("127.0.0.1", port, lambda: Repeat(next_request), duration, concurrency))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    workdir = RESULTS / "run"
    workdir.mkdir(parents=True, exist_ok=True)
    prefix, database = f"bench{uuid.uuid4().hex[:8]}", f"lbbench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    database_url = POSTGRES_ADMIN.rsplit("/", 1)[0] + "/" + database
    env = {
        **os.environ,
        "LATEBANDIT_REDIS_URL": REDIS_URL,
        "LATEBANDIT_REDIS_PREFIX": prefix,
        "LATEBANDIT_DATABASE_URL": database_url,
        "LATEBANDIT_SECRET": SECRET,
        "LATEBANDIT_LOG_LEVEL": "warning",  # no access line per request: the bare endpoint writes none either
        "BENCH_REDIS_URL": REDIS_URL,
    }
    servers: list[Server] = []
    try:
        subprocess.run([sys.executable, "-m", "latebandit.cli", "migrate"], env=env, check=True, capture_output=True)
        lb_port, bare_port = free_port(), free_port()
        latebandit = start([sys.executable, "-m", "latebandit.cli", "serve", "--port", str(lb_port)], env, lb_port,
                           workdir / "latebandit.log")  # fmt: skip
        servers.append(latebandit)
        uvicorn = [sys.executable, "-m", "uvicorn", "benchmarks.bare_app:create_app", "--factory"]
        flags = ["--port", str(bare_port), "--no-access-log", "--log-level", "warning"]
        bare = start([*uvicorn, *flags], env, bare_port, workdir / "bare.log")
        servers.append(bare)
        import httpx

        assert httpx.post(f"{latebandit.url}/campaigns", json=CAMPAIGN).status_code == 201
        assert httpx.post(f"{latebandit.url}/campaigns", json=ODAAF).status_code == 201
        asyncio.run(fill_history(prefix))
        choose = post("/choose", b'{"campaign":"bench"}')
        choose_odaaf = post("/choose", b'{"campaign":"bench-odaaf"}')
        measure(bare_port, choose, 2, args.concurrency)  # warm-up
        measure(lb_port, choose, 2, args.concurrency)
        measure(lb_port, choose_odaaf, 2, args.concurrency)
        rounds: dict[str, list[LoadResult]] = {"bare": [], "latebandit": [], "odaaf": []}
        for _ in range(2):
            rounds["bare"].append(measure(bare_port, choose, args.duration, args.concurrency))
            rounds["latebandit"].append(measure(lb_port, choose, args.duration, args.concurrency))
            rounds["odaaf"].append(measure(lb_port, choose_odaaf, args.duration, args.concurrency))
        campaign = Campaign(**CAMPAIGN)
        fb = measure(lb_port, feedback_requests(campaign, args.batch), args.duration, 4)
        report(rounds, fb, args)
    finally:
        for server in servers:
            stop(server)
        forget_keys(prefix)
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def report(rounds: dict[str, list[LoadResult]], fb: LoadResult, args: argparse.Namespace) -> None:
    def summary(results: list[LoadResult]) -> dict[str, float]:
        return {
            "throughput": float(np.median([r.throughput for r in results])),
            "p50_ms": float(np.median([r.percentile(50) for r in results])) * 1e3,
            "p99_ms": float(np.median([r.percentile(99) for r in results])) * 1e3,
            "errors": sum(r.errors for r in results),
        }

    bare, lb, odaaf = summary(rounds["bare"]), summary(rounds["latebandit"]), summary(rounds["odaaf"])
    events_per_second = fb.requests * args.batch / fb.seconds
    figures = {
        "bare": bare, "latebandit_choose": lb,
        "choose_throughput_ratio": lb["throughput"] / bare["throughput"],
        "choose_p99_ratio": lb["p99_ms"] / bare["p99_ms"],
        "odaaf_choose": odaaf, "odaaf_throughput_ratio": odaaf["throughput"] / bare["throughput"],
        "odaaf_p99_ratio": odaaf["p99_ms"] / bare["p99_ms"],
        "feedback_events_per_second": events_per_second, "feedback_errors": fb.errors,
        "feedback_p99_ms": fb.percentile(99) * 1e3, "concurrency": args.concurrency, "duration": args.duration,
    }  # fmt: skip
    table = Table(title=f"/choose at concurrency {args.concurrency}, {args.duration:g}s x 2 rounds (medians)")
    for column in ("endpoint", "req/s", "p50 ms", "p99 ms", "errors"):
        table.add_column(column)
    rows = (("bare FastAPI + 1 Redis GET", bare), ("latebandit /choose, delayed-klucb", lb),
            ("latebandit /choose, odaaf", odaaf))  # fmt: skip
    for name, row in rows:
        table.add_row(
            name, f"{row['throughput']:.0f}", f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}", str(row["errors"])
        )
    console = Console()
    console.print(table)
    console.print(f"throughput ratio {figures['choose_throughput_ratio']:.2f} (target ≥ 0.8), "
                  f"p99 ratio {figures['choose_p99_ratio']:.2f} (target ≤ 1.5)")  # fmt: skip
    console.print(f"odaaf: throughput ratio {figures['odaaf_throughput_ratio']:.2f} (target ≥ 0.8), "
                  f"p99 ratio {figures['odaaf_p99_ratio']:.2f}")  # fmt: skip
    console.print(f"/feedback, batches of {args.batch}: {events_per_second:,.0f} events/s per worker "
                  f"(target ≥ 50,000), p99 {figures['feedback_p99_ms']:.1f} ms, errors {fb.errors}")  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "service.json").write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
