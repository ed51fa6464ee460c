"""Retention: ``latebandit archive --until DAY --out FILE.jsonl.gz`` exports what the audit log recorded
before a UTC midnight to a compressed event log, then drops it from the log (whole day partitions in
PostgreSQL, audit/partitions.py).

It refuses, changing nothing,
- a range some campaign can still learn from: it closes ``Campaign.settles_us`` after ``until``;
- while another archive of the log runs (PostgreSQL);
- an export that did not complete: the file is written beside its name, flushed to disk and linked to
  its name only when whole, and the rows are dropped only if the log still holds exactly the rows the
  file holds (a spooled fallback decision handed over meanwhile makes it refuse; run it again).

Campaign events are exported too but stay in the log, so the log that is left still replays on its own
(from the state its remaining events describe), and an archive followed by the log replays everything:
the repeated campaign lines change nothing (``Replayer``). ``rebuild --archive`` does that.
"""

from __future__ import annotations

import contextlib
import gzip
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import orjson
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from latebandit.audit.export import record_to_line
from latebandit.audit.log import AuditLog
from latebandit.audit.partitions import PARTITIONED, check_boundary
from latebandit.campaign import Campaign
from latebandit.config import Settings
from latebandit.timeutil import format_time, seconds_to_micros


class ArchiveRefused(Exception):
    """The range cannot be archived; nothing was changed. ``later``: the same command may succeed later (a
    range still open, another archive running, rows that reached the range meanwhile)."""

    def __init__(self, reason: str, later: bool = False) -> None:
        super().__init__(reason)
        self.later = later


ARCHIVE_LOCK = 0x6C62_6172  # PostgreSQL advisory lock id: one archive of a log at a time


@dataclass(frozen=True)
class Archived:
    path: Path
    lines: int
    removed: dict[str, int]  # rows dropped per partitioned table
    size: int  # bytes of the compressed file


def still_open(log: AuditLog, settings: Settings, until_us: int, now_us: int) -> dict[str, int]:
    """The campaigns created before ``until_us`` whose range before it is still open at ``now_us``, each with
    the moment it closes."""
    retention_us, skew_us = seconds_to_micros(settings.dedup_retention), seconds_to_micros(settings.max_skew)
    open_until = {}
    for name in log.campaigns():
        config = log.created(name)
        if config is None:
            continue
        campaign = Campaign.model_validate(config)
        closes = until_us + campaign.settles_us(retention_us, skew_us)
        if campaign.created_at < until_us and closes > now_us:
            open_until[name] = closes
    return open_until


def archive(log: AuditLog, settings: Settings, until_us: int, out: Path, now_us: int) -> Archived:
    try:
        check_boundary(log.engine, until_us)
    except ValueError as error:
        raise ArchiveRefused(str(error)) from error
    if out.exists():
        raise ArchiveRefused(f"{out} exists: an archive is never overwritten")
    if not out.parent.is_dir():
        raise ArchiveRefused(f"{out.parent} is not a directory")
    with one_archive_at_a_time(log) as alone:
        open_until = still_open(log, settings, until_us, now_us)
        if open_until:
            listed = ", ".join(f"{name} (until {format_time(closes)})" for name, closes in sorted(open_until.items()))
            raise ArchiveRefused(
                f"campaigns can still learn from events before {format_time(until_us)}: {listed}", later=True
            )
        if alone:  # no other archive of this log runs: a part left is a cut-off run's
            part_of(out).unlink(missing_ok=True)
        lines, written = write_archive(log, until_us, out)
        counts = {table: written.get(table, 0) for table in PARTITIONED}
        drop(log, until_us, counts, out)
    return Archived(out, lines, counts, out.stat().st_size)


def drop(log: AuditLog, until_us: int, counts: dict[str, int], out: Path) -> None:
    """Drop the archived rows. If nothing was dropped, the archive goes too (a rerun makes it anew); if the
    drop's outcome is unknown (its commit failed in flight), the archive stays, the only copy there may be."""
    try:
        log.remove_before(until_us, counts)
    except ValueError as error:
        out.unlink()
        raise ArchiveRefused(f"{error}; nothing was dropped, run it again", later=True) from error
    except SQLAlchemyError as error:
        reason = getattr(error, "orig", None) or error
        try:
            untouched = log.rows_before(until_us) == counts
        except SQLAlchemyError:
            untouched = False
        if not untouched:
            raise ArchiveRefused(f"{reason}; the rows may have been dropped: {out} is kept, check the log") from error
        out.unlink()
        raise ArchiveRefused(f"{reason}; nothing was dropped, run it again", later=True) from error


@contextlib.contextmanager
def one_archive_at_a_time(log: AuditLog) -> Iterator[bool]:
    """On PostgreSQL, a session advisory lock held from the range check to the drop, so that two archives
    (a cron retry beside a manual run) never interleave; outside a transaction, which the server would end
    after its idle-in-transaction timeout. Yields whether the lock is held. SQLite: no lock; the count
    before the drop is the guard."""
    if log.engine.dialect.name != "postgresql":
        yield False
        return
    with log.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        if not connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": ARCHIVE_LOCK}).scalar_one():
            raise ArchiveRefused("another archive of this audit log is running", later=True)
        try:
            yield True
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": ARCHIVE_LOCK})


def part_of(out: Path) -> Path:
    """Where an archive is written until it is whole."""
    return out.with_name(out.name + ".partial")


def write_archive(log: AuditLog, until_us: int, out: Path) -> tuple[int, dict[str, int]]:
    """Every record logged before ``until_us`` as event-log lines, gzip-compressed, into ``out``: written
    beside it (created exclusively), flushed to disk, then linked to its name, which fails rather than
    replace a file that appeared meanwhile. Returns the lines written and, per partitioned table, the rows
    they came from."""
    partial = part_of(out)
    try:
        raw = partial.open("xb")
    except FileExistsError as error:
        raise ArchiveRefused(f"{partial} exists: another archive is writing it, or one was cut off") from error
    try:
        with raw:
            lines, counts = _compress(log, until_us, raw, out.name)
        try:
            os.link(partial, out)
        except FileExistsError as error:
            raise ArchiveRefused(f"{out} appeared meanwhile: an archive is never overwritten") from error
    finally:
        partial.unlink()
    directory = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the new name on disk before any row goes
    finally:
        os.close(directory)
    return lines, counts


def _compress(log: AuditLog, until_us: int, raw: BinaryIO, name: str) -> tuple[int, dict[str, int]]:
    lines = 0
    counts: dict[str, int] = {}
    with gzip.GzipFile(filename=name, fileobj=raw, mode="wb", compresslevel=6, mtime=0) as packed:
        for record in log.records(None, None, until_us):
            packed.write(orjson.dumps(record_to_line(record)) + b"\n")
            lines += 1
            table = log.table_of(record)
            if table is not None:
                counts[table] = counts.get(table, 0) + 1
    raw.flush()
    os.fsync(raw.fileno())
    return lines, counts
