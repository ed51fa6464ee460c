"""A campaign whose state in Redis cannot be read (written there corrupt, or with the non-finite sums that
feedback could leave before such values were refused): /choose answers its default arm as a fallback and the
log names the campaign, GET /state answers a JSON error, never a 500 on every request; a rebuild from the
audit log, or a policy change (a fresh state), makes it learn again."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from latebandit.audit.log import AuditLog
from latebandit.audit.writer import AuditWriter
from latebandit.config import Settings
from latebandit.replay.rebuild import rebuild_redis
from latebandit.store.keys import Keys
from tests.inprocess import ManualClock, client, served, started

SECRET = "unreadable-state-test-secret-0123456789abcdef"
PLANNED = {
    "id": "banner", "arms": ["a", "b"], "default_arm": "b", "slot_seconds": 1, "allowed_lateness": 10,
    "policy": {"name": "odaaf", "params": {"mean_delay": 1, "horizon": 1000}},
}  # fmt: skip
INDEXED = {"id": "sale", "arms": ["a", "b", "c"], "default_arm": "c", "policy": {"name": "ucb1"}}


@pytest.fixture
async def app(tmp_path, redis_url: str, redis_prefix: str) -> AsyncIterator[tuple[httpx.AsyncClient, ManualClock]]:
    settings = Settings(_env_file=None, secret=SECRET, database_url=f"sqlite:///{tmp_path / 'audit.db'}",
                        redis_url=redis_url, redis_prefix=redis_prefix)  # fmt: skip
    clock = ManualClock()
    async with served(settings, clock) as http:
        yield http, clock


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def choose(http: httpx.AsyncClient, campaign: str) -> dict:
    answer = await http.post("/choose", json={"campaign": campaign})
    assert answer.status_code == 200, answer.text
    return answer.json()


async def assert_falls_back(http: httpx.AsyncClient, campaign: str, default: str, caplog) -> None:
    """Within a few decisions (a worker may serve some from its previous read while it reads again, in the
    background) every decision answers the default arm as a fallback, one error line names the campaign, and
    GET /state answers a JSON error that says what to do."""
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        served = [await choose(http, campaign) for _ in range(10)]
    fallbacks = [decision["fallback"] for decision in served]
    assert True in fallbacks and all(fallbacks[fallbacks.index(True) :]), fallbacks
    assert {(decision["arm"], decision["propensity"]) for decision in served if decision["fallback"]} == {
        (default, 1.0)
    }
    errors = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert len(errors) == 1, [record.getMessage() for record in errors]  # not once per decision
    assert getattr(errors[0], "campaign", None) == campaign and repr(campaign) in errors[0].getMessage()
    assert "rebuild" in errors[0].getMessage()
    state = await http.get(f"/campaigns/{campaign}/state")
    assert state.status_code == 503 and state.headers["content-type"] == "application/json", state.text
    assert state.json()["error"] == "state_unreadable" and repr(campaign) in state.json()["detail"]


async def test_a_schedule_with_an_infinite_reward_falls_back(app, raw, redis_prefix: str, caplog) -> None:
    """What two aggregates of 1.7e308 left before they were refused: a segment's reward of inf, which the
    closing of the segment wrote into the closed list as invalid JSON (``"reward":inf``)."""
    http, clock = app
    assert (await http.post("/campaigns", json=PLANNED)).status_code == 201
    for _ in range(5):
        assert not (await choose(http, "banner"))["fallback"]
        clock.advance(1)
    await raw.hset(Keys(redis_prefix).segments("banner"), "1:r", "inf")
    clock.advance(1000)  # both blocks played and closed: the next plan needs the closed list
    await assert_falls_back(http, "banner", "b", caplog)
    change = {"policy": {"name": "odaaf", "params": {"mean_delay": 1, "horizon": 2000}}}
    assert (await http.post("/campaigns/banner/policy", json=change)).status_code == 200
    assert not (await choose(http, "banner"))["fallback"]
    assert (await http.get("/campaigns/banner/state")).status_code == 200


async def test_a_rebuild_from_the_audit_log_repairs_it(tmp_path, redis_url, redis_prefix, raw, caplog) -> None:
    """What operators.md prescribes: `latebandit rebuild --campaign ID` (here its function, on the worker's store)."""
    database = f"sqlite:///{tmp_path / 'audit.db'}"
    settings = Settings(_env_file=None, secret=SECRET, database_url=database, redis_url=redis_url,
                        redis_prefix=redis_prefix)  # fmt: skip
    clock = ManualClock()
    async with started(settings, clock) as app, client(app) as http:
        assert (await http.post("/campaigns", json=PLANNED)).status_code == 201
        for _ in range(5):
            assert not (await choose(http, "banner"))["fallback"]
            clock.advance(1)
        await raw.hset(Keys(redis_prefix).segments("banner"), "1:r", "inf")
        clock.advance(1000)
        await assert_falls_back(http, "banner", "b", caplog)
        store, audit = app.state.runtime.store, AuditLog(database)
        await AuditWriter(store, audit, 1000).flush()
        assert (await rebuild_redis(audit, store, settings, "banner")).campaigns == ["banner"]
        assert not (await choose(http, "banner"))["fallback"]
        state = await http.get("/campaigns/banner/state")
        assert state.status_code == 200 and state.json()["arms"]["a"]["conversions"] == 0.0


@pytest.mark.parametrize("corrupt", ["nan", "inf", "not a number"])
async def test_counters_that_are_not_numbers_fall_back(app, raw, redis_prefix: str, corrupt: str, caplog) -> None:
    http, clock = app
    assert (await http.post("/campaigns", json=INDEXED)).status_code == 201
    assert not (await choose(http, "sale"))["fallback"]
    await raw.hset(Keys(redis_prefix).counters("sale"), "s:1", corrupt)
    clock.advance(5)  # past the worker's snapshot interval: it reads the state again
    await assert_falls_back(http, "sale", "c", caplog)


async def test_a_corrupt_histogram_falls_back(app, raw, redis_prefix: str, caplog) -> None:
    http, clock = app
    assert (await http.post("/campaigns", json=INDEXED)).status_code == 201
    assert not (await choose(http, "sale"))["fallback"]
    await raw.hset(Keys(redis_prefix).cells("sale"), "0:x:c", "1")
    clock.advance(5)  # past the worker's snapshot interval: it reads the state again
    await assert_falls_back(http, "sale", "c", caplog)
