"""Benchmark: the peak memory of ``latebandit rebuild`` against the length of the audit log.

    .venv/bin/python -m benchmarks.rebuild_memory [--sizes 100000 1000000 10000000] [--campaigns 4]

For each size, a fresh PostgreSQL database receives a log of that many decisions at a steady
``--per-day`` decisions a day across ``--campaigns`` campaigns (window one day, the service's default dedup
retention of one day), so a longer log spans more days at the same traffic, as a year of a live service
does; one attributed conversion for every twentieth decision, received an hour after it. Then
``latebandit rebuild`` runs as its own process into a fresh Redis prefix, and its peak resident memory
(VmHWM, read from /proc while it runs) and wall time are reported, with each size's peak as a ratio to the
smallest size's, measured in the same run. A rebuild that streams the log holds only what can still
change the state (per campaign, the decisions of its last window plus retention), so its peak stays flat
as the log grows; one that keeps every decision grows with it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

from benchmarks.service_bench import POSTGRES_ADMIN, REDIS_URL, SECRET, forget_keys
from latebandit.audit.log import AuditLog
from latebandit.audit.queue import QueueEntry
from latebandit.audit.records import Record
from latebandit.campaign import Campaign
from latebandit.config import Settings
from tests.e2e.server import LATEBANDIT

RESULTS = Path(__file__).parent / "results"
START = 1_800_000_000_000_000  # µs
DAY = 86_400 * 1_000_000  # µs
HOUR = 3_600 * 1_000_000  # µs
ENTRY = 1_000  # records per queue entry, as a /feedback batch queues them


def campaign(name: str) -> Campaign:
    return Campaign(id=name, arms=[f"arm{k}" for k in range(10)], policy={"name": "delayed-klucb", "params": {}},
                    delay={"family": "exponential", "mean": 3_600}, window=86_400, created_at=START)  # fmt: skip


def log_entries(size: int, campaigns: int, days: float) -> Iterator[QueueEntry]:
    """The log in queue order: each campaign's creation, then its decisions and conversions in time order."""
    step = int(days * DAY / size)  # µs between two decisions
    for c in range(campaigns):
        name = f"c{c}"
        yield QueueEntry(name, f"{START // 1000}-0", [{"type": "campaign", "campaign": name, "at": START,
                         "action": "create", "config": campaign(name).model_dump(mode="json")}])  # fmt: skip
    pending: dict[str, list[Record]] = {f"c{c}": [] for c in range(campaigns)}
    sequence = 1
    for n in range(size):
        name, at = f"c{n % campaigns}", START + n * step
        records = pending[name]
        records.append({"type": "decision", "campaign": name, "decision_id": f"d{n}", "arm": f"arm{n % 10}",
                        "at": at, "propensity": 0.1, "policy": "delayed-klucb", "version": 1, "fallback": False,
                        "request_id": None, "seq": n // campaigns + 1})  # fmt: skip
        if n % 20 == 0:
            records.append({"type": "conversion", "campaign": name, "event_id": f"e{n}", "decision_id": f"d{n}",
                            "arm": f"arm{n % 10}", "decided_at": at, "occurred_at": at + HOUR // 2,
                            "received_at": at + HOUR, "value": 1.0, "outcome": "counted"})  # fmt: skip
        if len(records) >= ENTRY:
            yield QueueEntry(name, f"{at // 1000}-{sequence}", records)
            pending[name], sequence = [], sequence + 1
    for name, records in pending.items():
        if records:
            yield QueueEntry(name, f"{(START + int(days * DAY)) // 1000}-{sequence}", records)
            sequence += 1


def fill(url: str, size: int, campaigns: int, days: float) -> None:
    audit = AuditLog(Settings(database_url=url).sqlalchemy_url)
    batch: list[QueueEntry] = []
    for entry in log_entries(size, campaigns, days):
        batch.append(entry)
        if len(batch) == 20:
            audit.write(batch)
            batch = []
    if batch:
        audit.write(batch)
    audit.dispose()


def peak_memory(command: list[str], env: dict[str, str]) -> tuple[int, float]:
    """The peak resident set (bytes, VmHWM) of ``command`` and its wall time in seconds."""
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak = 0
    while process.poll() is None:
        try:
            status = Path(f"/proc/{process.pid}/status").read_text()
            peak = max(peak, int(status.split("VmHWM:")[1].split()[0]) * 1024)
        except (FileNotFoundError, IndexError, ProcessLookupError):
            pass
        time.sleep(0.05)
    output = process.stdout.read().decode() if process.stdout else ""
    if process.returncode != 0:
        raise RuntimeError(output)
    return peak, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--campaigns", type=int, default=4)
    parser.add_argument("--per-day", type=int, default=20_000, help="decisions a day, all campaigns together")
    args = parser.parse_args()
    console = Console(width=160)
    rows = []
    for size in args.sizes:
        database, prefix = f"lbbench_{uuid.uuid4().hex[:8]}", f"bench{uuid.uuid4().hex[:8]}"
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{database}"')
        url = POSTGRES_ADMIN.rsplit("/", 1)[0] + "/" + database
        env = {**os.environ, "LATEBANDIT_DATABASE_URL": url, "LATEBANDIT_REDIS_URL": REDIS_URL,
               "LATEBANDIT_REDIS_PREFIX": prefix, "LATEBANDIT_SECRET": SECRET}  # fmt: skip
        try:
            subprocess.run([*LATEBANDIT, "migrate"], env=env, check=True, capture_output=True)
            console.print(f"writing {size:,} decisions ...")
            filled = time.monotonic()
            fill(url, size, args.campaigns, size / args.per_day)
            console.print(f"  written in {time.monotonic() - filled:.0f} s; rebuilding ...")
            peak, seconds = peak_memory([*LATEBANDIT, "rebuild"], env)
            rows.append({"decisions": size, "peak_bytes": peak, "seconds": seconds})
        finally:
            forget_keys(prefix)
            with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    table = Table(title="latebandit rebuild: peak memory against the audit log's length")
    for column in ("decisions in the log", "peak RSS (MB)", "x the smallest log's", "wall time (s)", "decisions/s"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(f"{row['decisions']:,}", f"{row['peak_bytes'] / 2**20:.0f}",
                      f"{row['peak_bytes'] / rows[0]['peak_bytes']:.2f}", f"{row['seconds']:.0f}",
                      f"{row['decisions'] / row['seconds']:,.0f}")  # fmt: skip
    console.print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "rebuild_memory.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
