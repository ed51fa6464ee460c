"""The audit schema: one table per record family, each row keyed by where its record sat in the queue.

The primary key of every table is the queue key (campaign, entry_ms, entry_seq, position): the id of the
queue entry split into its two integers, and the record's position inside the entry. Writing an entry a
second time (the writer crashed between commit and acknowledgement) therefore inserts nothing, and
reading a campaign back in key order reproduces the order in which the store applied its changes.

Times are BIGINT epoch microseconds in ``*_us`` columns, as inside the service: exact and portable between
PostgreSQL and SQLite. In PostgreSQL the decision and feedback tables are partitioned by day on their
``logged_at`` column, which their primary key there includes (audit/partitions.py, migration 0004).
Strings are unbounded: the API validates ids, and the audit log must never refuse a row the state store
has already accepted.

Each model converts between a record (service/latebandit/audit/records.py) and a row, so that ``records()`` hands back
exactly the dicts the store queued.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, ClassVar

import orjson
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Double,
    Index,
    Integer,
    MetaData,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from latebandit.audit.records import FEEDBACK_TYPES, Outcome, Record

TIME_KEYS = frozenset({"at", "decided_at", "occurred_at", "start", "end", "received_at"})
"""Record keys that hold epoch microseconds; each is stored in the column of the same name plus ``_us``."""

QUEUE_KEY = ("campaign", "entry_ms", "entry_seq", "position")

CAMPAIGN_ACTIONS = ("create", "pause", "resume", "policy", "plan", "archive", "arms")

DECISION_FIELDS = (
    "seq",
    "decision_id",
    "arm",
    "at",
    "propensity",
    "policy",
    "version",
    "fallback",
    "request_id",
)

CONTEXTUAL_FIELDS = ("features", "footprint", "actions")
"""What a contextual decision's record adds (engine/contextual.py's ``decision_fields``)."""

FEEDBACK_FIELDS: dict[str, tuple[str, ...]] = {
    "conversion": ("event_id", "decision_id", "arm", "decided_at", "occurred_at", "received_at", "value"),
    "aggregate": ("event_id", "start", "end", "received_at", "value"),
    "watermark": ("at", "received_at"),
}
"""The keys of each feedback record besides type, campaign and outcome (records.py)."""


def column_of(key: str) -> str:
    return f"{key}_us" if key in TIME_KEYS else key


def columns(record: Record, keys: tuple[str, ...]) -> dict[str, Any]:
    return {column_of(key): record[key] for key in keys}


def rebuilt(kind: str, row: Mapping[Any, Any], keys: tuple[str, ...]) -> Record:
    """The record a row was made from: its type, campaign (from the queue key) and ``keys``."""
    record = {"type": kind, "campaign": row["campaign"]}
    for key, column in _columns_of(keys):
        record[key] = row[column]
    return record


@functools.cache
def _columns_of(keys: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Each key with its column: an export or a replay reads millions of rows with the same few keys."""
    return tuple((key, column_of(key)) for key in keys)


FEEDBACK_COLUMNS = tuple({column_of(key) for keys in FEEDBACK_FIELDS.values() for key in keys})


def quoted(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{value}'" for value in values)


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class QueueKeyed:
    """The queue key, the primary key of every audit table."""

    campaign: Mapped[str] = mapped_column(String, primary_key=True)
    entry_ms: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    entry_seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)

    logged_at: ClassVar[str]
    """The column ``since``/``until`` filter on: when the service recorded the event."""


class CampaignEvent(QueueKeyed, Base):
    __tablename__ = "audit_campaign_events"
    __table_args__ = (
        CheckConstraint(f"action IN ({quoted(CAMPAIGN_ACTIONS)})", name="action"),
        Index(None, "campaign", "at_us"),
    )
    logged_at = "at_us"

    at_us: Mapped[int] = mapped_column(BigInteger)
    action: Mapped[str] = mapped_column(String)
    config: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))  # create and policy

    @staticmethod
    def row(record: Record) -> dict[str, Any]:
        return {"at_us": record["at"], "action": record["action"], "config": record.get("config")}

    @staticmethod
    def record(row: Mapping[Any, Any]) -> Record:
        record = rebuilt("campaign", row, ("at", "action"))
        if row["config"] is not None:
            record["config"] = row["config"]
        return record


class Decision(QueueKeyed, Base):
    __tablename__ = "audit_decisions"
    __table_args__ = (Index(None, "campaign", "at_us"),)
    logged_at = "at_us"

    # The campaign's decision count after this one; null for a fallback, which is not counted. Not unique:
    # a store that lost its data counts again from 1, and the audit log must keep accepting rows then.
    seq: Mapped[int | None] = mapped_column(BigInteger)
    decision_id: Mapped[str] = mapped_column(String)
    arm: Mapped[str] = mapped_column(String)
    at_us: Mapped[int] = mapped_column(BigInteger)
    propensity: Mapped[float] = mapped_column(Double)
    policy: Mapped[str] = mapped_column(String)
    version: Mapped[int] = mapped_column(Integer)
    fallback: Mapped[bool] = mapped_column(Boolean)
    request_id: Mapped[str | None] = mapped_column(String)
    # A contextual decision's CONTEXTUAL_FIELDS as a JSON object (text: the table is written by COPY); else null.
    contextual: Mapped[str | None] = mapped_column(Text)

    @staticmethod
    def row(record: Record) -> dict[str, Any]:
        extra = {key: record[key] for key in CONTEXTUAL_FIELDS if key in record}
        return columns(record, DECISION_FIELDS) | {"contextual": orjson.dumps(extra).decode() if extra else None}

    @staticmethod
    def record(row: Mapping[Any, Any]) -> Record:
        record = rebuilt("decision", row, DECISION_FIELDS)
        return record | orjson.loads(row["contextual"]) if row["contextual"] else record


class FeedbackEvent(QueueKeyed, Base):
    """Conversions, aggregates and watermarks: one table, the columns a type does not have left null."""

    __tablename__ = "audit_feedback"
    __table_args__ = (
        CheckConstraint(f"type IN ({quoted(FEEDBACK_TYPES)})", name="type"),
        CheckConstraint(f"outcome IN ({quoted(tuple(Outcome))})", name="outcome"),
        Index(None, "campaign", "received_at_us"),
    )
    logged_at = "received_at_us"

    type: Mapped[str] = mapped_column(String)
    event_id: Mapped[str | None] = mapped_column(String)
    decision_id: Mapped[str | None] = mapped_column(String)
    arm: Mapped[str | None] = mapped_column(String)
    decided_at_us: Mapped[int | None] = mapped_column(BigInteger)
    occurred_at_us: Mapped[int | None] = mapped_column(BigInteger)
    start_us: Mapped[int | None] = mapped_column(BigInteger)
    end_us: Mapped[int | None] = mapped_column(BigInteger)
    at_us: Mapped[int | None] = mapped_column(BigInteger)
    received_at_us: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float | None] = mapped_column(Double)
    outcome: Mapped[str] = mapped_column(String)

    @staticmethod
    def row(record: Record) -> dict[str, Any]:
        kind = record["type"]
        empty = dict.fromkeys(FEEDBACK_COLUMNS)  # every row the same keys: one executemany per table
        return empty | columns(record, FEEDBACK_FIELDS[kind]) | {"type": kind, "outcome": record["outcome"]}

    @staticmethod
    def record(row: Mapping[Any, Any]) -> Record:
        return rebuilt(row["type"], row, (*FEEDBACK_FIELDS[row["type"]], "outcome"))


AuditModel = type[CampaignEvent] | type[Decision] | type[FeedbackEvent]

MODELS: tuple[AuditModel, ...] = (CampaignEvent, Decision, FeedbackEvent)

TABLE_OF_TYPE: dict[str, AuditModel] = {
    "campaign": CampaignEvent,
    "decision": Decision,
    **dict.fromkeys(FEEDBACK_TYPES, FeedbackEvent),
}
"""Where each record type is stored."""
