"""Archiving a campaign (DELETE /campaigns/{id}): decisions end at once (410), conversions of its decisions
are recorded until its feedback_until and rejected ``campaign_archived`` after it, then a sweep removes every
Redis key it had; the audit log keeps it all, and export, replay and rebuild reproduce the archive. On the
embedded store, real Redis and a real Redis Cluster, and the two stores compared on random sequences."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latebandit.audit.export import export_lines
from latebandit.campaign import Campaign, CampaignStatus
from latebandit.config import Settings
from latebandit.replay.rebuild import rebuild_redis, replay_audit
from latebandit.runtime import Runtime
from latebandit.store.base import CampaignRefused, DecisionStatus, StateStore
from latebandit.store.memory import MemoryStore
from latebandit.store.redis import RedisStore
from latebandit.timeutil import MICROS, format_time
from tests.conftest import delete_keys
from tests.inprocess import STORE_KINDS, ManualClock, client, started, store_settings
from tests.integration.test_store_contract import T0, conversion, make_campaign, pull

SECRET = "campaign-archive-test-secret-0123456789abcdef"
NAME = "archived-shop"  # no other test's campaign: an archived id stays unlabelled in this process's metrics
CAMPAIGN = {"id": NAME, "arms": ["a", "b"], "policy": {"name": "ucb1"}, "window": 3600, "allowed_lateness": 600}
FEEDBACK_SECONDS = 3600 + 600  # window + allowed lateness: how long after the archive conversions are recorded
REQUEST_TTL = 10**7  # s: longer than any sequence's advances, since Redis expires request keys by its own clock


@dataclass
class Service:
    http: httpx.AsyncClient
    clock: ManualClock
    runtime: Runtime
    settings: Settings
    redis: aioredis.Redis | aioredis.RedisCluster | None  # the store's client, to count keys

    async def keys(self) -> list[bytes]:
        """The campaign's Redis keys (its hash tag), on every node of a cluster."""
        assert self.redis is not None
        return [key async for key in self.redis.scan_iter(match=f"{self.settings.redis_prefix}:{{{NAME}}}*")]


@pytest.fixture(params=STORE_KINDS)
async def service(request, tmp_path) -> AsyncIterator[Service]:
    stores = store_settings(request)
    settings = Settings(_env_file=None, secret=SECRET, database_url=f"sqlite:///{tmp_path / 'audit.db'}", **stores)
    clock = ManualClock()
    async with started(settings, clock) as app, client(app) as http:
        runtime = app.state.runtime
        store = runtime.store
        yield Service(http, clock, runtime, settings, store.client if isinstance(store, RedisStore) else None)


async def decide(http: httpx.AsyncClient, request_id: str | None = None) -> str:
    answer = await http.post("/choose", json={"campaign": NAME} | ({"request_id": request_id} if request_id else {}))
    assert answer.status_code == 200, answer.text
    return answer.json()["decision_id"]


async def convert(service: Service, decision_id: str, event_id: str, occurred: int | None = None) -> dict[str, Any]:
    event = {"type": "conversion", "event_id": event_id, "decision_id": decision_id,
             "occurred_at": format_time(service.clock.now if occurred is None else occurred)}  # fmt: skip
    answer = await service.http.post("/feedback", json={"events": [event]})
    assert answer.status_code == 200, answer.text
    return {key: value for key, value in answer.json().items() if value}


def archived_error(answer: httpx.Response) -> None:
    assert answer.status_code == 410, answer.text
    assert answer.json()["error"] == "campaign_archived" and answer.json()["detail"]


async def refused_everything_but_feedback(http: httpx.AsyncClient) -> None:
    archived_error(await http.post("/choose", json={"campaign": NAME}))
    archived_error(await http.post("/choose", json={"campaign": NAME, "request_id": "r1"}))  # even a retried one
    archived_error(await http.post(f"/campaigns/{NAME}/pause"))
    archived_error(await http.post(f"/campaigns/{NAME}/resume"))
    archived_error(await http.post(f"/campaigns/{NAME}/policy", json={"policy": {"name": "thompson"}}))
    archived_error(await http.post(f"/campaigns/{NAME}/arms", json={"arm": "c"}))
    archived_error(await http.delete(f"/campaigns/{NAME}/arms/b"))
    archived_error(await http.get(f"/campaigns/{NAME}/state"))
    again = await http.post("/campaigns", json=CAMPAIGN)
    assert again.status_code == 409 and again.json()["error"] == "campaign_exists"  # an archived id is never reused
    assert (await http.get("/campaigns")).json() == {"campaigns": []}
    assert (await http.get("/campaigns", params={"archived": "true"})).json() == {"campaigns": [NAME]}
    shown = (await http.get(f"/campaigns/{NAME}")).json()
    assert shown["status"] == CampaignStatus.ARCHIVED


async def test_an_archived_campaign_takes_late_feedback_then_leaves_redis(service: Service) -> None:
    http, clock = service.http, service.clock
    assert (await http.post("/campaigns", json=CAMPAIGN)).status_code == 201
    assert (await http.get("/campaigns")).json() == {"campaigns": [NAME]}
    first, second = await decide(http, "r1"), await decide(http)
    clock.advance(10)
    assert await convert(service, first, "e1") == {"accepted": 1}

    archived_at = clock.now
    answer = await http.delete(f"/campaigns/{NAME}")
    assert answer.status_code == 200, answer.text
    expected = {"campaign": NAME, "archived_at": format_time(archived_at),
                "feedback_until": format_time(archived_at + FEEDBACK_SECONDS * MICROS)}  # fmt: skip
    assert answer.json() == expected
    clock.advance(5)
    assert (await http.delete(f"/campaigns/{NAME}")).json() == expected  # idempotent: the first archive stands
    await refused_everything_but_feedback(http)
    shown = (await http.get(f"/campaigns/{NAME}")).json()
    assert (shown["archived_at"], shown["feedback_until"]) == (expected["archived_at"], expected["feedback_until"])

    clock.advance(FEEDBACK_SECONDS - 5)  # at feedback_until: a conversion within its window, reported late, counts
    assert await convert(service, second, "e2", archived_at + 100 * MICROS) == {"accepted": 1}
    assert await service.runtime.store.purge_archived(clock.now) == []  # not before its feedback_until
    clock.advance(1)
    late = await convert(service, second, "e3")
    assert list(late) == ["rejected"] and [item["reason"] for item in late["rejected"]] == ["campaign_archived"]

    await service.runtime.writer.flush()  # the sweep waits for the audit queue to be drained
    assert await service.runtime.store.purge_archived(clock.now) == [NAME]
    if service.redis is not None:
        assert await service.keys() == []  # not one key of the campaign left
    await refused_everything_but_feedback(http)
    assert (await http.delete(f"/campaigns/{NAME}")).json() == expected
    assert [item["reason"] for item in (await convert(service, first, "e4"))["rejected"]] == ["campaign_archived"]
    assert await service.runtime.store.purge_archived(clock.now) == []

    # The audit log kept everything; the export has the archive, and a replay reproduces it.
    lines = list(export_lines(service.runtime.audit, NAME, None, None))
    assert f'{{"type":"archive","campaign":"{NAME}","at":"{expected["archived_at"]}"}}' in lines
    replayer = await replay_audit(service.runtime.audit, service.settings, NAME)
    assert replayer.campaigns[NAME].archived_at == archived_at
    state = await replayer.state(NAME)
    assert sum(arm["conversions"] for arm in state["arms"].values()) == 2
    assert replayer.skipped == {}  # the late conversion was refused live, so never recorded

    if isinstance(service.runtime.store, RedisStore):  # a rebuild brings the archived state back, the sweep removes it
        await rebuild_redis(service.runtime.audit, service.runtime.store, service.settings, NAME)
        assert await service.keys() != []
        await refused_everything_but_feedback(http)
        assert await service.runtime.store.purge_archived(clock.now) == [NAME]
        assert await service.keys() == []


@pytest.mark.parametrize("service", ["memory"], indirect=True)  # metrics do not depend on the store
async def test_archived_campaigns_series_leave_metrics(service: Service) -> None:
    http, clock = service.http, service.clock
    name = f"metrics-{uuid.uuid4().hex[:8]}"  # metrics are the process's: an id archived by no other test
    assert (await http.post("/campaigns", json=CAMPAIGN | {"id": name})).status_code == 201
    decision = (await http.post("/choose", json={"campaign": name})).json()["decision_id"]
    await http.get(f"/campaigns/{name}/state")  # publishes the per-arm gauges
    series = f'campaign="{name}"'
    assert series in (await http.get("/metrics")).text
    assert (await http.delete(f"/campaigns/{name}")).status_code == 200
    clock.advance(1)
    assert await convert(service, decision, "late") == {"accepted": 1}  # recorded, counted under "_other"
    scraped = (await http.get("/metrics")).text
    assert series not in scraped
    assert 'latebandit_feedback_events_total{campaign="_other",outcome="counted"}' in scraped


# the two stores, side by side --------------------------------------------------------------------------------


steps = st.lists(
    st.one_of(
        st.tuples(st.just("decide"), st.integers(0, 2), st.sampled_from([None, "r1", "r2"])),
        st.tuples(st.just("convert"), st.integers(0, 5), st.sampled_from([None, "e1", "e2"])),
        st.tuples(st.just("archive")),
        st.tuples(st.just("pause"), st.booleans()),
        st.tuples(st.just("advance"), st.sampled_from([1, 3600, 86_400, 90_000, 200_000])),
        st.tuples(st.just("drain")),
        st.tuples(st.just("purge")),
    ),
    max_size=30,
)


@pytest.mark.redis
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps)
async def test_memory_and_redis_archive_alike(redis_url: str, steps: list[tuple]) -> None:
    """Outcomes, refusals, purges and audit records agree step by step; a purged campaign has no key left."""
    prefix = f"lbarch{uuid.uuid4().hex[:10]}"
    clocks = [[T0], [T0]]
    redis_store = RedisStore(redis_url, prefix, clock=lambda: clocks[1][0])
    stores: list[StateStore] = [MemoryStore(clock=lambda: clocks[0][0]), redis_store]
    seen: list[list[object]] = [[], []]
    try:
        for position, store in enumerate(stores):
            held = [make_campaign()]  # what a worker holds: the campaign as it last read it
            await store.create_campaign(held[0], {"type": "campaign"})
            for step in steps:
                seen[position].append(await _apply(store, held, clocks[position], step))
            seen[position] += [await store.list_campaigns(), await store.list_archived()]
        assert seen[0] == seen[1]
        if not await redis_store.client.exists(redis_store.keys.counters("c1")):  # purged: nothing of it is left
            assert [key async for key in redis_store.client.scan_iter(match=f"{prefix}:{{c1}}*")] == []
    finally:
        await delete_keys(redis_store.client, prefix)
        await redis_store.close()


async def _apply(store: StateStore, held: list[Campaign], clock: list[int], step: tuple) -> object:
    campaign, kind = held[0], step[0]
    if kind == "decide":
        _, arm, request_id = step
        decision = pull(campaign, arm, clock[0], f"d{clock[0]}")
        result = await store.record_decision(campaign, decision, request_id, REQUEST_TTL)
        return (result.status, result.decision_id)
    if kind == "convert":
        _, which, event_id = step
        try:
            return await store.apply_conversions(campaign, [conversion(campaign, f"d{which}", which % 3, T0, event_id)])
        except CampaignRefused as refused:
            return refused.reason
    if kind == "archive":
        archived = await store.archive(campaign.archived(clock[0]), {"type": "campaign", "action": "archive"})
        held[0] = archived or campaign
        return None if archived is None else (archived.archived_at, archived.feedback_until)
    if kind == "pause":
        status = CampaignStatus.PAUSED if step[1] else CampaignStatus.ACTIVE
        changed = await store.set_status("c1", status, {"type": "campaign", "action": status.value})
        return None if changed is None else changed.status
    if kind == "advance":
        clock[0] += step[1] * MICROS
        return clock[0]
    if kind == "drain":
        entries = await store.read_audit("c1", 1000)
        await store.ack_audit("c1", [entry.entry_id for entry in entries])
        return [record for entry in entries for record in entry.records]
    purged = await store.purge_archived(clock[0])
    stored = await store.get_campaign("c1")
    return purged, None if stored is None else stored.status


async def test_refusal_order_puts_archived_after_moved(redis_url: str, redis_prefix: str) -> None:
    """An archived campaign refuses decisions as ``archived`` (not ``paused``, even if paused before), retried
    request ids too: a worker that has not yet learnt of the archive must not answer a retry with its earlier
    decision when the one that archived answers 410. A caller at another policy version is told ``moved``
    first, as for every refusal."""
    for store in (MemoryStore(clock=lambda: T0), RedisStore(redis_url, redis_prefix, clock=lambda: T0)):
        campaign = make_campaign()
        await store.create_campaign(campaign, {})
        first = await store.record_decision(campaign, pull(campaign, 0, T0, "w"), "r1", 60)
        await store.set_status("c1", CampaignStatus.PAUSED, {})
        paused = await store.record_fallback(campaign, pull(campaign, 0, T0, "v"), "r2", 60)
        assert first.status is paused.status is DecisionStatus.NEW
        archived = await store.archive(campaign.archived(T0), {})
        assert archived is not None and archived.status is CampaignStatus.ARCHIVED
        for request_id in (None, "r1", "r2"):
            refused = await store.record_decision(campaign, pull(campaign, 0, T0, "x"), request_id, 60)
            fallback = await store.record_fallback(campaign, pull(campaign, 0, T0, "y"), request_id, 60)
            assert refused.status is fallback.status is DecisionStatus.ARCHIVED
        stale = campaign.model_copy(update={"version": 2})
        assert (await store.record_decision(stale, pull(stale, 0, T0, "z"), None, 60)).status is DecisionStatus.MOVED
        # paused before the archive, it still records feedback until its feedback_until
        assert await store.apply_conversions(campaign, [conversion(campaign, "d0", 0, T0, "e0")]) == ["counted"]
        if isinstance(store, RedisStore):
            await store.close()
