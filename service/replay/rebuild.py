"""Rebuild state-store contents from the audit log, the durable truth (``latebandit rebuild``, and the
embedded store at start).

The audit log is replayed through ``Replayer`` (the live rules, on a virtual clock), then each campaign's
counters, histogram and deduplication keys are written to the target store in one step. Deduplication
keys keep the time they had left at the end of the log.
"""

from __future__ import annotations

import asyncio

from service.audit.log import AuditLog
from service.replay.apply import Replayer, records_as_lines
from service.store.memory import MemoryStore
from service.store.redis import RedisStore
from service.timeutil import MICROS, wall_clock


async def replay_audit(audit: AuditLog, campaign: str | None = None, as_of: int | None = None) -> Replayer:
    records = await asyncio.to_thread(lambda: list(audit.records(campaign, None, None)))
    replayer = Replayer(as_of)
    await replayer.apply_all(records_as_lines(records))
    return replayer


async def restore_memory(audit: AuditLog, store: MemoryStore) -> list[str]:
    replayer = await replay_audit(audit)
    shift = wall_clock() - replayer.now
    for campaign_id in replayer.campaigns:
        store.import_campaign(replayer.store.export_campaign(campaign_id), shift)
    return list(replayer.campaigns)


async def rebuild_redis(audit: AuditLog, store: RedisStore, campaign: str | None = None) -> list[str]:
    replayer = await replay_audit(audit, campaign)
    for campaign_id, config in replayer.campaigns.items():
        memory = replayer.store.export_campaign(campaign_id)
        snapshot = await replayer.store.snapshot(config)
        expiring: dict[str, tuple[str, int]] = {}
        for key, (expires, value) in memory.expiring.items():
            remaining = round((expires - replayer.now) / MICROS)
            if remaining > 0:
                text = "|".join(map(str, value)) if isinstance(value, tuple) else "1"
                expiring[key] = (text, remaining)
        await store.replace_state(memory.campaign, snapshot.counters, snapshot.histogram, expiring)
    return list(replayer.campaigns)
