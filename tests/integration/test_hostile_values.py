"""Feedback values no campaign could have produced, through the app on both stores: refused one by one with
``value_out_of_range``, and the campaign keeps deciding and describing its state with finite numbers."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from latebandit.config import Settings
from latebandit.timeutil import format_time
from tests.inprocess import ManualClock, served

SECRET = "hostile-values-test-secret-0123456789abcdef"
SLOTS = 253  # the slots of each of ODAAF's first blocks at this campaign's horizon and mean delay
CAMPAIGN = {
    "id": "banner", "arms": ["a", "b"], "slot_seconds": 1, "allowed_lateness": 10,
    "policy": {"name": "odaaf", "params": {"mean_delay": 1, "horizon": 1000}},
}  # fmt: skip


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def settings(request, tmp_path) -> Settings:
    stores = {"memory": {}}
    if request.param == "redis":
        stores["redis"] = {"redis_url": request.getfixturevalue("redis_url"),
                           "redis_prefix": request.getfixturevalue("redis_prefix")}  # fmt: skip
    return Settings(_env_file=None, secret=SECRET, database_url=f"sqlite:///{tmp_path / 'audit.db'}",
                    **stores[request.param])  # fmt: skip


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[tuple[httpx.AsyncClient, ManualClock]]:
    clock = ManualClock()
    async with served(settings, clock) as http:
        yield http, clock


def aggregate(event_id: str, start: int, end: int, value: float) -> dict[str, Any]:
    return {"type": "aggregate", "campaign": "banner", "event_id": event_id, "start": format_time(start),
            "end": format_time(end), "value": value}  # fmt: skip


async def send(http: httpx.AsyncClient, *events: dict[str, Any]) -> dict[str, Any]:
    answer = await http.post("/feedback", json={"events": list(events)})
    assert answer.status_code == 200, answer.text
    return answer.json()


async def decide(http: httpx.AsyncClient, clock: ManualClock, decisions: int) -> None:
    for _ in range(decisions):
        answer = await http.post("/choose", json={"campaign": "banner"})
        assert answer.status_code == 200 and not answer.json()["fallback"], answer.text
        clock.advance(1)


def finite_numbers(value: Any) -> bool:
    """Whether every number in a JSON document is finite and none is null where a number was (orjson writes a
    non-finite float as null: the state's reward fields must never be null)."""
    if isinstance(value, dict):
        return all(finite_numbers(item) for item in value.values())
    if isinstance(value, list):
        return all(finite_numbers(item) for item in value)
    return not isinstance(value, float) or math.isfinite(value)


async def finite_state(http: httpx.AsyncClient) -> dict[str, Any]:
    answer = await http.get("/campaigns/banner/state")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert finite_numbers(body)
    assert all(arm["conversions"] is not None for arm in body["arms"].values())
    assert all(value is not None for value in body["policy_state"]["plan"]["state"]["reward"])
    return body


async def test_huge_aggregates_are_refused_and_the_campaign_keeps_serving(app) -> None:
    """The issue's case: two aggregates of 1.7e308 summed to inf; once the segment closed, every /choose and
    GET /state failed (Redis) or the state read null (embedded). An aggregate of 1e300 was accepted."""
    http, clock = app
    assert (await http.post("/campaigns", json=CAMPAIGN)).status_code == 201
    start = clock.now
    await decide(http, clock, 5)
    for event_id, value in [("e1", 1.7e308), ("e2", 1.7e308), ("e3", 1e300)]:
        answer = await send(http, aggregate(event_id, start, clock.now, value))
        assert answer["accepted"] == 0 and [item["reason"] for item in answer["rejected"]] == ["value_out_of_range"]
    answer = await send(http, aggregate("fair", start, clock.now, 5.0))  # at most 1 per decision: 5 is possible
    assert (answer["accepted"], answer["rejected"]) == (1, [])
    clock.advance(3 * SLOTS)  # both blocks played and closed: the next plan learns from them
    await decide(http, clock, 3)
    body = await finite_state(http)
    assert body["arms"]["a"]["conversions"] == 5.0
    assert body["policy_state"]["plan"]["state"]["reward"] == [5.0, 0.0]


async def test_a_value_past_the_decisions_made_is_refused_and_changes_nothing(app) -> None:
    """The bound is the decisions made so far times the largest reward of one (reward_cap): 4 decisions at
    a cap of 2.5 can have produced 10, not more; the refused event is not remembered, so it may be resent."""
    http, clock = app
    campaign = {**CAMPAIGN, "policy": {**CAMPAIGN["policy"], "params": {**CAMPAIGN["policy"]["params"],
                                                                         "reward_cap": 2.5}}}  # fmt: skip
    assert (await http.post("/campaigns", json=campaign)).status_code == 201
    start = clock.now
    await decide(http, clock, 4)
    before = await finite_state(http)
    refused = await send(http, aggregate("x", start, clock.now, math.nextafter(10.0, math.inf)))
    assert [item["reason"] for item in refused["rejected"]] == ["value_out_of_range"]
    assert await finite_state(http) == before
    accepted = await send(http, aggregate("x", start, clock.now, 10.0))
    assert (accepted["accepted"], accepted["duplicates"], accepted["rejected"]) == (1, 0, [])


async def test_no_total_leaves_float_range_whatever_the_cap(app) -> None:
    """A cap so large that the per-decision bound admits anything: the running total still refuses the value
    that would take it past the limit, while the values before it count."""
    http, clock = app
    campaign = {**CAMPAIGN, "policy": {**CAMPAIGN["policy"], "params": {**CAMPAIGN["policy"]["params"],
                                                                         "reward_cap": 1e308}}}  # fmt: skip
    assert (await http.post("/campaigns", json=campaign)).status_code == 201
    start = clock.now
    await decide(http, clock, 2)
    answer = await send(http, *(aggregate(f"e{i}", start, clock.now, 4e299) for i in range(3)))
    assert answer["accepted"] == 2 and [(item["index"], item["reason"]) for item in answer["rejected"]] == [
        (2, "value_out_of_range")
    ]
    clock.advance(3 * SLOTS)
    await decide(http, clock, 1)
    body = await finite_state(http)
    assert body["arms"]["a"]["conversions"] == 8e299
