"""Soak: steady load for a long time, sampling what would grow if something leaked. Not part of the tests.

    .venv/bin/python -m benchmarks.soak [--minutes 10] [--rate 100] [--every 5] [--json OUT]

One `latebandit serve` with two workers on real Redis (its own key prefix) and a fresh PostgreSQL audit
database; this process sends `--rate` decisions per second (paced, not as fast as possible) on 8
connections and a conversion batch for about half of them. Every `--every` seconds it samples the workers'
resident memory, Redis's memory, the p50/p99 latency of /choose in the interval, and the audit backlog and
lag from /metrics. The window (120 s) and the dedup retention (60 s) are short so that every structure
that is bounded by them reaches its steady size within the first minutes.
At the end it compares the last fifth of the run with the second fifth (after warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import redis
from rich.console import Console
from rich.table import Table

from tests.e2e.server import cli, running, service_env
from tests.e2e.traffic import now_iso
from tests.faults import children

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_ADMIN = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
CONNECTIONS = 8
CAMPAIGN = {
    "id": "soak", "arms": [f"arm{k}" for k in range(5)], "policy": {"name": "delayed-klucb", "params": {}},
    "delay": {"family": "exponential", "mean": 30}, "window": 120,
}  # fmt: skip


class Load:
    """Paced clients: each connection sends one decision every CONNECTIONS/rate seconds."""

    def __init__(self, url: str, rate: float) -> None:
        self.url = url
        self.interval = CONNECTIONS / rate
        self.latencies: list[float] = []
        self.errors = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def run(self, index: int) -> None:
        pending: list[dict] = []
        next_at = time.monotonic() + index * self.interval / CONNECTIONS
        with httpx.Client(base_url=self.url, timeout=10.0) as http:
            while not self.stop.is_set():
                time.sleep(max(0.0, next_at - time.monotonic()))
                next_at += self.interval
                started = time.perf_counter()
                try:
                    decision = http.post("/choose", json={"campaign": "soak"}).json()
                    elapsed = time.perf_counter() - started
                    if len(pending) < 20 and hash(decision["decision_id"]) % 2:
                        pending.append({"type": "conversion", "decision_id": decision["decision_id"],
                                        "occurred_at": now_iso()})  # fmt: skip
                    if len(pending) >= 20:
                        http.post("/feedback", json={"events": pending}).raise_for_status()
                        pending.clear()
                except (httpx.HTTPError, KeyError):
                    with self.lock:
                        self.errors += 1
                    continue
                with self.lock:
                    self.latencies.append(elapsed)

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
    parser.add_argument("--rate", type=float, default=100.0, help="decisions per second")
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
                              dedup_retention="60")  # fmt: skip
            cli(env, Path(workdir), "migrate")
            with running(env, Path(workdir), workers=2) as server, server.client() as http:
                http.post("/campaigns", json=CAMPAIGN).raise_for_status()
                load = Load(server.url, args.rate)
                threads = [threading.Thread(target=load.run, args=(i,)) for i in range(CONNECTIONS)]
                for thread in threads:
                    thread.start()
                store = redis.Redis.from_url(REDIS_URL)
                started = time.monotonic()
                while time.monotonic() - started < args.minutes * 60:
                    time.sleep(args.every)
                    latencies = load.take()
                    text = http.get("/metrics").text
                    sample = {
                        "t": round(time.monotonic() - started, 1),
                        "decisions_per_s": len(latencies) / args.every,
                        "p50_ms": percentile(latencies, 50),
                        "p99_ms": percentile(latencies, 99),
                        "workers_rss_mb": rss_mb(children(server.process.pid)),
                        "redis_mb": store.info("memory")["used_memory"] / 2**20,
                        "audit_backlog": gauge(text, "latebandit_audit_backlog"),
                        "audit_lag_s": gauge(text, "latebandit_audit_lag_seconds"),
                        "errors": load.errors,
                    }
                    samples.append(sample)
                    console.print(" ".join(f"{key}={value:.1f}" for key, value in sample.items()))
                load.stop.set()
                for thread in threads:
                    thread.join()
                for key in store.scan_iter(match=f"{prefix}:*", count=1000):
                    store.delete(key)
    finally:
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    report(console, samples, args)


def report(console: Console, samples: list[dict[str, float]], args: argparse.Namespace) -> None:
    fifth = max(1, len(samples) // 5)
    early, late = samples[fifth : 2 * fifth], samples[-fifth:]
    table = Table(title=f"soak: {args.minutes:g} min at {args.rate:g} decisions/s, sampled every {args.every:g} s")
    for column in ("", "after warm-up (2nd fifth)", "last fifth", "max over the run"):
        table.add_column(column)
    summary = {}
    for key in ("decisions_per_s", "p50_ms", "p99_ms", "workers_rss_mb", "redis_mb", "audit_backlog", "audit_lag_s"):
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
