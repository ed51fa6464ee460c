"""Benchmark: what the audit log costs per day in PostgreSQL, and what migrating to and retiring day
partitions costs, in one fresh database.

    .venv/bin/python -m benchmarks.audit_size [--decisions 200000] [--conversions 100000]

Decisions (one queue entry each, as /choose queues them) and attributed conversions (entries of 1,000, a
/feedback batch) with decision ids of the length the signer issues for a 16-character campaign id, written
into the schema before partitioning (revision 0003); then the migration to day partitions is timed, the
tables measured (heap, TOAST and indexes, pg_total_relation_size of every partition), and the day archived
(exported, compressed, dropped) with ``latebandit archive``'s code. Bytes per row are scaled to a day at
``--rate`` decisions/s with one conversion for every ``--converting`` decisions.
"""

from __future__ import annotations

import argparse
import json
import secrets
import tempfile
import time
from pathlib import Path

from alembic import command
from rich.console import Console
from rich.table import Table

from benchmarks.audit_bench import AT, RESULTS, fresh_log
from latebandit.audit.archive import archive
from latebandit.audit.log import AuditLog
from latebandit.audit.migrate import alembic_config
from latebandit.audit.partitions import DAY_US, PARTITIONED, day_start, ensure_days
from latebandit.audit.queue import QueueEntry
from latebandit.audit.records import Record
from latebandit.config import Settings

CAMPAIGN = "summer-sale-2026"
SECONDS_PER_DAY = 86_400


def decision_id() -> str:
    """As long as a signed id of a 16-character campaign: 40 payload bytes and 16 of signature, base64url."""
    return f"{secrets.token_urlsafe(40)}.{secrets.token_urlsafe(16)}"


def traffic(decisions: int, conversions: int) -> tuple[list[QueueEntry], list[str]]:
    ids = [decision_id() for _ in range(decisions)]
    created: Record = {"type": "campaign", "campaign": CAMPAIGN, "at": AT, "action": "create",
                       "config": {"id": CAMPAIGN, "arms": [f"arm{k}" for k in range(10)], "window": 86_400,
                                  "policy": {"name": "delayed-klucb", "params": {}}, "created_at": AT,
                                  "delay": {"family": "exponential", "mean": 3_600}}}  # fmt: skip
    entries = [QueueEntry(CAMPAIGN, f"{AT // 1000}-0", [created])]
    for n, made in enumerate(ids):
        record: Record = {"type": "decision", "campaign": CAMPAIGN, "decision_id": made, "arm": f"arm{n % 10}",
                          "at": AT + 1000 * n, "propensity": 0.5, "policy": "delayed-klucb", "version": 1,
                          "fallback": False, "request_id": None, "seq": n + 1}  # fmt: skip
        entries.append(QueueEntry(CAMPAIGN, f"{AT // 1000 + n}-1", [record]))
    for batch in range(conversions // 1000):
        received = AT + 1000 * decisions + batch
        records: list[Record] = [
            {"type": "conversion", "campaign": CAMPAIGN, "event_id": f"conv-{batch}-{k}",
             "decision_id": ids[(batch * 1000 + k) % decisions], "arm": f"arm{k % 10}", "decided_at": AT + k,
             "occurred_at": received - 10**6, "received_at": received, "value": 1.0, "outcome": "counted"}
            for k in range(1000)
        ]  # fmt: skip
        entries.append(QueueEntry(CAMPAIGN, f"{received // 1000}-{batch + 2}", records))
    return entries, ids


def table_bytes(log: AuditLog) -> dict[str, int]:
    """Each partitioned table's bytes on disk: its day partitions' heap, TOAST and indexes."""
    with log.engine.connect() as connection:
        return {
            table: int(
                connection.exec_driver_sql(
                    # Not DEFAULT: it held the rows until their day was made, and keeps their dead tuples.
                    f"SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('{table}') "
                    f"WHERE relid::text <> '{table}_default'"
                ).scalar_one()
            )
            for table in PARTITIONED
        }


def measure(decisions: int, conversions: int) -> dict[str, float]:
    entries, _ = traffic(decisions, conversions)
    with fresh_log("0003") as log:
        for start in range(0, len(entries), 5_000):
            log.write(entries[start : start + 5_000])
        rows = decisions + conversions // 1000 * 1000
        started = time.perf_counter()
        command.upgrade(alembic_config(log.url), "head")
        migrated = time.perf_counter() - started
        ensure_days(log.engine, AT, ahead=1)  # the rows' day, moved out of DEFAULT as the writer would
        sizes = table_bytes(log)
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "day.jsonl.gz"
            started = time.perf_counter()
            done = archive(log, Settings(_env_file=None), day_start(AT) + DAY_US, out, AT + 400 * DAY_US)
            archived = time.perf_counter() - started
        assert sum(done.removed.values()) == rows, done.removed
    return {
        "decision_bytes_per_row": sizes["audit_decisions"] / decisions,
        "feedback_bytes_per_row": sizes["audit_feedback"] / (rows - decisions),
        "archive_bytes_per_row": done.size / rows,
        "migration_rows_per_second": rows / migrated,
        "archive_rows_per_second": rows / archived,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=200_000)
    parser.add_argument("--conversions", type=int, default=100_000, help="a multiple of 1,000")
    parser.add_argument("--rate", type=float, default=2_000.0, help="decisions per second to scale a day to")
    parser.add_argument("--converting", type=int, default=10, help="decisions per conversion")
    args = parser.parse_args()
    figures = measure(args.decisions, args.conversions)
    decided = args.rate * SECONDS_PER_DAY
    converted = decided / args.converting
    day = {
        "decision_rows_per_day": decided,
        "feedback_rows_per_day": converted,
        "database_bytes_per_day": decided * figures["decision_bytes_per_row"]
        + converted * figures["feedback_bytes_per_row"],
        "archive_bytes_per_day": (decided + converted) * figures["archive_bytes_per_row"],
    }
    table = Table(title=f"the audit log in PostgreSQL: {args.decisions:,} decisions, {args.conversions:,} conversions")
    table.add_column("measure", no_wrap=True)
    table.add_column("value", justify="right")
    for name, value in figures.items():
        table.add_row(name.replace("_", " "), f"{value:,.0f}")
    for name, value in day.items():
        shown = f"{value / 1e9:,.1f} GB" if name.endswith("bytes_per_day") else f"{value / 1e6:,.1f} million"
        table.add_row(f"{name.replace('_', ' ')} at {args.rate:,.0f}/s", shown)
    Console(width=120).print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "audit_size.json").write_text(json.dumps({**figures, **day, "args": vars(args)}, indent=2))


if __name__ == "__main__":
    main()
