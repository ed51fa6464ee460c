"""Wiring: builds the store, audit log, writer, signer and engine from the settings.

Shared by the API process and the CLI commands that act on a running deployment's data (rebuild, export).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from sqlalchemy.exc import SQLAlchemyError

from latebandit import metrics
from latebandit.audit.log import AuditLog
from latebandit.audit.spool import Spool
from latebandit.audit.writer import AuditWriter
from latebandit.campaign import Campaign
from latebandit.config import Settings, revealed
from latebandit.engine.core import DecisionEngine, EngineOptions
from latebandit.replay.rebuild import restore_memory
from latebandit.store.base import StateStore, StoreUnavailable
from latebandit.store.memory import MemoryStore
from latebandit.store.redis import RedisStore
from latebandit.timeutil import Clock, wall_clock
from latebandit.tokens import TokenSigner

log = logging.getLogger("latebandit")

DIAGNOSTICS_EVERY = 5.0  # seconds between publications of the per-arm gauges (engine.publish_diagnostics)
HISTORY_RETRY = 2.0  # seconds the audit log is taken as unreachable after a failed campaign lookup
SPOOL_EVERY = 1.0  # seconds between hand-overs of spooled fallback decisions to the audit log
BACKLOG_EVERY = 1.0  # seconds between refreshes of the audit backlog and lag gauges (one XLEN per campaign)
SWEEP_EVERY = 60.0  # seconds between sweeps of the archived campaigns whose state may go (store.purge_archived)


def load_secret(settings: Settings) -> str:
    """LATEBANDIT_SECRET, or one generated once and kept beside the SQLite file, so decision ids stay
    valid across restarts and across the workers of one machine (created with O_EXCL: no race)."""
    if settings.secret:
        return settings.secret.get_secret_value()
    path = Path(settings.secret_file())
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):
            text = path.read_text().strip()
            if text:
                return text
            time.sleep(0.01)  # another worker is writing it
        raise RuntimeError(f"secret file {path} is empty") from None
    generated = secrets.token_urlsafe(32)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(generated)
    return generated


def redis_store(settings: Settings, clock: Clock = wall_clock) -> RedisStore:
    """The Redis state store of LATEBANDIT_REDIS_URL (ValueError when it is not set)."""
    url = revealed(settings.redis_url)
    if not url:
        raise ValueError("LATEBANDIT_REDIS_URL is not set")
    return RedisStore(url, settings.redis_prefix, cluster=settings.redis_cluster, clock=clock)


class SchemaBehind(RuntimeError):
    pass


class CampaignHistory:
    """Campaign configurations from the audit log, for the lookups of campaigns the store does not know.
    After a failure the log is answered unreachable for HISTORY_RETRY seconds without trying, so that a
    burst of lookups (made-up ids while PostgreSQL is away) waits for one connect timeout, not one each."""

    def __init__(self, audit: AuditLog) -> None:
        self.audit = audit
        self._down_until = 0.0  # time.monotonic()

    async def __call__(self, campaign_id: str) -> Campaign | None:
        if time.monotonic() < self._down_until:
            raise StoreUnavailable("the audit log is unreachable, so the id cannot be checked (retried shortly)")
        try:
            config = await asyncio.to_thread(self.audit.created, campaign_id)
        except SQLAlchemyError as error:  # creating a campaign must not forget an existing one's history
            self._down_until = time.monotonic() + HISTORY_RETRY
            raise StoreUnavailable(f"the audit log is unreachable, so the id cannot be checked: {error}") from error
        return None if config is None else Campaign.model_validate(config)


@dataclass
class Runtime:
    settings: Settings
    store: StateStore
    audit: AuditLog
    writer: AuditWriter
    engine: DecisionEngine
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    def build(cls, settings: Settings, clock: Clock = wall_clock) -> Runtime:
        """``clock`` (µs) stamps decisions and feedback: the wall clock, or a test's own, so that a test of
        time-dependent behaviour moves time instead of sleeping."""
        audit = AuditLog(settings.sqlalchemy_url)
        store: StateStore = MemoryStore(clock) if settings.embedded else redis_store(settings, clock)
        writer = AuditWriter(store, audit, settings.audit_batch)
        options = EngineOptions(
            max_skew=settings.max_skew,
            request_ttl=settings.request_ttl,
            dedup_retention=settings.dedup_retention,
            snapshot_interval=settings.snapshot_interval,
        )
        # In the embedded mode the queue lives in process memory: flush it before answering.
        durable = writer.flush if settings.embedded else None

        signer = TokenSigner(load_secret(settings), settings.previous_secret_list())
        spool = None if settings.embedded else Spool(settings.spool_path(), settings.spool_limit)
        engine = DecisionEngine(
            store, signer, clock, np.random.default_rng(), options, durable, CampaignHistory(audit), spool
        )
        return cls(settings, store, audit, writer, engine)

    async def start(self) -> None:
        await asyncio.to_thread(self._prepare_schema)
        if isinstance(self.store, MemoryStore):
            await self._restore_embedded_state()
        if self.settings.drains_inline:
            self.tasks.append(asyncio.create_task(self.writer.run(self.settings.audit_interval, self.stop)))
        self.tasks.append(asyncio.create_task(watch_audit(self.store, self.audit, self._inline_writer(), self.stop)))
        self.tasks.append(asyncio.create_task(self._publish_diagnostics()))
        self.tasks.append(asyncio.create_task(sweep_archived(self.store, self.engine.clock, self.stop)))
        if self.engine.spool is not None:
            self.tasks.append(asyncio.create_task(hand_over_spool(self.engine.spool, self.audit, self.stop)))
        settle_heap()

    def _prepare_schema(self) -> None:
        if self.settings.sqlalchemy_url.startswith("sqlite"):
            self.audit.create_schema()
            return
        try:
            status = self.audit.schema_status()
        except Exception as error:  # the database may be down: decisions must still flow
            log.warning("audit database unreachable at start (%s); the audit queue will wait for it", error)
            return
        if not status.up_to_date:
            raise SchemaBehind(
                f"the audit database schema is at {status.current!r}, the service needs {status.head!r}: "
                "run `latebandit migrate` first"
            )

    async def _restore_embedded_state(self) -> None:
        """The embedded store lives in memory: rebuild it from the SQLite audit log at start."""
        assert isinstance(self.store, MemoryStore)
        await restore_memory(self.audit, self.store, self.settings)

    def _inline_writer(self) -> AuditWriter | None:
        """This worker's writer when it drains the queue (else the audit writer's process exports the lag)."""
        return self.writer if self.settings.drains_inline else None

    async def _publish_diagnostics(self) -> None:
        """Every DIAGNOSTICS_EVERY seconds, the per-arm gauges of what this worker read since (a scrape also
        publishes them first): with several workers, each keeps its own campaigns' gauges current."""
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=DIAGNOSTICS_EVERY)
            await asyncio.to_thread(self.engine.publish_diagnostics)

    async def close(self) -> None:
        self.stop.set()
        await self.engine.planner.close()
        for task in self.tasks:
            with contextlib.suppress(Exception):
                await task
        with contextlib.suppress(Exception):
            await self.writer.flush()
        if self.engine.spool is not None:
            self.engine.spool.close()
        if isinstance(self.store, RedisStore):
            await self.store.close()
        self.audit.dispose()


def settle_heap() -> None:
    """Move everything alive after start-up (modules, schemas, the restored state) out of the garbage
    collector's sight (gc.freeze): otherwise the full-heap collections walk it all, stopping the event loop
    for tens of milliseconds every few seconds under load, which would be the whole of /choose's p99. Objects
    made since are collected as usual, and a frozen object still dies by reference counting."""
    gc.collect()
    gc.freeze()


async def watch_audit(store: StateStore, audit: AuditLog, writer: AuditWriter | None, stop: asyncio.Event) -> None:
    """Every BACKLOG_EVERY seconds: the audit backlog, whether the store and the audit database answer, and
    the lag of ``writer`` when this process drains the queue (an API worker inline, or the audit writer)."""
    while not stop.is_set():
        if writer is not None:
            metrics.AUDIT_LAG.set(writer.lag())
        try:
            await store.ping()
            metrics.AUDIT_BACKLOG.set(await store.audit_backlog())
            metrics.STORE_UP.set(1)
        except StoreUnavailable:
            metrics.STORE_UP.set(0)
        try:
            await asyncio.to_thread(audit.ping)
            metrics.AUDIT_UP.set(1)
        except Exception:  # any database error means "down"; the writer logs the cause
            metrics.AUDIT_UP.set(0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=BACKLOG_EVERY)


async def sweep_archived(store: StateStore, clock: Clock, stop: asyncio.Event) -> None:
    """Every SWEEP_EVERY seconds, purge the state of the archived campaigns past their feedback_until whose
    audit queue is drained. A sweep, not key expiry: the audit queue must outlive the window until the audit
    log has it, request-id keys are written with their own expiry, and a purge needs no clock in Redis. Every
    worker sweeps (a purge is idempotent), so none has to be told it is the one."""
    while not stop.is_set():
        try:
            purged = await store.purge_archived(clock())
        except StoreUnavailable as error:
            log.warning("archived campaigns wait for the next sweep: %s", error)
        else:
            for campaign in purged:
                log.info("archived campaign's state purged", extra={"campaign": campaign})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=SWEEP_EVERY)


async def hand_over_spool(spool: Spool, audit: AuditLog, stop: asyncio.Event) -> None:
    """Every SPOOL_EVERY seconds, and once more at shutdown: hand this worker's spooled fallback decisions,
    and those a dead worker left, to the audit log. While the database is away they wait on disk."""
    while True:
        try:
            await spool.hand_over(audit)
        except Exception as error:  # the database is down or refused: the files stay, retried next time
            log.warning("spooled fallback decisions wait for the audit log: %s", error)
        if stop.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=SPOOL_EVERY)


async def run_audit_writer(settings: Settings, stop: asyncio.Event) -> None:
    """`latebandit audit-writer`: drain every campaign's audit queue into the audit log until ``stop``, then
    once more. Several writers (and inline API workers) may run at once: the per-campaign lease keeps them
    off each other's queues, and a repeated write inserts nothing."""
    if settings.embedded:
        raise ValueError("the audit writer drains the Redis audit queue: set LATEBANDIT_REDIS_URL")
    store = redis_store(settings)
    audit = AuditLog(settings.sqlalchemy_url)
    writer = AuditWriter(store, audit, settings.audit_batch)
    settle_heap()
    try:
        await asyncio.gather(writer.run(settings.audit_interval, stop), watch_audit(store, audit, writer, stop))
        with contextlib.suppress(StoreUnavailable):
            await writer.flush()
    finally:
        await store.close()
        audit.dispose()
