"""The audit log against both back ends (a real PostgreSQL database and a SQLite file): migrations,
idempotent writes, exact round trips in queue order, the event-log export, and the writer's behaviour
when the database is down."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latebandit.audit.export import export_lines, record_to_line
from latebandit.audit.log import AuditLog
from latebandit.audit.migrate import alembic_config, head_revision
from latebandit.audit.models import Base
from latebandit.audit.partitions import include_name
from latebandit.audit.queue import QueueEntry
from latebandit.audit.records import Outcome, Record
from latebandit.audit.writer import AuditWriter
from latebandit.campaign import Campaign
from latebandit.config import Settings
from latebandit.store.base import StoreUnavailable
from latebandit.timeutil import parse_time

T0 = 1_800_000_000_000_000
SECOND = 1_000_000
CAMPAIGN = Campaign(
    id="summer-sale",
    arms=["a", "b", "c"],
    policy={"name": "delayed-klucb", "params": {}},
    delay={"family": "exponential", "mean": 86_400},
    window=604_800,
    created_at=T0,
)
names = itertools.count()


def driver_url(url: str) -> str:
    return Settings(database_url=url).sqlalchemy_url


@pytest.fixture
def log(database_url: str) -> Iterator[AuditLog]:
    audit = AuditLog(driver_url(database_url))
    audit.create_schema()
    yield audit
    audit.dispose()


def unreachable(database_url: str) -> str:
    """A URL of the same kind as ``database_url`` that cannot be connected to."""
    if database_url.startswith("sqlite"):
        return "sqlite:////nonexistent-directory/audit.db"
    return "postgresql://postgres@127.0.0.1:1/test"


# records as the state stores queue them ------------------------------------------------------------


def create(campaign: Campaign = CAMPAIGN, at: int = T0) -> Record:
    return {"type": "campaign", "campaign": campaign.id, "at": at, "action": "create",
            "config": campaign.model_dump(mode="json")}  # fmt: skip


def status(action: str, at: int) -> Record:
    return {"type": "campaign", "campaign": CAMPAIGN.id, "at": at, "action": action}


def decision(seq: int, at: int, request_id: str | None = None) -> Record:
    return {"type": "decision", "campaign": CAMPAIGN.id, "decision_id": f"d{seq}", "arm": "b", "at": at,
            "propensity": 0.5, "policy": "delayed-klucb", "version": 1, "fallback": False,
            "request_id": request_id, "seq": seq}  # fmt: skip


def conversion(seq: int, event_id: str | None, outcome: Outcome, occurred_at: int) -> Record:
    return {"type": "conversion", "campaign": CAMPAIGN.id, "event_id": event_id, "decision_id": f"d{seq}",
            "arm": "b", "decided_at": T0 + seq * SECOND, "occurred_at": occurred_at,
            "received_at": occurred_at + SECOND, "value": 1.0, "outcome": outcome.value}  # fmt: skip


def aggregate(start: int, end: int) -> Record:
    return {"type": "aggregate", "campaign": CAMPAIGN.id, "event_id": "agg-1", "start": start, "end": end,
            "received_at": end + SECOND, "value": 17.0, "outcome": "counted"}  # fmt: skip


def watermark(at: int) -> Record:
    return {"type": "watermark", "campaign": CAMPAIGN.id, "at": at, "received_at": at + SECOND,
            "outcome": "counted"}  # fmt: skip


def entries_of(campaign: str, groups: list[list[Record]], start: int = 1) -> list[QueueEntry]:
    return [QueueEntry(campaign, f"{T0 // 1000}-{start + n}", records) for n, records in enumerate(groups)]


def day_of_traffic() -> list[list[Record]]:
    """A campaign's life: creation, decisions, every kind of feedback and outcome, a pause and a resume."""
    return [
        [create()],
        [decision(1, T0 + SECOND, request_id="r1")],
        [decision(2, T0 + 2 * SECOND)],
        [conversion(1, "e1", Outcome.COUNTED, T0 + 10 * SECOND),
         conversion(1, "e2", Outcome.REPEAT, T0 + 11 * SECOND),
         conversion(2, None, Outcome.CENSORED, T0 + 700_000 * SECOND)],
        [conversion(2, "e3", Outcome.STALE, T0 + 12 * SECOND)],
        [status("pause", T0 + 20 * SECOND)],
        [status("resume", T0 + 30 * SECOND)],
        [aggregate(T0, T0 + 3600 * SECOND), watermark(T0 + 3600 * SECOND)],
    ]  # fmt: skip


# schema -------------------------------------------------------------------------------------------


def test_migrations_build_the_models_schema_and_status_tracks_it(database_url: str) -> None:
    url = driver_url(database_url)
    audit = AuditLog(url)
    try:
        assert audit.schema_status().current is None
        assert not audit.schema_status().up_to_date
        audit.create_schema()
        audit.create_schema()  # already at head: nothing to do
        status_now = audit.schema_status()
        assert status_now.up_to_date
        assert status_now.current == status_now.head == head_revision()
        with audit.engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"include_name": include_name})
            assert compare_metadata(context, Base.metadata) == []
        command.downgrade(alembic_config(url), "base")
        behind = audit.schema_status()
        assert (behind.current, behind.up_to_date) == (None, False)
    finally:
        audit.dispose()


def test_sqlite_uses_wal_and_normal_sync(sqlite_url: str) -> None:
    audit = AuditLog(driver_url(sqlite_url))
    with audit.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    audit.dispose()


def test_unsupported_database_is_refused() -> None:
    with pytest.raises(ValueError, match="PostgreSQL or SQLite"):
        AuditLog("mysql://localhost/audit")


# writes and reads ---------------------------------------------------------------------------------


def test_write_is_idempotent(log: AuditLog) -> None:
    entries = entries_of(CAMPAIGN.id, day_of_traffic())
    rows = sum(len(entry.records) for entry in entries)
    assert log.write(entries) == rows
    assert log.write(entries) == 0
    assert log.write(entries[2:5]) == 0
    assert len(list(log.records(None, None, None))) == rows


def test_records_round_trip_in_queue_order_whatever_the_write_order(log: AuditLog) -> None:
    groups = day_of_traffic()
    entries = entries_of(CAMPAIGN.id, groups)
    for entry in reversed(entries):  # as after a crash that acknowledged later entries first
        log.write([entry])
    assert list(log.records(CAMPAIGN.id, None, None)) == [record for group in groups for record in group]


def test_campaigns_follow_one_another_each_in_queue_order(log: AuditLog) -> None:
    other = Campaign(**CAMPAIGN.model_dump() | {"id": "autumn"})
    first = entries_of("summer-sale", [[create()], [decision(1, T0 + SECOND)]], start=10)
    second = entries_of("autumn", [[create(other, T0 + 5 * SECOND)]], start=1)
    log.write(first + second)
    assert log.campaigns() == ["autumn", "summer-sale"]
    assert [(record["campaign"], record["type"]) for record in log.records(None, None, None)] == [
        ("autumn", "campaign"), ("summer-sale", "campaign"), ("summer-sale", "decision"),
    ]  # fmt: skip
    assert [record["campaign"] for record in log.records("autumn", None, None)] == ["autumn"]
    assert list(log.records("nobody", None, None)) == []


def test_time_range_filters_on_when_the_service_recorded_the_event(log: AuditLog) -> None:
    log.write(entries_of(CAMPAIGN.id, day_of_traffic()))
    late = T0 + 700_000 * SECOND  # the censored conversion arrived then, long after its decision
    assert [record["type"] for record in log.records(None, late, None)] == ["conversion"]
    window = list(log.records(None, T0 + 2 * SECOND, T0 + 20 * SECOND))
    assert [record.get("seq") or record.get("event_id") for record in window] == [2, "e1", "e2", "e3"]


def test_concurrent_writers_and_readers_from_threads(log: AuditLog) -> None:
    """The service writes from the writer's thread while exports and replays read from others."""
    groups = [[decision(seq, T0 + seq * SECOND)] for seq in range(1, 201)]
    entries = entries_of(CAMPAIGN.id, [[create()], *groups])
    with ThreadPoolExecutor(max_workers=8) as pool:
        writes = [pool.submit(log.write, entries[start::8]) for start in range(8)]
        reads = [pool.submit(lambda: list(log.records(None, None, None))) for _ in range(4)]
        assert sum(write.result() for write in writes) == len(entries)
        for read in reads:
            assert len(read.result()) <= len(entries)
    records = list(log.records(CAMPAIGN.id, None, None))
    assert [record.get("seq") for record in records] == [None, *range(1, 201)]


identifiers = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,40}", fullmatch=True)
moments = st.integers(min_value=0, max_value=4_102_444_800 * SECOND)
unit = st.floats(min_value=0.0, max_value=1.0)
json_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**62), 2**62)
    | st.floats(allow_nan=False, allow_infinity=False)
    | json_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(json_text, inner, max_size=4),
    max_leaves=12,
)
outcomes = st.sampled_from([outcome.value for outcome in Outcome if outcome is not Outcome.DUPLICATE])


def records_of(campaign: str) -> st.SearchStrategy[Record]:
    """Any record a store may queue (decisions get their seq when the entries are built)."""

    def shaped(kind: str, **fields: st.SearchStrategy) -> st.SearchStrategy[Record]:
        return st.fixed_dictionaries({"type": st.just(kind), "campaign": st.just(campaign), **fields})

    event_ids = st.none() | identifiers
    configs = st.dictionaries(json_text, json_values, max_size=5)
    return st.one_of(
        shaped("campaign", at=moments, action=st.just("create"), config=configs),
        shaped("campaign", at=moments, action=st.sampled_from(["pause", "resume"])),
        shaped(
            "decision", decision_id=identifiers, arm=identifiers, at=moments, propensity=unit,
            policy=identifiers, version=st.integers(1, 2**31 - 1), fallback=st.booleans(), request_id=event_ids,
        ),
        shaped(
            "conversion", event_id=event_ids, decision_id=identifiers, arm=identifiers, decided_at=moments,
            occurred_at=moments, received_at=moments, value=unit, outcome=outcomes,
        ),
        shaped(
            "aggregate", event_id=event_ids, start=moments, end=moments, received_at=moments,
            value=st.floats(min_value=0.0, max_value=1e300), outcome=outcomes,
        ),
        shaped("watermark", at=moments, received_at=moments, outcome=outcomes),
    )  # fmt: skip


@st.composite
def queued(draw: st.DrawFn) -> tuple[str, list[QueueEntry]]:
    """Entries of a fresh campaign with increasing ids, as a store queues them."""
    campaign = f"c{next(names)}"
    groups = draw(st.lists(st.lists(records_of(campaign), min_size=1, max_size=5), min_size=1, max_size=8))
    seqs = itertools.count(1)
    for group in groups:
        for record in group:
            if record["type"] == "decision":
                record["seq"] = next(seqs)
    entry_ids = st.tuples(st.integers(0, 2**48), st.integers(0, 2**32))
    ids = sorted(draw(st.lists(entry_ids, min_size=len(groups), max_size=len(groups), unique=True)))
    return campaign, [QueueEntry(campaign, f"{ms}-{seq}", group) for (ms, seq), group in zip(ids, groups, strict=True)]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(queued(), st.randoms(use_true_random=False))
def test_every_record_round_trips_exactly(
    log: AuditLog, case: tuple[str, list[QueueEntry]], rng: random.Random
) -> None:
    campaign, entries = case
    shuffled = rng.sample(entries, len(entries))
    rows = sum(len(entry.records) for entry in entries)
    assert log.write(shuffled) == rows
    assert log.write(entries) == 0
    assert list(log.records(campaign, None, None)) == [record for entry in entries for record in entry.records]


# export --------------------------------------------------------------------------------------------


def test_export_lines_have_the_contract_shapes(log: AuditLog) -> None:
    log.write(entries_of(CAMPAIGN.id, day_of_traffic()))
    lines = [orjson.loads(line) for line in export_lines(log, None, None, None)]
    assert all(value is not None for line in lines for value in line.values())

    created = lines[0]
    assert created["type"] == "campaign"
    body = {key: value for key, value in created.items() if key != "type"}
    assert Campaign.model_validate(body | {"created_at": parse_time(body["created_at"])}) == CAMPAIGN

    by_type: dict[str, list[dict]] = {}
    for line in lines[1:]:
        by_type.setdefault(line["type"], []).append(line)
    assert by_type["decision"][0] == {
        "type": "decision", "campaign": CAMPAIGN.id, "decision_id": "d1", "arm": "b",
        "at": "2027-01-15T08:00:01Z", "propensity": 0.5,
        "seq": 1, "policy": "delayed-klucb", "version": 1, "fallback": False, "request_id": "r1",
    }  # fmt: skip
    assert "request_id" not in by_type["decision"][1]
    conversions = by_type["conversion"]
    assert [line["outcome"] for line in conversions] == ["counted", "repeat", "censored", "stale"]
    assert "event_id" not in conversions[2]  # identified by its decision
    for line in conversions:
        assert {"type", "campaign", "decision_id", "occurred_at", "value"} <= line.keys()
        parse_time(line["occurred_at"])
    contract = ("type", "event_id", "campaign", "start", "end", "value")
    assert {key: by_type["aggregate"][0][key] for key in contract} == {
        "type": "aggregate", "event_id": "agg-1", "campaign": CAMPAIGN.id,
        "start": "2027-01-15T08:00:00Z", "end": "2027-01-15T09:00:00Z", "value": 17.0,
    }  # fmt: skip
    assert by_type["watermark"][0]["at"] == "2027-01-15T09:00:00Z"
    assert by_type["campaign"] == [
        {"type": "campaign", "id": CAMPAIGN.id, "status": "paused", "at": "2027-01-15T08:00:20Z"},
        {"type": "campaign", "id": CAMPAIGN.id, "status": "active", "at": "2027-01-15T08:00:30Z"},
    ]


def test_export_since_keeps_later_records(log: AuditLog) -> None:
    log.write(entries_of(CAMPAIGN.id, day_of_traffic()))
    since = T0 + 20 * SECOND
    lines = [orjson.loads(line) for line in export_lines(log, CAMPAIGN.id, since, None)]
    assert [line["type"] for line in lines] == [
        "conversion",
        "campaign",
        "campaign",
        "aggregate",
        "watermark",
    ]
    assert lines == [record_to_line(record) for record in log.records(CAMPAIGN.id, since, None)]


# the writer ----------------------------------------------------------------------------------------


class FakeQueue:
    """The AuditQueue protocol in a dict, as the store keeps it; ``fail_acks`` simulates a crash between
    the commit and the acknowledgement."""

    def __init__(self, entries: list[QueueEntry]) -> None:
        self.entries: dict[str, list[QueueEntry]] = {}
        for entry in entries:
            self.entries.setdefault(entry.campaign, []).append(entry)
        self.fail_acks = 0

    async def audit_campaigns(self) -> list[str]:
        return [campaign for campaign, entries in self.entries.items() if entries]

    async def read_audit(self, campaign: str, limit: int) -> list[QueueEntry]:
        return self.entries.get(campaign, [])[:limit]

    async def ack_audit(self, campaign: str, entry_ids: list[str]) -> None:
        if self.fail_acks:
            self.fail_acks -= 1
            raise StoreUnavailable("queue went away")
        self.entries[campaign] = [entry for entry in self.entries[campaign] if entry.entry_id not in entry_ids]

    async def claim_audit(self, campaign: str, seconds: float) -> bool:
        return True

    async def audit_backlog(self) -> int:
        return sum(map(len, self.entries.values()))


def traffic_entries() -> list[QueueEntry]:
    return entries_of(CAMPAIGN.id, day_of_traffic()) + entries_of("autumn", [[create(at=T0)]])


async def test_writer_keeps_entries_while_the_database_is_down_then_writes_them_once(
    database_url: str, log: AuditLog
) -> None:
    entries = traffic_entries()
    rows = sum(len(entry.records) for entry in entries)
    queue = FakeQueue(entries)
    down = AuditLog(driver_url(unreachable(database_url)))
    writer = AuditWriter(queue, down, batch=3)

    assert await writer.drain_once() == 0
    assert writer.errors == 2  # both campaigns failed, and the pass went on after the first
    assert writer.last_success_us is None
    assert await queue.audit_backlog() == len(entries)
    with pytest.raises(StoreUnavailable, match="audit log cannot be written"):
        await writer.flush()

    writer.log = log  # the database is back
    await writer.flush()
    assert (writer.rows_written, await queue.audit_backlog()) == (rows, 0)
    assert writer.last_success_us is not None and writer.lag() < 60
    assert len(list(log.records(None, None, None))) == rows
    down.dispose()


async def test_a_crash_between_commit_and_ack_repeats_no_row(log: AuditLog) -> None:
    entries = traffic_entries()
    queue = FakeQueue(entries)
    queue.fail_acks = 1
    writer = AuditWriter(queue, log, batch=100)
    assert await writer.drain_once() == sum(len(entry.records) for entry in entries)  # all committed
    assert writer.errors == 1
    assert await queue.audit_backlog() == len(day_of_traffic())  # one campaign's ack was lost
    assert await writer.drain_once() == 0  # its entries are written again: no new row
    assert await queue.audit_backlog() == 0


async def test_run_drains_until_stopped(log: AuditLog) -> None:
    queue = FakeQueue(traffic_entries())
    writer = AuditWriter(queue, log, batch=2)
    stop = asyncio.Event()
    task = asyncio.create_task(writer.run(0.01, stop))
    for _ in range(500):
        if not await queue.audit_backlog():
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    assert await queue.audit_backlog() == 0
    assert writer.rows_written == len(list(log.records(None, None, None)))


async def test_a_restarted_memory_queue_continues_after_the_last_logged_entry(log: AuditLog) -> None:
    """Queue ids are the rows' keys: an embedded service whose clock went back must not reuse one (its rows
    would be dropped as already written)."""
    from latebandit.store.memory import MemoryStore

    record = {"type": "campaign", "campaign": "c", "at": 1, "action": "pause"}
    log.write([QueueEntry("c", "9000000000000-4", [record]), QueueEntry("c", "8000-0", [record])])
    assert log.last_entry() == (9_000_000_000_000, 4)
    store = MemoryStore(clock=lambda: 1_000_000)  # a clock far behind the log
    store.continue_after(log.last_entry())
    assert store._next_entry_id() == "9000000000000-5"
