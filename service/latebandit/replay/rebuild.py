"""Rebuild state-store contents from the audit log, the durable truth (``latebandit rebuild``, and the
embedded store at start).

The audit log is replayed through ``Replayer`` (the live rules, on a virtual clock), then each campaign's
counters, histogram and deduplication keys are written to the target store in one step. Deduplication
keys keep the time they had left at the end of the log.
"""

from __future__ import annotations

import asyncio

from latebandit.audit.log import AuditLog
from latebandit.config import Settings
from latebandit.replay.apply import Replayer, records_as_lines
from latebandit.store.memory import MemoryStore
from latebandit.store.redis import RedisStore
from latebandit.timeutil import MICROS, wall_clock


async def replay_audit(
    audit: AuditLog, settings: Settings, campaign: str | None = None, as_of: int | None = None
) -> Replayer:
    """The audit log replayed, in a worker thread: a long log must not stall the event loop."""

    def replay() -> Replayer:
        replayer = Replayer(as_of, settings)
        asyncio.run(
            replayer.apply_all(records_as_lines(audit.records(campaign, None, None if as_of is None else as_of + 1)))
        )
        return replayer

    return await asyncio.to_thread(replay)


async def restore_memory(audit: AuditLog, store: MemoryStore, settings: Settings) -> list[str]:
    replayer = await replay_audit(audit, settings)
    shift = (wall_clock() - replayer.now) // MICROS
    for campaign_id in replayer.campaigns:
        store.import_campaign(replayer.store.export_campaign(campaign_id), shift)
    store.continue_after(await asyncio.to_thread(audit.last_entry))
    return list(replayer.campaigns)


async def rebuild_redis(
    audit: AuditLog, store: RedisStore, settings: Settings, campaign: str | None = None
) -> list[str]:
    replayer = await replay_audit(audit, settings, campaign)
    for campaign_id, config in replayer.campaigns.items():
        memory = replayer.store.export_campaign(campaign_id)
        snapshot = await replayer.store.snapshot(config)
        expiring: dict[str, tuple[str, int]] = {}
        for key, (expires, value) in memory.expiring.items():
            remaining = expires - replayer.now // MICROS
            if remaining > 0:
                text = "|".join(map(str, value)) if isinstance(value, tuple) else "1"
                expiring[key] = (text, remaining)
        await store.replace_state(
            memory.campaign, snapshot.counters, snapshot.histogram, expiring, snapshot.delays, memory.schedule
        )
    return list(replayer.campaigns)
