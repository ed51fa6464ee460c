"""Retention on both audit back ends: day partitions in PostgreSQL (created ahead, kept through the migration
from the unpartitioned schema), and ``archive``, which exports a closed range and then drops it, after
which the log that is left replays on its own and an archive followed by it replays everything."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy.exc import OperationalError
from typer.testing import CliRunner

from latebandit.audit.archive import ARCHIVE_LOCK, ArchiveRefused, archive
from latebandit.audit.log import AuditLog
from latebandit.audit.migrate import alembic_config
from latebandit.audit.partitions import DAY_US, day_name, day_start, ensure_days, partitions
from latebandit.audit.queue import QueueEntry
from latebandit.audit.records import Record
from latebandit.cli import ARCHIVE_LATER, app
from latebandit.config import Settings
from latebandit.replay.apply import Replayer, read_log, records_as_lines
from latebandit.replay.rebuild import replay_audit
from latebandit.timeutil import parse_time
from tests.integration.test_audit import CAMPAIGN, SECOND, T0, create, decision, driver_url, status

HOUR = 3_600 * SECOND
MIDNIGHT = day_start(T0) + DAY_US  # the first UTC midnight after the campaign's creation
LONG_AFTER = MIDNIGHT + 60 * 86_400 * SECOND  # every window of CAMPAIGN closed
SETTINGS = Settings(_env_file=None)


def converted(number: int, received_at: int) -> Record:
    return {"type": "conversion", "campaign": CAMPAIGN.id, "event_id": f"e{number}", "decision_id": f"d{number}",
            "arm": "b", "decided_at": T0 + number * 2 * HOUR, "occurred_at": received_at - SECOND,
            "received_at": received_at, "value": 1.0, "outcome": "counted"}  # fmt: skip


def two_days() -> list[Record]:
    """A decision every two hours for two days, every other one converted three hours later, and a pause
    and resume on the second day, in the order the store would have queued them."""
    records = [create()]
    for number in range(24):
        records.append(decision(number, T0 + number * 2 * HOUR))
        if number % 2 == 0:
            records.append(converted(number, T0 + number * 2 * HOUR + 3 * HOUR))
    records += [status("pause", MIDNIGHT + 5 * HOUR), status("resume", MIDNIGHT + 5 * HOUR + 1800 * SECOND)]
    return sorted(records, key=logged_at)


def logged_at(record: Record) -> int:
    return record["received_at"] if "received_at" in record else record["at"]


def queued(records: list[Record], first: int = 0) -> list[QueueEntry]:
    return [QueueEntry(record["campaign"], f"{logged_at(record) // 1000}-{first + n}", [record]) for n, record in
            enumerate(records)]  # fmt: skip


@pytest.fixture
def log(database_url: str) -> Iterator[AuditLog]:
    audit = AuditLog(driver_url(database_url))
    audit.create_schema()
    if audit.engine.dialect.name == "postgresql":
        ensure_days(audit.engine, T0, ahead=2)  # the campaign's days, as the writer would have made them
    yield audit
    audit.dispose()


def lines_of(log: AuditLog) -> list[dict[str, Any]]:
    return list(records_as_lines(log.records(None, None, None)))


def replayed(lines: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> tuple[Replayer, dict[str, Any]]:
    replayer = Replayer(None, SETTINGS)
    asyncio.run(replayer.apply_all(lines))
    return replayer, asyncio.run(replayer.state(CAMPAIGN.id, LONG_AFTER))


def test_archive_exports_the_range_then_drops_it_and_the_pieces_replay_to_the_whole(
    log: AuditLog, tmp_path: Path
) -> None:
    log.write(queued(two_days()))
    whole = lines_of(log)
    _, state_of_whole = replayed(whole)
    out = tmp_path / "until-day-2.jsonl.gz"

    done = archive(log, SETTINGS, MIDNIGHT, out, LONG_AFTER)

    archived = list(read_log(str(out)))
    before = [line for line in whole if moment(line) < MIDNIGHT]
    assert archived == before
    assert done.lines == len(archived)
    assert done.removed == {"audit_decisions": 8, "audit_feedback": 4}  # T0 is 08:00: 16 hours, decisions 0-7
    left = lines_of(log)
    assert left == [line for line in whole if line["type"] == "campaign" or moment(line) >= MIDNIGHT]
    campaign_lines = [line for line in whole if line["type"] == "campaign"]
    # The pieces in order replay to the whole; the rest alone still replays, without the archived pulls.
    replayer, state = replayed(itertools.chain(archived, left))
    assert state == state_of_whole
    assert replayer.skipped["repeated_campaign_line"] == len([line for line in before if line in campaign_lines])
    _, state_of_rest = replayed(left)
    assert pulls(state_of_rest) == pulls(state_of_whole) - 8
    rebuilt = asyncio.run(replay_audit(log, SETTINGS, CAMPAIGN.id, archives=[str(out)]))
    assert asyncio.run(rebuilt.state(CAMPAIGN.id, LONG_AFTER)) == state_of_whole
    if log.engine.dialect.name == "postgresql":
        with log.engine.connect() as connection:
            days = {partition.name for partition in partitions(connection, "audit_decisions")}
        assert day_name("audit_decisions", day_start(T0)) not in days
        assert day_name("audit_decisions", MIDNIGHT) in days


def pulls(state: dict[str, Any]) -> int:
    return sum(arm["pulls"] for arm in state["arms"].values())


def moment(line: dict[str, Any]) -> int:
    """When the service recorded a line (a creation line is the campaign's first)."""
    return parse_time(line.get("received_at") or line.get("at") or line["created_at"])


def test_archive_refuses_a_range_a_campaign_can_still_learn_from(log: AuditLog, tmp_path: Path) -> None:
    log.write(queued(two_days()))
    whole = lines_of(log)
    out = tmp_path / "early.jsonl.gz"
    with pytest.raises(ArchiveRefused, match="summer-sale"):
        archive(log, SETTINGS, MIDNIGHT, out, MIDNIGHT + CAMPAIGN.window * SECOND)  # inside its window
    assert not out.exists()
    assert lines_of(log) == whole


def test_archive_refuses_what_is_not_a_day_boundary_or_an_existing_file(log: AuditLog, tmp_path: Path) -> None:
    log.write(queued(two_days()))
    whole = lines_of(log)
    taken = tmp_path / "taken.jsonl.gz"
    taken.write_bytes(b"an earlier archive")
    with pytest.raises(ArchiveRefused, match="never overwritten"):
        archive(log, SETTINGS, MIDNIGHT, taken, LONG_AFTER)
    assert taken.read_bytes() == b"an earlier archive"
    with pytest.raises(ArchiveRefused, match="not a directory"):
        archive(log, SETTINGS, MIDNIGHT, tmp_path / "nowhere" / "a.jsonl.gz", LONG_AFTER)
    if log.engine.dialect.name == "postgresql":
        with pytest.raises(ArchiveRefused, match="not a UTC midnight"):
            archive(log, SETTINGS, MIDNIGHT - HOUR, tmp_path / "noon.jsonl.gz", LONG_AFTER)
    else:  # no lock tells another archive from a cut-off one: the part is left to the operator
        writing = tmp_path / "busy.jsonl.gz.partial"
        writing.write_bytes(b"another archive's part")
        with pytest.raises(ArchiveRefused, match="another archive is writing it"):
            archive(log, SETTINGS, MIDNIGHT, tmp_path / "busy.jsonl.gz", LONG_AFTER)
        assert writing.read_bytes() == b"another archive's part"
    assert lines_of(log) == whole


class LogGainingARow(AuditLog):
    """The audit log as a spooled fallback decision of the archived range reaches it mid-export."""

    def records(self, campaign: str | None, since_us: int | None, until_us: int | None) -> Iterator[Record]:
        yield from super().records(campaign, since_us, until_us)
        late = decision(99, T0 + HOUR) | {"fallback": True, "seq": None}
        self.write([QueueEntry(CAMPAIGN.id, f"{(T0 + HOUR) // 1000}-999", [late])])


def test_archive_drops_nothing_when_rows_reached_the_range_during_its_export(database_url: str, tmp_path: Path) -> None:
    audit = LogGainingARow(driver_url(database_url))
    try:
        audit.create_schema()
        audit.write(queued(two_days()))
        out = tmp_path / "racing.jsonl.gz"
        with pytest.raises(ArchiveRefused, match="nothing was dropped"):
            archive(audit, SETTINGS, MIDNIGHT, out, LONG_AFTER)
        assert not out.exists()
        decisions = [line for line in lines_of(audit) if line["type"] == "decision"]
        assert len(decisions) == 25  # the 24 and the late one, all still there
    finally:
        audit.dispose()


def test_export_until_and_since_split_the_log_in_two(
    database_url: str, monkeypatch: pytest.MonkeyPatch, log: AuditLog
) -> None:
    log.write(queued(two_days()))
    monkeypatch.setenv("LATEBANDIT_DATABASE_URL", database_url)
    runner = CliRunner()
    cut = "2027-01-16T00:00:00Z"
    whole = runner.invoke(app, ["export"])
    before = runner.invoke(app, ["export", "--until", cut])
    after = runner.invoke(app, ["export", "--since", cut])
    assert whole.exit_code == before.exit_code == after.exit_code == 0, whole.output + before.output
    assert sorted(before.stdout.splitlines() + after.stdout.splitlines()) == sorted(whole.stdout.splitlines())
    assert before.stdout and after.stdout
    refused = runner.invoke(app, ["export", "--until", "yesterday"])
    assert refused.exit_code == 2 and "--until" in refused.output


def rows_in(audit: AuditLog, table: str) -> int:
    with audit.engine.connect() as connection:
        return connection.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one()


@pytest.mark.postgres
def test_migration_to_partitions_keeps_every_row_and_back(postgres_url: str) -> None:
    url = driver_url(postgres_url)
    command.upgrade(alembic_config(url), "head")
    audit = AuditLog(url)
    try:
        audit.write(queued(two_days()))
        before = lines_of(audit)
        # back to unpartitioned tables and up again (the code reads and writes the head schema alone)
        command.downgrade(alembic_config(url), "0003")
        command.upgrade(alembic_config(url), "head")
        assert lines_of(audit) == before
        # The migration makes days up to a few after today; rows of later days wait in DEFAULT until the
        # writer makes their day.
        ensure_days(audit.engine, T0, ahead=1)
        assert rows_in(audit, day_name("audit_decisions", day_start(T0))) == 8  # 08:00 to midnight
        assert rows_in(audit, day_name("audit_decisions", MIDNIGHT)) == 12
        audit.write(queued(two_days()))  # written again: the new key still makes a repeat insert nothing
        assert lines_of(audit) == before
    finally:
        audit.dispose()


@pytest.mark.postgres
def test_a_new_day_takes_over_the_rows_the_default_partition_held_for_it(postgres_url: str) -> None:
    audit = AuditLog(driver_url(postgres_url))
    try:
        audit.create_schema()
        far = T0 + 400 * DAY_US  # no partition holds that day yet
        audit.write(queued([create(), decision(1, far)]))
        assert ensure_days(audit.engine, far, ahead=0) == [
            day_name(table, day_start(far) + offset)
            for table in ("audit_decisions", "audit_feedback")
            for offset in (-DAY_US, 0)
        ]
        assert ensure_days(audit.engine, far, ahead=0) == []  # already there
        with audit.engine.connect() as connection:
            placed = connection.exec_driver_sql("SELECT tableoid::regclass::text FROM audit_decisions").scalar_one()
        assert placed == day_name("audit_decisions", day_start(far))
    finally:
        audit.dispose()


def test_an_archive_and_the_log_replay_each_campaign_on_its_own_clock(log: AuditLog, tmp_path: Path) -> None:
    """A repeat conversion after the cut, of a decision before it, stays a repeat although another campaign
    (earlier in the log's order, later in time) comes between the archive and the rest of its campaign."""
    other = CAMPAIGN.model_copy(update={"id": "another", "created_at": MIDNIGHT + 20 * DAY_US})
    later = other.created_at + HOUR
    repeat = converted(0, MIDNIGHT + HOUR) | {"event_id": "e0-again"}
    traffic = [*two_days(), repeat, create(other, other.created_at),
               decision(1, later) | {"campaign": other.id, "decision_id": "other-1"}]  # fmt: skip
    log.write(queued(sorted(traffic, key=logged_at)))
    whole = lines_of(log)
    _, state_of_whole = replayed(whole)
    out = tmp_path / "first-day.jsonl.gz"
    archive(log, SETTINGS, MIDNIGHT, out, LONG_AFTER)
    _, state = replayed(itertools.chain(read_log(str(out)), lines_of(log)))
    assert state == state_of_whole
    assert state["arms"]["b"]["conversions"] == 12  # the 12 first conversions; the repeat is not one


@pytest.mark.postgres
def test_one_archive_at_a_time_and_never_over_another_file(postgres_url: str, tmp_path: Path) -> None:
    audit = AuditLog(driver_url(postgres_url))
    try:
        audit.create_schema()
        audit.write(queued(two_days()))
        whole = lines_of(audit)
        with audit.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as other:
            other.exec_driver_sql(f"SELECT pg_advisory_lock({ARCHIVE_LOCK})")  # an archive running elsewhere
            with pytest.raises(ArchiveRefused, match="another archive") as refused:
                archive(audit, SETTINGS, MIDNIGHT, tmp_path / "second.jsonl.gz", LONG_AFTER)
            assert refused.value.later
            other.exec_driver_sql(f"SELECT pg_advisory_unlock({ARCHIVE_LOCK})")
        assert lines_of(audit) == whole
        out = tmp_path / "after-a-cut.jsonl.gz"
        out.with_name(out.name + ".partial").write_bytes(b"the part a killed archive left")
        done = archive(audit, SETTINGS, MIDNIGHT, out, LONG_AFTER)  # alone: the part is stale, made anew
        assert len(list(read_log(str(out)))) == done.lines == 13
    finally:
        audit.dispose()


@pytest.mark.postgres
def test_a_drop_that_cannot_lock_in_time_drops_nothing_and_keeps_no_file(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("latebandit.audit.log.REMOVAL_LOCK_TIMEOUT", "200ms")
    audit = AuditLog(driver_url(postgres_url))
    try:
        audit.create_schema()
        audit.write(queued(two_days()))
        whole = lines_of(audit)
        out = tmp_path / "blocked.jsonl.gz"
        with audit.engine.connect() as writer:  # the lock of a write in progress, not committed
            writer.exec_driver_sql("LOCK TABLE audit_feedback IN ROW EXCLUSIVE MODE")
            with pytest.raises(ArchiveRefused, match=r"lock timeout.*nothing was dropped") as refused:
                archive(audit, SETTINGS, MIDNIGHT, out, LONG_AFTER)
            assert refused.value.later
            writer.rollback()
        assert not out.exists() and not out.with_name(out.name + ".partial").exists()
        assert lines_of(audit) == whole
    finally:
        audit.dispose()


def test_a_log_is_read_by_its_bytes_and_a_cut_archive_says_so(log: AuditLog, tmp_path: Path) -> None:
    log.write(queued(two_days()))
    out = tmp_path / "named-plainly.jsonl"  # gzip all the same: told by its first bytes
    archive(log, SETTINGS, MIDNIGHT, out, LONG_AFTER)
    assert len(list(read_log(str(out)))) == 13  # the creation, 8 decisions, 4 conversions
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(out.read_bytes()[:-20])
    with pytest.raises(ValueError, match="cut short"):
        list(read_log(str(cut)))


def test_archive_exit_status_tells_later_from_wrong(
    database_url: str, monkeypatch: pytest.MonkeyPatch, log: AuditLog, tmp_path: Path
) -> None:
    log.write(queued(two_days()))
    monkeypatch.setenv("LATEBANDIT_DATABASE_URL", database_url)
    runner = CliRunner()
    out = str(tmp_path / "a.jsonl.gz")
    still_open = runner.invoke(app, ["archive", "--until", "2099-01-01T00:00:00Z", "--out", out])
    assert still_open.exit_code == ARCHIVE_LATER and "can still learn" in still_open.output
    if log.engine.dialect.name == "postgresql":
        noon = runner.invoke(app, ["archive", "--until", "2027-01-16T12:00:00Z", "--out", out])
        assert noon.exit_code == 2 and "not a UTC midnight" in noon.output


@pytest.mark.postgres
def test_making_a_day_behind_a_long_reader_gives_up_instead_of_queueing_the_writer(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("latebandit.audit.partitions.ENSURE_LOCK_TIMEOUT", "200ms")
    audit = AuditLog(driver_url(postgres_url))
    try:
        audit.create_schema()
        far = T0 + 400 * DAY_US  # a day no partition holds yet
        with audit.engine.connect() as reader:  # an export's snapshot, which holds DEFAULT's lock throughout
            reader.exec_driver_sql("SELECT count(*) FROM audit_decisions").scalar_one()
            with pytest.raises(OperationalError, match="lock timeout"):
                ensure_days(audit.engine, far, ahead=0)
            reader.rollback()
        assert ensure_days(audit.engine, far, ahead=0)  # made once the reader is done
    finally:
        audit.dispose()


class LogLosingTheCommitReply(AuditLog):
    """The drop's reply lost in flight: after the commit (``dropped``), or before it."""

    dropped = True

    def remove_before(self, until_us: int, expected: dict[str, int]) -> None:
        if self.dropped:
            super().remove_before(until_us, expected)
        raise OperationalError("COMMIT", {}, ConnectionError("server closed the connection unexpectedly"))


@pytest.mark.parametrize("dropped", [True, False])
def test_a_drop_whose_outcome_is_unknown_keeps_the_archive_if_the_rows_went(
    database_url: str, tmp_path: Path, dropped: bool
) -> None:
    audit = LogLosingTheCommitReply(driver_url(database_url))
    audit.dropped = dropped
    try:
        audit.create_schema()
        if audit.engine.dialect.name == "postgresql":
            ensure_days(audit.engine, T0, ahead=2)
        audit.write(queued(two_days()))
        whole = lines_of(audit)
        out = tmp_path / "in-flight.jsonl.gz"
        with pytest.raises(ArchiveRefused, match="is kept" if dropped else "nothing was dropped"):
            archive(audit, SETTINGS, MIDNIGHT, out, LONG_AFTER)
        if dropped:  # the archive is the only copy of what the log lost
            assert list(read_log(str(out))) == [line for line in whole if moment(line) < MIDNIGHT]
            assert lines_of(audit) == [line for line in whole if line["type"] == "campaign" or moment(line) >= MIDNIGHT]
        else:
            assert not out.exists() and lines_of(audit) == whole
    finally:
        audit.dispose()


def test_an_archive_given_twice_counts_once_and_says_so(log: AuditLog, tmp_path: Path) -> None:
    log.write(queued(two_days()))
    _, state_of_whole = replayed(lines_of(log))
    out = tmp_path / "once.jsonl.gz"
    archive(log, SETTINGS, MIDNIGHT, out, LONG_AFTER)
    replayer = asyncio.run(replay_audit(log, SETTINGS, archives=[str(out), str(out)]))
    assert asyncio.run(replayer.state(CAMPAIGN.id, LONG_AFTER)) == state_of_whole
    assert replayer.skipped["repeated_decision"] == 8


@pytest.mark.postgres
def test_the_writer_does_not_make_again_a_day_an_archive_dropped(postgres_url: str, tmp_path: Path) -> None:
    audit = AuditLog(driver_url(postgres_url))
    try:
        audit.create_schema()
        ensure_days(audit.engine, T0, ahead=2)
        audit.write(queued(two_days()))
        archive(audit, SETTINGS, MIDNIGHT, tmp_path / "first-day.jsonl.gz", LONG_AFTER)
        made = ensure_days(audit.engine, MIDNIGHT, ahead=2)  # T0's day is the day before: archived
        assert made == [day_name(table, MIDNIGHT + 2 * DAY_US) for table in ("audit_decisions", "audit_feedback")]
        with audit.engine.connect() as connection:
            days = {partition.name for partition in partitions(connection, "audit_decisions")}
        assert day_name("audit_decisions", day_start(T0)) not in days
    finally:
        audit.dispose()
