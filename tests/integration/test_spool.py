"""The fallback spool against a real audit database (PostgreSQL and SQLite): what is spooled reaches the
audit log exactly once, survives the database being away, is adopted from a dead worker, and is bounded."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import signal
from pathlib import Path

import orjson
import pytest
from sqlalchemy import select

from latebandit.audit.log import AuditLog
from latebandit.audit.models import Decision
from latebandit.audit.records import Record
from latebandit.audit.spool import SPOOLED_SEQUENCE, Spool, SpoolFull, spooled_entry
from tests.integration.test_audit import CAMPAIGN, T0, driver_url, log, unreachable  # noqa: F401 (fixture)


def fallback(n: int) -> Record:
    return {"type": "decision", "campaign": CAMPAIGN.id, "decision_id": f"fb{n}", "arm": "a", "at": T0 + n * 1000,
            "propensity": 1.0, "policy": "delayed-klucb", "version": 1, "fallback": True, "request_id": None,
            "seq": None}  # fmt: skip


def logged(audit: AuditLog) -> list[str]:
    with audit.engine.connect() as connection:
        return [row[0] for row in connection.execute(select(Decision.decision_id).order_by(Decision.decision_id))]


def spool_files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


async def hand_over_once(directory: Path, audit: AuditLog) -> int:
    """A worker that starts, hands over what it may take, and stops."""
    spool = Spool(directory, limit=1 << 20)
    try:
        return await spool.hand_over(audit)
    finally:
        spool.close()


def test_spooled_decisions_reach_the_audit_log_once(tmp_path: Path, log: AuditLog) -> None:  # noqa: F811
    async def scenario() -> None:
        spool = Spool(tmp_path / "spool", limit=1 << 20)
        await asyncio.gather(*(spool.append(fallback(n)) for n in range(50)))
        assert await spool.hand_over(log) == 50
        assert await spool.hand_over(log) == 0  # nothing left, nothing sent twice
        await spool.append(fallback(50))
        assert await spool.hand_over(log) == 1
        spool.close()

    asyncio.run(scenario())
    assert logged(log) == sorted(f"fb{n}" for n in range(51))
    assert spool_files(tmp_path / "spool") == []  # the worker closed: its lock and its empty file are gone too
    records = list(log.records(CAMPAIGN.id, None, None))
    assert [record["decision_id"] for record in records] == [f"fb{n}" for n in range(51)]  # in time order
    assert all(record["fallback"] and record["seq"] is None for record in records)


def test_a_hand_over_repeated_after_a_crash_adds_nothing(tmp_path: Path, log: AuditLog) -> None:  # noqa: F811
    """The worker died between the insert and the delete: its successor sends the same file again."""
    kept = tmp_path / "kept"

    async def first_worker() -> None:
        spool = Spool(tmp_path / "spool", limit=1 << 20)
        for n in range(5):
            await spool.append(fallback(n))
        shutil.copytree(tmp_path / "spool", kept)  # the files as they were before the hand-over
        assert await spool.hand_over(log) == 5
        spool.close()

    asyncio.run(first_worker())
    shutil.rmtree(tmp_path / "spool")
    kept.rename(tmp_path / "spool")  # its lock file is there, held by nobody: a dead worker's spool

    assert asyncio.run(hand_over_once(tmp_path / "spool", log)) == 5
    assert logged(log) == [f"fb{n}" for n in range(5)]
    assert spool_files(tmp_path / "spool") == []


def test_records_wait_on_disk_while_the_database_is_away(tmp_path: Path, database_url: str) -> None:
    away = AuditLog(driver_url(unreachable(database_url)))
    back = AuditLog(driver_url(database_url))
    back.create_schema()

    async def scenario() -> None:
        spool = Spool(tmp_path / "spool", limit=1 << 20)
        await spool.append(fallback(1))
        with pytest.raises(Exception):  # noqa: B017 (whatever the driver raises for a refused connection)
            await spool.hand_over(away)
        await spool.append(fallback(2))  # appends go on into a new file meanwhile
        with pytest.raises(Exception):  # noqa: B017
            await spool.hand_over(away)
        assert await spool.hand_over(back) == 2
        spool.close()

    try:
        asyncio.run(scenario())
        assert logged(back) == ["fb1", "fb2"]
    finally:
        away.dispose()
        back.dispose()


def test_the_spool_refuses_past_its_limit_and_frees_what_it_hands_over(tmp_path: Path, log: AuditLog) -> None:  # noqa: F811
    line = len(orjson.dumps(fallback(0))) + 1

    async def scenario() -> None:
        spool = Spool(tmp_path / "spool", limit=3 * line)
        for n in range(3):
            await spool.append(fallback(n))
        with pytest.raises(SpoolFull):
            await spool.append(fallback(3))
        assert await spool.hand_over(log) == 3
        await spool.append(fallback(3))  # room again
        assert await spool.hand_over(log) == 1
        spool.close()

    asyncio.run(scenario())
    assert logged(log) == [f"fb{n}" for n in range(4)]


def test_a_torn_last_line_was_never_answered_and_is_skipped(tmp_path: Path, log: AuditLog) -> None:  # noqa: F811
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool" / "dead.lock").touch()
    torn = orjson.dumps(fallback(2))[:40]
    (tmp_path / "spool" / "dead.0.jsonl").write_bytes(orjson.dumps(fallback(1)) + b"\n" + torn)

    assert asyncio.run(hand_over_once(tmp_path / "spool", log)) == 1
    assert logged(log) == ["fb1"]


def _spool_and_hang(directory: str, ready: multiprocessing.synchronize.Event) -> None:
    async def spool_some() -> None:
        spool = Spool(Path(directory), limit=1 << 20)
        for n in range(7):
            await spool.append(fallback(n))
        ready.set()
        await asyncio.sleep(3600)

    asyncio.run(spool_some())


def test_a_killed_workers_spool_is_adopted_by_another(tmp_path: Path, log: AuditLog) -> None:  # noqa: F811
    """The lock is the kernel's: kill -9 releases it, and only then may another worker take the files."""
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    worker = context.Process(target=_spool_and_hang, args=(str(tmp_path / "spool"), ready))
    worker.start()
    try:
        assert ready.wait(60), "the worker did not spool"

        assert asyncio.run(hand_over_once(tmp_path / "spool", log)) == 0  # alive: its spool is its own
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(30)
        assert asyncio.run(hand_over_once(tmp_path / "spool", log)) == 7
    finally:
        if worker.is_alive():
            worker.kill()
    assert logged(log) == [f"fb{n}" for n in range(7)]
    assert spool_files(tmp_path / "spool") == []


def test_spooled_rows_take_keys_no_redis_stream_reaches() -> None:
    entry = spooled_entry(fallback(1))
    millis, sequence = entry.order_key()
    assert millis == T0 // 1000 + 1 and sequence >= SPOOLED_SEQUENCE
    assert spooled_entry(fallback(1)) == entry and spooled_entry(fallback(2)).entry_id != entry.entry_id
