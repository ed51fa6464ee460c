"""Rebuild state-store contents from the audit log, the durable truth (``latebandit rebuild``, and the
embedded store at start).

The audit log is replayed through ``Replayer`` (the live rules, on a virtual clock), then each campaign's
counters, histogram and deduplication keys are written to the target store in one step. Deduplication
keys keep the time they had left at the end of the log.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from latebandit.audit.log import AuditLog
from latebandit.config import Settings
from latebandit.replay.apply import Replayer, read_log, records_as_lines
from latebandit.store.memory import MemoryStore, Remembered
from latebandit.store.redis import RedisStore
from latebandit.timeutil import MICROS, wall_clock


async def replay_audit(
    audit: AuditLog,
    settings: Settings,
    campaign: str | None = None,
    as_of: int | None = None,
    archives: Sequence[str] = (),
) -> Replayer:
    """The audit log replayed, after the ``archives`` it was cut from (oldest first, ``latebandit
    archive``), in a worker thread: a long log must not stall the event loop."""

    def replay() -> Replayer:
        replayer = Replayer(as_of, settings)
        archived = (line for path in archives for line in read_log(path) if of_campaign(line, campaign))
        kept = records_as_lines(audit.records(campaign, None, None if as_of is None else as_of + 1))
        asyncio.run(replayer.apply_all(itertools.chain(archived, kept)))
        return replayer

    return await asyncio.to_thread(replay)


async def restore_memory(audit: AuditLog, store: MemoryStore, settings: Settings) -> list[str]:
    replayer = await replay_audit(audit, settings)
    shift = (wall_clock() - replayer.latest) // MICROS
    for campaign_id in replayer.campaigns:
        store.import_campaign(replayer.store.export_campaign(campaign_id), shift)
    store.continue_after(await asyncio.to_thread(audit.last_entry))
    return list(replayer.campaigns)


def of_campaign(line: dict[str, Any], campaign: str | None) -> bool:
    return campaign is None or line.get("campaign", line.get("id")) == campaign


@dataclass(frozen=True)
class Rebuilt:
    campaigns: list[str]
    skipped: Counter[str]  # the lines the replay could not apply, by reason (Replayer.skipped)


async def rebuild_redis(
    audit: AuditLog, store: RedisStore, settings: Settings, campaign: str | None = None, archives: Sequence[str] = ()
) -> Rebuilt:
    replayer = await replay_audit(audit, settings, campaign, archives=archives)
    for campaign_id, config in replayer.campaigns.items():
        memory = replayer.store.export_campaign(campaign_id)
        snapshot = await replayer.store.snapshot(config)
        expiring: dict[str, tuple[str | bytes, int]] = {}
        for key, (expires, value) in memory.expiring.items():
            remaining = expires - replayer.latest // MICROS
            if remaining > 0:
                expiring[key] = (_stored(value), remaining)
        await store.replace_state(
            memory.campaign, snapshot.counters, snapshot.histogram, expiring, snapshot.delays, memory.schedule,
            snapshot.model,
        )  # fmt: skip
    return Rebuilt(list(replayer.campaigns), replayer.skipped)


def _stored(value: Remembered) -> str | bytes:
    """What the Redis store keeps for a remembered value: a request's decision as ``id|arm|propensity`` (and
    ``|action``), a credited reward, "1" for a dedup entry, a contextual decision's features as a float64 blob."""
    if isinstance(value, np.ndarray):
        return value.astype("<f8").tobytes()
    if isinstance(value, tuple):
        return "|".join(str(part) for part in value if part is not None)
    return "1" if value is True else repr(value)
