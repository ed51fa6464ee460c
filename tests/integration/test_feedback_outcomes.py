"""/feedback reports what became of each accepted conversion, on both stores: ``repeats`` (a new event id
for a decision that had converted already) and ``stale`` (a decision of an earlier policy version, or a
fallback) are recorded and not counted, and like ``censored`` they are part of ``accepted``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from latebandit.config import Settings
from latebandit.timeutil import format_time
from tests.inprocess import ManualClock, served, store_settings

SECRET = "feedback-outcomes-test-secret-0123456789abcdef"
CAMPAIGN = {"id": "shop", "arms": ["a", "b"], "policy": {"name": "ucb1"}, "window": 3600}
KEYS = ["accepted", "duplicates", "censored", "repeats", "stale", "rejected"]


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def app(request, tmp_path) -> AsyncIterator[tuple[httpx.AsyncClient, ManualClock]]:
    stores = store_settings(request)
    settings = Settings(_env_file=None, secret=SECRET, database_url=f"sqlite:///{tmp_path / 'audit.db'}", **stores)
    clock = ManualClock()
    async with served(settings, clock) as http:
        yield http, clock


async def decide(http: httpx.AsyncClient) -> str:
    answer = await http.post("/choose", json={"campaign": "shop"})
    assert answer.status_code == 200, answer.text
    return answer.json()["decision_id"]


async def feedback(http: httpx.AsyncClient, *events: dict[str, Any]) -> dict[str, Any]:
    answer = await http.post("/feedback", json={"events": list(events)})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert list(body) == KEYS
    return {key: value for key, value in body.items() if value}  # what the batch did, zeros left out


def conversion(decision_id: str, event_id: str | None, clock: ManualClock) -> dict[str, Any]:
    event = {"type": "conversion", "decision_id": decision_id, "occurred_at": format_time(clock.now)}
    return event | ({"event_id": event_id} if event_id else {})


async def conversions(http: httpx.AsyncClient) -> int:
    state = (await http.get("/campaigns/shop/state")).json()
    return sum(arm["conversions"] for arm in state["arms"].values())


async def test_repeats_and_stale_conversions_are_reported(app) -> None:
    http, clock = app
    assert (await http.post("/campaigns", json=CAMPAIGN)).status_code == 201
    assert await feedback(http) == {}  # every key, even for an empty batch
    first, second = await decide(http), await decide(http)
    clock.advance(1)
    assert await feedback(http, conversion(first, "e1", clock)) == {"accepted": 1}
    assert await feedback(http, conversion(first, "e1", clock)) == {"duplicates": 1}
    assert await feedback(http, conversion(first, "e2", clock), conversion(second, None, clock)) == {
        "accepted": 2, "repeats": 1,
    }  # fmt: skip
    assert await conversions(http) == 2  # the repeat is not counted again
    old = await decide(http)
    change = {"policy": {"name": "ucb1"}}
    assert (await http.post("/campaigns/shop/policy", json=change)).status_code == 200
    assert await feedback(http, conversion(old, "e3", clock)) == {"accepted": 1, "stale": 1}
    assert await conversions(http) == 0  # the new policy version starts afresh and does not count it
    assert (await http.post("/campaigns/shop/pause")).status_code == 200
    fallback = await decide(http)
    assert (await http.post("/campaigns/shop/resume")).status_code == 200
    assert await feedback(http, conversion(fallback, "e4", clock)) == {"accepted": 1, "stale": 1}
    late = await decide(http)
    clock.advance(3602)  # past its window
    assert await feedback(http, conversion(late, "e5", clock)) == {"accepted": 1, "censored": 1}


async def test_a_planning_campaign_reports_them_too(app) -> None:
    """Conversions sent to a campaign whose policy learns from sums (each read as an aggregate at its
    instant): the same outcomes, and what is not counted is not credited to the schedule."""
    http, clock = app
    planned = {"id": "shop", "arms": ["a", "b"], "policy": {"name": "odaaf", "params": {"mean_delay": 1}}}
    assert (await http.post("/campaigns", json=planned)).status_code == 201
    first, spare = await decide(http), await decide(http)
    clock.advance(1)
    assert await feedback(http, conversion(first, "e1", clock)) == {"accepted": 1}
    assert await feedback(http, conversion(first, "e2", clock)) == {"accepted": 1, "repeats": 1}
    assert await feedback(http, conversion(first, None, clock)) == {"duplicates": 1}
    assert await conversions(http) == 1
    change = {"policy": {"name": "odaaf", "params": {"mean_delay": 2}}}
    assert (await http.post("/campaigns/shop/policy", json=change)).status_code == 200
    await decide(http)  # the new version's first segment opens: a conversion now would be credited to it
    clock.advance(1)
    assert await feedback(http, conversion(spare, "e3", clock)) == {"accepted": 1, "stale": 1}
    assert await conversions(http) == 0
