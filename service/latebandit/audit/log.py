"""The audit log in SQL (PostgreSQL in production, a SQLite file embedded): idempotent writes of queue
entries, and the records streamed back in queue order for export, replay and rebuild.

Every method is synchronous and thread-safe (a pooled connection per call): the async service calls them
through ``asyncio.to_thread`` so a slow database never blocks the event loop.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Table, create_engine, event, select
from sqlalchemy.dialects import postgresql, sqlite

from latebandit.audit import migrate, partitions
from latebandit.audit.models import (
    MODELS,
    QUEUE_KEY,
    TABLE_OF_TYPE,
    AuditModel,
    Base,
    CampaignEvent,
    Decision,
    FeedbackEvent,
)
from latebandit.audit.queue import QueueEntry
from latebandit.audit.records import Record

INSERTS: dict[str, Callable[[Table], postgresql.Insert | sqlite.Insert]] = {
    "postgresql": postgresql.insert,
    "sqlite": sqlite.insert,
}
STREAM_CHUNK = 1_000
STATEMENT_TIMEOUT_MS = 60_000
# A transaction whose client vanished in a network partition (the server never saw the connection close)
# keeps its row locks until the server's TCP keepalive gives up, two hours by default; the writer's retry
# of the same rows would wait on those locks all that time. The server ends such a transaction sooner.
IDLE_IN_TRANSACTION_MS = 10_000
REMOVAL_LOCK_TIMEOUT = "10s"  # how long an archive's drop waits for a lock before it gives up (and drops nothing)
# The drop counts the range's rows first (about 60 ns a row): more than the usual statement timeout for a
# few days of traffic, and writes wait meanwhile, so archives go a day at a time (docs/operators.md).
REMOVAL_STATEMENT_TIMEOUT = "600s"


def audit_engine(sqlalchemy_url: str, **options: Any) -> Engine:
    """An engine for the audit database. SQLite gets WAL (readers never block the writer), synchronous
    NORMAL (durable across a process crash, one fsync per checkpoint), connections usable from any thread,
    and real transactions (BEGIN emitted by SQLAlchemy, so reads in one transaction see one snapshot and
    DDL is transactional). PostgreSQL connections are checked before use, so a restarted server costs
    one retry, not an error."""
    if sqlalchemy_url.startswith("sqlite"):
        engine = create_engine(sqlalchemy_url, connect_args={"check_same_thread": False, "timeout": 30}, **options)

        @event.listens_for(engine, "connect")
        def _configure(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # SQLAlchemy, not the driver, begins transactions
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(connection: Connection) -> None:
            connection.exec_driver_sql("BEGIN")

        return engine
    if sqlalchemy_url.startswith("postgresql"):
        # Plain executemany of a one-row INSERT (psycopg pipelines it): SQLAlchemy's default multi-row VALUES
        # pages are too long for psycopg's statement cache and are re-parsed client-side every time.
        return create_engine(
            sqlalchemy_url,
            pool_pre_ping=True,
            # A hung server must not hold the writer (and every flush) for the kernel's TCP timeout.
            connect_args={
                "connect_timeout": 5,
                "options": f"-c statement_timeout={STATEMENT_TIMEOUT_MS} "
                f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}",
                "keepalives": 1,
                "keepalives_idle": 30,
                "keepalives_interval": 10,
                "keepalives_count": 3,
            },
            use_insertmanyvalues=False,
            **options,
        )
    raise ValueError(f"the audit log needs PostgreSQL or SQLite, not {sqlalchemy_url.split(':', 1)[0]!r}")


COPIED = (Decision, FeedbackEvent)
"""The high-volume tables, written by COPY (their columns are plain scalars; campaign events carry JSON)."""


def _copy_rows(connection: Connection, model: AuditModel, values: list[dict[str, Any]]) -> int:
    """COPY the rows into a session-private staging table, then move them over in one INSERT that skips the
    queue keys already present (a repeated write inserts nothing, as the executemany path does): several times
    the records/s of the pipelined executemany of one-row INSERTs (benchmarks/audit_bench.py measures both)."""
    table = model.__tablename__
    staging = f"staging_{table}"
    names = [column.name for column in model.__table__.columns]
    listed = ", ".join(names)
    connection.exec_driver_sql(
        f"CREATE TEMP TABLE IF NOT EXISTS {staging} (LIKE {table} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
    )
    driver = connection.connection.driver_connection  # psycopg's own: SQLAlchemy has no COPY
    if driver is None:
        raise RuntimeError("the audit log's connection was closed before its COPY")
    cursor = driver.cursor()
    with cursor.copy(f"COPY {staging} ({listed}) FROM STDIN") as copy:
        for row in values:
            copy.write_row([row[name] for name in names])
    moved = connection.exec_driver_sql(
        # No conflict target: the partitioned tables' key adds the partition column to the queue key
        # (audit/partitions.py), and a repeated record repeats that column too.
        f"INSERT INTO {table} ({listed}) SELECT {listed} FROM {staging} ON CONFLICT DO NOTHING"
    )
    return moved.rowcount


def _count_before(connection: Connection, until_us: int) -> dict[str, int]:
    return {
        table: connection.exec_driver_sql(f"SELECT count(*) FROM {table} WHERE {column} < {until_us}").scalar_one()
        for table, column in partitions.PARTITIONED.items()
    }


@dataclass(frozen=True)
class SchemaStatus:
    current: str | None  # None: no schema yet
    head: str

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head


class AuditLog:
    def __init__(self, sqlalchemy_url: str) -> None:
        self.url = sqlalchemy_url
        self.engine = audit_engine(sqlalchemy_url)
        self._insert = INSERTS[self.engine.dialect.name]

    def create_schema(self) -> None:
        """Bring the schema to head through the same Alembic migrations as ``latebandit migrate``, so an
        embedded SQLite file has the same schema history as a PostgreSQL database."""
        migrate.upgrade(self.url)

    def schema_status(self) -> SchemaStatus:
        return SchemaStatus(migrate.current_revision(self.url), migrate.head_revision())

    def ping(self) -> None:
        with self.engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")

    def dispose(self) -> None:
        self.engine.dispose()

    def write(self, entries: list[QueueEntry]) -> int:
        """Insert the entries' records in one transaction; rows already there (same queue key) are skipped,
        so writing an entry again is harmless. Returns the rows actually inserted."""
        rows: defaultdict[AuditModel, list[dict[str, Any]]] = defaultdict(list)
        for entry in entries:
            entry_ms, entry_seq = entry.order_key()
            for position, record in enumerate(entry.records):
                model = TABLE_OF_TYPE[record["type"]]
                key = {
                    "campaign": entry.campaign,
                    "entry_ms": entry_ms,
                    "entry_seq": entry_seq,
                    "position": position,
                }
                rows[model].append(key | model.row(record))
        inserted = 0
        with self.engine.begin() as connection:
            # Tables in one order, MODELS', the one archive's drop and partition creation lock them in: an
            # order set by the batch's first record would deadlock against them.
            for model, values in ((model, rows[model]) for model in MODELS if model in rows):
                if self.engine.dialect.name == "postgresql" and model in COPIED:
                    inserted += _copy_rows(connection, model, values)
                    continue
                table = Base.metadata.tables[model.__tablename__]
                statement = self._insert(table).on_conflict_do_nothing(index_elements=QUEUE_KEY)
                statement = statement.execution_options(preserve_rowcount=True)
                inserted += connection.execute(statement, values).rowcount
        return inserted

    def last_entry(self) -> tuple[int, int]:
        """The highest queue id written, so that a new in-process queue continues after it."""
        with self.engine.connect() as connection:
            keys = [
                connection.execute(
                    select(model.entry_ms, model.entry_seq).order_by(model.entry_ms.desc(), model.entry_seq.desc())
                ).first()
                for model in MODELS
            ]
        return max((tuple(key) for key in keys if key is not None), default=(0, 0))  # type: ignore[return-value]

    def campaigns(self) -> list[str]:
        """Every campaign the log knows (each one's first record is its creation)."""
        with self.engine.connect() as connection:
            return sorted(connection.scalars(select(CampaignEvent.campaign).distinct()))

    @staticmethod
    def table_of(record: Record) -> str | None:
        """The partitioned table a record is stored in (None for a campaign event, which is kept)."""
        table = TABLE_OF_TYPE[record["type"]].__tablename__
        return table if table in partitions.PARTITIONED else None

    def rows_before(self, until_us: int) -> dict[str, int]:
        """The decision and feedback rows recorded before ``until_us``, per table."""
        with self.engine.connect() as connection:
            return _count_before(connection, until_us)

    def remove_before(self, until_us: int, expected: dict[str, int]) -> None:
        """Drop the decision and feedback rows recorded before ``until_us``, provided the log holds exactly
        ``expected`` of them per table (what an archive holds); ValueError, and nothing dropped, otherwise.
        PostgreSQL: from the count to the drop no row can be written (readers go on until the drop itself),
        and a lock not had within REMOVAL_LOCK_TIMEOUT fails the call rather than stall the writer. SQLite:
        a row written after the count makes the delete fail (the database is locked), dropping nothing."""
        with self.engine.begin() as connection:
            if self.engine.dialect.name == "postgresql":
                connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{REMOVAL_LOCK_TIMEOUT}'")
                connection.exec_driver_sql(f"SET LOCAL statement_timeout = '{REMOVAL_STATEMENT_TIMEOUT}'")
                for table in partitions.PARTITIONED:
                    connection.exec_driver_sql(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")
            held = _count_before(connection, until_us)
            for table, count in held.items():
                if count != expected.get(table, 0):
                    raise ValueError(
                        f"{table} holds {count} rows before that time, the archive {expected.get(table, 0)}"
                    )
            partitions.drop_before(connection, until_us)

    def has_campaign(self, campaign: str) -> bool:
        with self.engine.connect() as connection:
            query = select(CampaignEvent.campaign).where(CampaignEvent.campaign == campaign).limit(1)
            return connection.scalar(query) is not None

    def created(self, campaign: str) -> dict[str, Any] | None:
        """The configuration a campaign was created with (ids are never reused, so there is one)."""
        with self.engine.connect() as connection:
            query = select(CampaignEvent.config).where(
                CampaignEvent.campaign == campaign, CampaignEvent.action == "create"
            )
            return connection.scalar(query.limit(1))

    def records(self, campaign: str | None, since_us: int | None, until_us: int | None) -> Iterator[Record]:
        """The records as the store queued them, in queue order within each campaign, campaigns one after
        another. ``since_us`` (inclusive) and ``until_us`` (exclusive) bound the time the service recorded
        each event (a campaign change's or decision's ``at``, a feedback event's ``received_at``): a
        conversion falls in the range it arrived in, however long after its decision. Streamed from one
        snapshot."""
        campaigns = [campaign] if campaign is not None else self.campaigns()
        with self._snapshot() as connection:
            for name in campaigns:
                streams = [self._stream(connection, model, name, since_us, until_us) for model in MODELS]
                for _, record in heapq.merge(*streams, key=lambda pair: pair[0]):
                    yield record

    def _snapshot(self) -> Connection:
        """A connection whose reads share one snapshot (SQLite: one BEGIN; PostgreSQL: repeatable read)."""
        connection = self.engine.connect()
        if self.engine.dialect.name == "postgresql":
            return connection.execution_options(isolation_level="REPEATABLE READ")
        return connection

    @staticmethod
    def _stream(
        connection: Connection, model: AuditModel, campaign: str, since_us: int | None, until_us: int | None
    ) -> Iterator[tuple[tuple[int, int, int], Record]]:
        table = model.__table__
        query = select(table).where(table.c.campaign == campaign)
        if since_us is not None:
            query = query.where(table.c[model.logged_at] >= since_us)
        if until_us is not None:
            query = query.where(table.c[model.logged_at] < until_us)
        query = query.order_by(table.c.entry_ms, table.c.entry_seq, table.c.position)
        for row in connection.execution_options(yield_per=STREAM_CHUNK).execute(query).mappings():
            yield (row["entry_ms"], row["entry_seq"], row["position"]), model.record(row)
