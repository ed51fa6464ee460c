"""Soak: steady load for a long time, sampling what would grow if something leaked. Not part of the tests.

    .venv/bin/python -m benchmarks.soak [--minutes 10] [--connections 16] [--feedback-every 400] [--every 5]
                                        [--json OUT]

One `latebandit serve` with two workers on real Redis (its own key prefix) and a fresh PostgreSQL audit
database. This process keeps `--connections` keep-alive connections busy (closed loop, with the load test's
asyncio client, so that the service's own rate is what is soaked, not a Python client's), each playing the
load test's ad server (latebandit/loadtest/traffic.py): /choose with a request id (some retried), half of the
decisions converting about 2 s later, sent every `--feedback-every` decisions as one /feedback batch with
some duplicates and re-sent batches. Every `--every` seconds it samples the workers' resident memory, Redis's
memory and, of what it holds, the deduplication entries and the audit queue not yet written (both follow
the rate, the queue also the writer's pace), the decisions and conversions per second and the p50/p99
latency of /choose in the interval, and the audit backlog and lag from /metrics. The window (120 s), the
dedup retention and the request-id memory (60 s each) are short so that every structure that is bounded by
them reaches its steady size within the first minutes.
At the end it compares the last fifth of the run with the second fifth (after warm-up).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import redis
from rich.console import Console
from rich.table import Table

from latebandit.loadtest.client import run_load
from latebandit.loadtest.traffic import AdServer, Mix, Tally
from latebandit.store.keys import Keys
from tests.e2e.server import cli, running, service_env
from tests.faults import children

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_ADMIN = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
CAMPAIGN = {
    "id": "soak", "arms": [f"arm{k}" for k in range(5)], "policy": {"name": "delayed-klucb", "params": {}},
    "delay": {"family": "exponential", "mean": 30}, "window": 120,
}  # fmt: skip


class Timed:
    """A connection of the load test's traffic (``AdServer``) whose /choose latencies and failed requests the
    sampler reads per interval (the load test's own client reports latencies only at its end)."""

    def __init__(self, session: AdServer, timings: Timings) -> None:
        self.session = session
        self.timings = timings
        self.sent: tuple[str, float] = ("choose", 0.0)

    def next_request(self) -> tuple[str, bytes]:
        kind, request = self.session.next_request()
        self.sent = (kind, time.perf_counter())
        return kind, request

    def on_response(self, status: int, body: bytes) -> None:
        kind, started = self.sent
        self.timings.add(kind, status, time.perf_counter() - started)
        self.session.on_response(status, body)


class Timings:
    """/choose latencies and failed requests since the last sample (the connections run in another thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.errors = 0

    def add(self, kind: str, status: int, seconds: float) -> None:
        with self.lock:
            if status != 200:
                self.errors += 1
            elif kind == "choose":
                self.latencies.append(seconds)

    def take(self) -> list[float]:
        with self.lock:
            taken, self.latencies = self.latencies, []
        return taken


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        total += int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
    return total / 1024


def gauge(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else float("nan")


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) > 1 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--feedback-every", type=int, default=400, help="decisions between two /feedback batches")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    console = Console()
    prefix, database = f"soak{uuid.uuid4().hex[:8]}", f"soak_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    postgres_url = POSTGRES_ADMIN.rsplit("/", 1)[0] + "/" + database
    samples: list[dict[str, float]] = []
    try:
        with tempfile.TemporaryDirectory() as workdir:
            env = service_env(Path(workdir), redis_url=REDIS_URL, redis_prefix=prefix, database_url=postgres_url,
                              dedup_retention="60", request_ttl="60")  # fmt: skip
            cli(env, Path(workdir), "migrate")
            with running(env, Path(workdir), workers=2) as server, server.client() as http:
                http.post("/campaigns", json=CAMPAIGN).raise_for_status()
                mix = Mix("soak", conversion_rate=0.5, feedback_every=args.feedback_every)
                tally, timings, serial = Tally(), Timings(), itertools.count()

                def connection() -> Timed:
                    n = next(serial)
                    return Timed(AdServer(mix, tally, f"soak{n}", seed=n), timings)

                address = urlsplit(server.url)
                seconds = args.minutes * 60 + 2 * args.every  # the connections outlast the last sample
                host, port = address.hostname or "127.0.0.1", address.port or 80
                traffic = run_load(host, port, connection, seconds, args.connections)
                load = threading.Thread(target=asyncio.run, args=(traffic,))
                load.start()
                store, keys = redis.Redis.from_url(REDIS_URL), Keys(prefix)
                started = last = time.monotonic()
                converted = 0
                while time.monotonic() - started < args.minutes * 60:
                    time.sleep(args.every)
                    latencies, conversions = timings.take(), tally.conversions_sent - converted
                    converted += conversions
                    taken, last = last, time.monotonic()
                    interval = last - taken  # the sleep and the previous sample's reads
                    text = http.get("/metrics").text
                    sample = {
                        "t": round(last - started, 1),
                        "decisions_per_s": len(latencies) / interval,
                        "conversions_per_s": conversions / interval,
                        "p50_ms": percentile(latencies, 50),
                        "p99_ms": percentile(latencies, 99),
                        "workers_rss_mb": rss_mb(children(server.process.pid)),
                        "redis_mb": store.info("memory")["used_memory"] / 2**20,
                        "dedup_entries": store.zcard(keys.dedup("soak")),
                        "audit_queue_mb": (store.memory_usage(keys.audit("soak"), samples=0) or 0) / 2**20,
                        "audit_backlog": gauge(text, "latebandit_audit_backlog"),
                        "audit_lag_s": gauge(text, "latebandit_audit_lag_seconds"),
                        "errors": timings.errors,
                    }
                    samples.append(sample)
                    console.print(" ".join(f"{key}={value:.1f}" for key, value in sample.items()))
                load.join()
                for key in store.scan_iter(match=f"{prefix}:*", count=1000):
                    store.delete(key)
    finally:
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    report(console, samples, args)


SAMPLED = ("decisions_per_s", "conversions_per_s", "p50_ms", "p99_ms", "workers_rss_mb", "redis_mb", "dedup_entries",
           "audit_queue_mb", "audit_backlog", "audit_lag_s")  # fmt: skip


def report(console: Console, samples: list[dict[str, float]], args: argparse.Namespace) -> None:
    fifth = max(1, len(samples) // 5)
    early, late = samples[fifth : 2 * fifth], samples[-fifth:]
    title = f"soak: {args.minutes:g} min, {args.connections} connections, sampled every {args.every:g} s"
    table = Table(title=title)
    for column in ("", "after warm-up (2nd fifth)", "last fifth", "max over the run"):
        table.add_column(column)
    summary = {}
    for key in SAMPLED:
        first, last = (statistics.median(s[key] for s in part) for part in (early, late))
        peak = max(s[key] for s in samples)
        summary[key] = {"early": first, "late": last, "max": peak}
        table.add_row(key, f"{first:.2f}", f"{last:.2f}", f"{peak:.2f}")
    table.add_row("errors", "", "", str(samples[-1]["errors"]))
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"settings": vars(args) | {"json": str(args.json)}, "summary": summary,
                                         "samples": samples}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
