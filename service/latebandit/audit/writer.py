"""Drains the audit queue into the audit log: read a batch of a campaign's entries, write them in one
transaction, then acknowledge them. An entry leaves the queue only after its rows are committed, and a
repeated write inserts nothing, so a crash or a database outage loses nothing and duplicates nothing.

A database (or queue) error is logged and counted, never raised by ``drain_once`` or ``run``: decisions
keep flowing while PostgreSQL is down and the backlog drains when it is back. ``flush`` does raise,
because the embedded mode must answer 503 when it cannot make an event durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from latebandit import metrics
from latebandit.audit import partitions
from latebandit.audit.log import AuditLog
from latebandit.audit.queue import AuditQueue
from latebandit.store.base import StoreUnavailable
from latebandit.timeutil import MICROS, wall_clock

logger = logging.getLogger("latebandit.audit")
PARTITIONS_EVERY = 3_600 * MICROS  # microseconds between checks that the coming days have partitions
PARTITIONS_RETRY = 60 * MICROS  # after a failed check: days ahead exist, so there is time, and no log flood


class AuditWriter:
    def __init__(self, queue: AuditQueue, log: AuditLog, batch: int) -> None:
        self.queue = queue
        self.log = log
        self.batch = batch
        self.rows_written = 0
        self.errors = 0
        self.last_success_us: int | None = None  # end of the last pass that met no error
        self._started_us = wall_clock()
        self._failing = False  # the last pass met an error: log only when this changes
        self._lock = asyncio.Lock()  # one pass at a time: run() and flush() never write the same entries

    def lag(self) -> float:
        """Seconds since the last pass that met no error (since start before the first one)."""
        last = self.last_success_us if self.last_success_us is not None else self._started_us
        return max(0.0, (wall_clock() - last) / MICROS)

    async def drain_once(self) -> int:
        """One pass over every campaign's queue (up to ``batch`` entries each); returns rows written."""
        before = self.rows_written
        await self._pass(claim=False)
        return self.rows_written - before

    async def flush(self) -> None:
        """Drain until no queue holds a full batch; raise StoreUnavailable if a write or read fails."""
        while True:
            more, failure = await self._pass(claim=False)
            if failure is not None:
                raise StoreUnavailable(f"the audit log cannot be written: {failure}") from failure
            if not more:
                return

    async def run(self, interval: float, stop: asyncio.Event) -> None:
        """Drain every ``interval`` seconds until ``stop`` is set; straight away again while a queue
        still held a full batch. Creates the coming days' partitions at start and every hour."""
        partitions_due = 0
        while not stop.is_set():
            if wall_clock() >= partitions_due:
                ready = await self._create_partitions()
                partitions_due = wall_clock() + (PARTITIONS_EVERY if ready else PARTITIONS_RETRY)
            more, failure = await self._pass(claim=True, lease=max(1.0, 5 * interval))
            if more and failure is None:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)

    async def _create_partitions(self) -> bool:
        """The day partitions of yesterday to a few days ahead (audit/partitions.py); False if they could not
        be made now (database away, a lock not had in time: the DEFAULT partition takes rows meanwhile)."""
        try:
            created = await asyncio.to_thread(partitions.ensure_days, self.log.engine, wall_clock())
        except Exception as error:
            logger.warning("audit partitions not created yet: %s", error)
            return False
        if created:
            logger.info("audit partitions created: %s", ", ".join(created))
        return True

    async def _pass(self, claim: bool, lease: float = 0.0) -> tuple[bool, Exception | None]:
        """Drain each campaign once (with ``claim``, only those whose lease this process holds). Returns
        whether some queue held a full batch (more may be waiting) and the pass's first error."""
        async with self._lock:
            failures: list[Exception] = []
            more = False
            try:
                campaigns = await self.queue.audit_campaigns()
            except Exception as error:
                campaigns = []
                failures.append(error)
            for campaign in campaigns:
                try:
                    if not claim or await self.queue.claim_audit(campaign, lease):
                        more |= await self._drain(campaign)
                except Exception as error:  # the next pass retries; one campaign never blocks the others
                    failures.append(error)
            self.errors += len(failures)
            metrics.AUDIT_ERRORS.inc(len(failures))
            failure = failures[0] if failures else None
            self._settle(failure)
            return more, failure

    async def _drain(self, campaign: str) -> bool:
        entries = await self.queue.read_audit(campaign, self.batch)
        if entries:
            with metrics.AUDIT_WRITE_LATENCY.time():
                written = await asyncio.to_thread(self.log.write, entries)
            self.rows_written += written
            metrics.AUDIT_ROWS.inc(written)
            await self.queue.ack_audit(campaign, [entry.entry_id for entry in entries])
        return len(entries) >= self.batch

    def _settle(self, failure: Exception | None) -> None:
        """Record the pass's outcome; log only when the writer starts or stops failing (not every pass)."""
        if failure is None:
            if self._failing:
                logger.info("audit log writes recovered")
            self.last_success_us = wall_clock()
        elif not self._failing:
            logger.warning("audit log writes failing; entries stay queued: %s", failure, exc_info=failure)
        self._failing = failure is not None
