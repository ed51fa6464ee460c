"""The fallback spool: decisions answered while Redis is away reach the audit log all the same.

Redis holds the audit queue, so a worker that cannot reach it answers /choose with a flagged fallback
(the default arm) and has nowhere to queue that decision's audit record. It appends the record to its own
append-only file instead, and answers only once the line is on disk: the appends that arrive during one
fsync share the next (a group commit), so the spool costs one fsync per batch, not per decision.

Once PostgreSQL answers, ``hand_over`` inserts the spooled records and deletes the file. Each row's queue
key is derived from its decision (``spooled_entry``), and the audit log inserts ON CONFLICT DO NOTHING: a
hand-over interrupted between the insert and the delete, then repeated, adds nothing. Exactly once.

Every worker holds an exclusive ``flock`` on its own lock file for its whole life; the kernel releases it
when the process dies, kill -9 included. A worker adopts (hands over) the files of every owner whose lock
it can take, so the spool of a killed worker is handed over by its successor.

Bounded: a worker refuses to spool beyond ``limit`` bytes (``SpoolFull``): its /choose then answers 503
rather than a decision the audit log would never see.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import uuid
from pathlib import Path
from typing import IO

import orjson

from latebandit import metrics
from latebandit.audit.log import AuditLog
from latebandit.audit.queue import QueueEntry
from latebandit.audit.records import Record
from latebandit.group_commit import GroupCommit

log = logging.getLogger("latebandit")

# Redis stream ids count up from 0 within a millisecond; spooled entries take sequence numbers from 2^62 up,
# which no stream reaches, so a spooled row never collides with a queued one.
SPOOLED_SEQUENCE = 1 << 62
FSYNC_BATCH = 1_000  # decisions written by one fsync at most


class SpoolFull(RuntimeError):
    """The spool holds its limit: a decision taken now could not be audited."""


def spooled_entry(record: Record) -> QueueEntry:
    """The queue entry of a spooled decision: at the decision's millisecond, with a sequence drawn from its
    id (62 bits of a hash: a clash needs two fallbacks of one campaign in one millisecond with equal
    hashes), so the same record always lands on the same row."""
    digest = hashlib.blake2b(str(record["decision_id"]).encode(), digest_size=8).digest()
    sequence = SPOOLED_SEQUENCE + (int.from_bytes(digest, "big") >> 2)
    return QueueEntry(str(record["campaign"]), f"{int(record['at']) // 1000}-{sequence}", [record])


class Spool:
    """One worker's spool: ``<owner>.lock``, held while the worker lives, and its ``<owner>.<n>.jsonl`` files:
    the one being appended to and those waiting to be handed over."""

    def __init__(self, directory: Path, limit: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.limit = directory, limit
        self.owner = uuid.uuid4().hex
        lock = _take_lock(directory / f"{self.owner}.lock")
        assert lock is not None, "a fresh owner id cannot be locked by anyone else"
        self._lock = lock
        self._files = 0
        self._path, self._file = self._open_next()
        self._held = 0  # bytes spooled and not yet handed over
        self._records = 0  # their records
        self._appended = 0  # records in the file being appended to
        self._writing = asyncio.Lock()  # a rotation waits for the write in flight
        self._commit: GroupCommit[str, bytes, None] = GroupCommit(self._write, FSYNC_BATCH)

    def _open_next(self) -> tuple[Path, IO[bytes]]:
        path = self.directory / f"{self.owner}.{self._files}.jsonl"
        self._files += 1
        return path, open(path, "ab")  # open until rotated or closed

    async def append(self, record: Record) -> None:
        """Returns once ``record`` is on disk; raises SpoolFull when it would pass the limit."""
        line = orjson.dumps(record) + b"\n"
        if self._held + len(line) > self.limit:
            metrics.SPOOL_FULL.inc()
            raise SpoolFull(f"the fallback spool holds its limit of {self.limit} bytes")
        self._held += len(line)  # reserved before the await: concurrent appends cannot overshoot together
        try:
            await self._commit.submit("spool", line)
        except BaseException:
            self._held -= len(line)
            raise
        self._records += 1
        self._appended += 1
        metrics.SPOOL_RECORDS.set(self._records)

    async def _write(self, _: str, lines: list[bytes]) -> list[None]:
        async with self._writing:
            await asyncio.to_thread(_write_and_sync, self._file, b"".join(lines))
        return [None] * len(lines)

    async def hand_over(self, audit: AuditLog) -> int:
        """Move every spool this worker may take (its own, and those of dead workers) into the audit log;
        the records handed over. Raises what the audit log raises (then nothing is deleted: retried later)."""
        if self._appended:
            async with self._writing:  # new appends go to a new file while the full ones are sent
                self._file.close()
                self._path, self._file = self._open_next()
                self._appended = 0
        waiting = sorted(path for path in self.directory.glob(f"{self.owner}.*.jsonl") if path != self._path)
        handed = 0
        if waiting:
            sent = sum(path.stat().st_size for path in waiting)
            handed = await asyncio.to_thread(_send, audit, waiting)
            self._held -= sent
            self._records -= handed
            metrics.SPOOL_RECORDS.set(self._records)
        return handed + await asyncio.to_thread(_adopt, audit, self.directory, self.owner)

    def close(self) -> None:
        """Release the lock; what is still spooled stays, with the lock file, for another worker to adopt."""
        self._file.close()
        if self._path.stat().st_size == 0:
            self._path.unlink()
        if not any(self.directory.glob(f"{self.owner}.*.jsonl")):
            (self.directory / f"{self.owner}.lock").unlink()
        self._lock.close()


def _write_and_sync(handle: IO[bytes], data: bytes) -> None:
    handle.write(data)
    handle.flush()
    os.fsync(handle.fileno())


def _take_lock(path: Path) -> IO[bytes] | None:
    """The exclusive lock at ``path`` (held as long as the returned file is open), or None if it is held."""
    handle = open(path, "ab")  # noqa: SIM115 (the lock lives as long as this file is open)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _adopt(audit: AuditLog, directory: Path, me: str) -> int:
    """Hand over the files of every other owner whose lock is free: that worker has died."""
    handed = 0
    for lock_path in directory.glob("*.lock"):
        owner = lock_path.stem
        if owner == me:
            continue
        lock = _take_lock(lock_path)
        if lock is None:
            continue  # alive: it hands over its own spool
        try:
            handed += _send(audit, sorted(directory.glob(f"{owner}.*.jsonl")))
            lock_path.unlink()
        finally:
            lock.close()
    return handed


def _send(audit: AuditLog, paths: list[Path]) -> int:
    """Insert the records of ``paths`` (idempotently), then delete the files. A line without its newline
    was cut by a crash before its fsync returned: its decision was never answered, so it is skipped."""
    entries = [
        spooled_entry(orjson.loads(line))
        for path in paths
        for line in path.read_bytes().split(b"\n")[:-1]  # the last piece is empty or a torn line
    ]
    if entries:
        audit.write(entries)
        log.info("handed %d spooled fallback decisions to the audit log", len(entries))
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return len(entries)
