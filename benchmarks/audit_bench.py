"""Benchmark: the audit log's write path into PostgreSQL, COPY against the pipelined executemany of
one-row INSERTs it replaced, in one run, into one fresh database.

    .venv/bin/python -m benchmarks.audit_bench [--rows 40000] [--batch 5000]

Decision records in queue entries of one record each (as /choose queues them) and conversion records in
entries of 1,000 (a /feedback batch), written ``--batch`` entries (decisions) or 5 entries (feedback) per
transaction, as AuditWriter does; then the same decisions again, which must insert nothing. The whole
drain (Redis stream read, decode, write, acknowledge) is measured by benchmarks/service_bench.py.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from alembic import command
from rich.console import Console
from rich.table import Table

from benchmarks.service_bench import POSTGRES_ADMIN
from latebandit.audit import log as audit_log
from latebandit.audit.migrate import alembic_config
from latebandit.audit.queue import QueueEntry
from latebandit.audit.records import Record

RESULTS = Path(__file__).parent / "results"
AT = 1_800_000_000_000_000


def decisions(count: int, first: int) -> list[QueueEntry]:
    entries = []
    for n in range(first, first + count):
        record: Record = {"type": "decision", "campaign": "bench", "decision_id": f"d{n}", "arm": f"arm{n % 10}",
                          "at": AT + n, "propensity": 0.5, "policy": "delayed-klucb", "version": 1,
                          "fallback": False, "request_id": None, "seq": n + 1}  # fmt: skip
        entries.append(QueueEntry("bench", f"{AT // 1000 + n}-0", [record]))
    return entries


def conversions(count: int) -> list[QueueEntry]:
    entries = []
    for batch in range(count // 1000):
        records: list[Record] = [
            {"type": "conversion", "campaign": "bench", "event_id": f"e{batch}-{k}", "decision_id": f"d{k}",
             "arm": f"arm{k % 10}", "decided_at": AT + k, "occurred_at": AT + k + 10**9, "received_at": AT + 2 * 10**9,
             "value": 1.0, "outcome": "counted"}
            for k in range(1000)
        ]  # fmt: skip
        entries.append(QueueEntry("bench", f"{AT // 1000 + 10**9 + batch}-0", records))
    return entries


@contextmanager
def fresh_log(revision: str = "head") -> Iterator[audit_log.AuditLog]:
    """An audit log in a new PostgreSQL database, its schema at ``revision``; dropped afterwards."""
    name = f"lbaudit_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    log = audit_log.AuditLog("postgresql+psycopg://" + POSTGRES_ADMIN.split("://", 1)[1].rsplit("/", 1)[0] + "/" + name)
    try:
        command.upgrade(alembic_config(log.url), revision)
        yield log
    finally:
        log.dispose()
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def rate(log: audit_log.AuditLog, entries: list[QueueEntry], per_write: int) -> tuple[float, int]:
    """Records per second and records inserted, writing ``per_write`` entries per transaction."""
    records = sum(len(entry.records) for entry in entries)
    started, inserted = time.perf_counter(), 0
    for start in range(0, len(entries), per_write):
        inserted += log.write(entries[start : start + per_write])
    return records / (time.perf_counter() - started), inserted


def measure(rows: int, batch: int) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {}
    copied = audit_log.COPIED
    for path, tables in (("executemany", ()), ("copy", copied)):
        audit_log.COPIED = tables  # the executemany path is what the log uses for every other table
        try:
            with fresh_log() as log:
                made = decisions(rows, 0)
                decided, inserted = rate(log, made, batch)
                assert inserted == rows
                converted, inserted = rate(log, conversions(rows), 5)
                assert inserted == rows // 1000 * 1000
                repeated, inserted = rate(log, made, batch)
                assert inserted == 0, "a repeated write inserted rows"
        finally:
            audit_log.COPIED = copied
        figures[path] = {"decisions_per_second": decided, "conversions_per_second": converted,
                         "repeat_per_second": repeated}  # fmt: skip
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--batch", type=int, default=5_000, help="decision entries per transaction")
    args = parser.parse_args()
    figures = measure(args.rows, args.batch)
    table = Table(title=f"audit records/s into PostgreSQL, {args.rows:,} of each kind")
    for column in ("path", "decisions", "conversions", "same decisions again"):
        table.add_column(column, no_wrap=True)
    for path, row in figures.items():
        table.add_row(path, *(f"{value:,.0f}" for value in row.values()))
    ratio = {key: figures["copy"][key] / figures["executemany"][key] for key in figures["copy"]}
    table.add_row("ratio", *(f"{value:.2f}x" for value in ratio.values()))
    Console(width=120).print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "audit.json").write_text(json.dumps({**figures, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
