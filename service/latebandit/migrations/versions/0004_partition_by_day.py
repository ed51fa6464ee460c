"""Partition the decision and feedback tables by day (PostgreSQL), keeping every row.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26 00:00:00

PostgreSQL's range partitions need their key in the primary key, so the key becomes the queue key plus the
time the event was recorded (``at_us`` for decisions, ``received_at_us`` for feedback). That is still one
row per queued record: a repeated write of an entry carries the same time, and conflicts as before.

Each table is renamed aside, a partitioned table with the same columns and CHECK constraints takes its
name, with a partition per UTC day from the oldest row's day to three days ahead and a DEFAULT one, then
the rows move over and the old table is dropped: a copy, in one transaction, so a large log migrates in
a maintenance window (docs/operators.md gives the measured rate). SQLite (the embedded default) is left as
it is: it has no partitions, and its retention deletes rows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

QUEUE_KEY = "campaign, entry_ms, entry_seq, position"
TABLES = {"audit_decisions": "at_us", "audit_feedback": "received_at_us"}
DAY_US = 86_400_000_000
DAYS_AHEAD = 3


def _replace(table: str, primary_key: str, partition_by: str) -> None:
    """Move ``table`` into a new table of the same columns, keyed by ``primary_key`` (and partitioned by
    ``partition_by`` if not empty); the new table's days run from its oldest row to DAYS_AHEAD after today."""
    column = TABLES[table]
    old = f"{table}_old"
    op.execute(f"ALTER TABLE {table} RENAME TO {old}")
    op.execute(f"ALTER TABLE {old} DROP CONSTRAINT pk_{table}")
    op.execute(f"DROP INDEX ix_{table}_campaign_{column}")
    op.execute(f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) {partition_by}")
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY ({primary_key})")
    op.execute(f"CREATE INDEX ix_{table}_campaign_{column} ON {table} (campaign, {column})")
    if partition_by:
        op.execute(f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT")
        oldest = op.get_bind().exec_driver_sql(f"SELECT min({column}) FROM {old}").scalar()
        today = time.time_ns() // 1000 // DAY_US * DAY_US
        first = today - DAY_US if oldest is None else min(oldest // DAY_US * DAY_US, today - DAY_US)
        for start in range(first, today + (DAYS_AHEAD + 1) * DAY_US, DAY_US):
            name = f"{table}_p{time.strftime('%Y%m%d', time.gmtime(start // 1_000_000))}"
            op.execute(f"CREATE TABLE {name} PARTITION OF {table} FOR VALUES FROM ({start}) TO ({start + DAY_US})")
    op.execute(f"INSERT INTO {table} SELECT * FROM {old}")
    op.execute(f"DROP TABLE {old}")


def upgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    for table, column in TABLES.items():
        _replace(table, f"{QUEUE_KEY}, {column}", f"PARTITION BY RANGE ({column})")


def downgrade() -> None:
    if op.get_context().dialect.name != "postgresql":
        return
    for table in TABLES:
        _replace(table, QUEUE_KEY, "")
