"""Daily range partitions of the two high-volume audit tables in PostgreSQL, so that old days leave the log
as a ``DROP TABLE`` (instant, no vacuum) instead of a ``DELETE`` of 170 million rows.

``audit_decisions`` is partitioned by ``at_us`` and ``audit_feedback`` by ``received_at_us``: the time the
service recorded the event, the same column ``export --since/--until`` filter on, so a time range of the
export is exactly a set of partitions. One partition per UTC day, named ``<table>_pYYYYMMDD``; a DEFAULT
partition catches a row no day holds yet (a clock far ahead, a spooled fallback decision handed over
after its day was archived), so the log never refuses a row the state store accepted. Creating a day moves
the DEFAULT partition's rows of that day into it.

Campaign events are not partitioned: they are few, and every replay needs a campaign's creation first.
The embedded SQLite file has no partitions; retention deletes its rows instead (``drop_before``).

Partitions are created ahead by the audit writer (every hour) and by ``latebandit migrate``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Engine, text

from latebandit.audit.models import Decision, FeedbackEvent
from latebandit.timeutil import MICROS

DAY_US = 86_400 * MICROS
DAYS_AHEAD = 3
"""Days after today that exist before their first row: a writer down for up to that long (or a clock that
runs that far ahead) still writes into day partitions."""

PARTITIONED = {model.__tablename__: model.logged_at for model in (Decision, FeedbackEvent)}
"""Each partitioned table and its partition key column."""

ENSURE_LOCK = 0x6C62_7061  # advisory lock id: one process at a time creates partitions
ENSURE_LOCK_TIMEOUT = "2s"  # how long creating a day waits for its locks before trying again later
PARTITION_SUFFIX = re.compile(r"_(p\d{8}|default)$")
BOUND = re.compile(r"FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)")


def include_name(name: str | None, type_: str, _parents: object) -> bool:
    """Alembic's filter for comparing the database with the models: a partition (a day or DEFAULT) is not a
    table the models lack, the models describe its parent."""
    if type_ != "table" or name is None:
        return True
    return not (any(name.startswith(f"{parent}_") for parent in PARTITIONED) and PARTITION_SUFFIX.search(name))


@dataclass(frozen=True)
class Partition:
    name: str
    start_us: int | None  # None: the DEFAULT partition
    end_us: int | None


def day_start(moment_us: int) -> int:
    return moment_us - moment_us % DAY_US


def day_name(table: str, start_us: int) -> str:
    day = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=start_us)
    return f"{table}_p{day:%Y%m%d}"


def partitions(connection: Connection, table: str) -> list[Partition]:
    """The partitions of ``table``, the DEFAULT one included, as PostgreSQL's catalogue describes them."""
    rows = connection.execute(
        text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = CAST(:table AS regclass) ORDER BY 1"
        ),
        {"table": table},
    )
    found = []
    for name, bound in rows:
        match = BOUND.search(bound)
        start, end = (int(match[1]), int(match[2])) if match else (None, None)
        found.append(Partition(name, start, end))
    return found


def create_day(connection: Connection, table: str, column: str, start_us: int) -> None:
    """Create the day starting at ``start_us``, moving into it the rows the DEFAULT partition holds for it
    (PostgreSQL refuses to attach a range the DEFAULT partition has rows of)."""
    name, end_us = day_name(table, start_us), start_us + DAY_US
    # Held to the attach: a row committed into DEFAULT after the move would make the attach fail.
    connection.exec_driver_sql(f"LOCK TABLE {table}_default IN ACCESS EXCLUSIVE MODE")
    connection.exec_driver_sql(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    connection.exec_driver_sql(
        f"WITH moved AS (DELETE FROM {table}_default WHERE {column} >= {start_us} AND {column} < {end_us} "
        f"RETURNING *) INSERT INTO {name} SELECT * FROM moved"
    )
    bounds = f"FOR VALUES FROM ({start_us}) TO ({end_us})"
    connection.exec_driver_sql(f"ALTER TABLE {table} ATTACH PARTITION {name} {bounds}")


def ensure_days(engine: Engine, now_us: int, ahead: int = DAYS_AHEAD) -> list[str]:
    """Create the partitions of yesterday (unless archived), today and ``ahead`` days after, where
    missing; returns the names created. Nothing on SQLite."""
    if engine.dialect.name != "postgresql":
        return []
    created = []
    with engine.begin() as connection:
        # Attaching a day locks the DEFAULT partition exclusively: behind a long reader (an export holds
        # it for hours) the request would queue every insert after it. Give up quickly and retry later.
        connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{ENSURE_LOCK_TIMEOUT}'")
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ENSURE_LOCK})
        today = day_start(now_us)
        for table, column in PARTITIONED.items():
            existing = {day.start_us for day in partitions(connection, table) if day.start_us is not None}
            # Yesterday, unless the days kept start later: an archive dropped it, and its rows are archived.
            first = min(max(today - DAY_US, min(existing, default=today - DAY_US)), today)
            for start in range(first, today + (ahead + 1) * DAY_US, DAY_US):
                if start not in existing:
                    create_day(connection, table, column, start)
                    created.append(day_name(table, start))
    return created


def last_day(engine: Engine) -> int | None:
    """The start (epoch µs) of the latest day every partitioned table has a partition for; None on SQLite or
    when a table has none."""
    if engine.dialect.name != "postgresql":
        return None
    with engine.connect() as connection:
        lasts = [
            max((day.start_us for day in partitions(connection, table) if day.start_us is not None), default=None)
            for table in PARTITIONED
        ]
    return None if None in lasts else min(day for day in lasts if day is not None)


def check_boundary(engine: Engine, until_us: int) -> None:
    """Raise ValueError unless ``until_us`` falls between day partitions (a UTC midnight)."""
    if engine.dialect.name == "postgresql" and until_us % DAY_US:
        moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=until_us)
        raise ValueError(f"{moment:%Y-%m-%dT%H:%M:%SZ} is not a UTC midnight: the log is partitioned by day")


def drop_before(connection: Connection, until_us: int) -> None:
    """Remove every decision and feedback row recorded before ``until_us`` (a UTC midnight on PostgreSQL):
    drop the day partitions that end by then and delete the DEFAULT partition's older rows; on SQLite,
    delete. The caller holds the tables locked."""
    for table, column in PARTITIONED.items():
        if connection.dialect.name != "postgresql":
            connection.exec_driver_sql(f"DELETE FROM {table} WHERE {column} < {until_us}")
            continue
        quote = connection.dialect.identifier_preparer.quote  # names read from the catalogue
        for partition in partitions(connection, table):
            if partition.start_us is None:
                connection.exec_driver_sql(f"DELETE FROM {quote(partition.name)} WHERE {column} < {until_us}")
            elif partition.end_us is not None and partition.end_us <= until_us:
                connection.exec_driver_sql(f"DROP TABLE {quote(partition.name)}")
