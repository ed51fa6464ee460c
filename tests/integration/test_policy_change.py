"""Changing a campaign's policy (its next version) on real Redis, with the audit log in real PostgreSQL:
every worker switches, conversions of earlier decisions stop counting, the audit log keeps both versions'
history, and a replay or a rebuild of that log reproduces the change."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
import pytest
import redis

from latebandit.audit.log import AuditLog
from latebandit.audit.writer import AuditWriter
from latebandit.campaign import Campaign, CampaignSpec, CampaignStatus, PolicyChange
from latebandit.config import Settings
from latebandit.engine.core import DecisionEngine, EngineOptions
from latebandit.replay.rebuild import rebuild_redis, replay_audit
from latebandit.store.base import CampaignMoved, CampaignRefused, DecisionStatus, StateStore
from latebandit.store.redis import RedisStore
from latebandit.timeutil import MICROS, format_time
from latebandit.tokens import TokenSigner
from tests.integration.test_store_contract import T0, conversion, make_campaign, pull, store  # noqa: F401

pytestmark = [pytest.mark.redis, pytest.mark.postgres]

SECRET = "policy-change-test-secret-0123456789abcdef"
SPEC = CampaignSpec(id="promo", arms=["a", "b", "c"], policy={"name": "ucb1"}, window=3600.0)
TO_FIXED_B = PolicyChange(policy={"name": "fixed", "params": {"arm": "b"}})


# the store contract (memory and Redis) ------------------------------------------------------------------


async def test_change_policy_resets_the_state_and_keeps_pause_and_deduplication(store: StateStore) -> None:  # noqa: F811
    campaign = make_campaign()
    await store.create_campaign(campaign, {})
    await store.record_decision(campaign, pull(campaign, 1, T0, "d0"), None, 60)
    assert await store.apply_conversions(campaign, [conversion(campaign, "d0", 1, T0, "e0")]) == ["counted"]
    await store.set_status("c1", CampaignStatus.PAUSED, {})

    changed = await store.change_policy(campaign.with_policy(TO_FIXED_B), {"type": "campaign", "action": "policy"})
    assert changed is not None
    assert (changed.version, changed.policy.name, changed.status) == (2, "fixed", CampaignStatus.PAUSED)
    assert (await store.get_campaign("c1")) == changed
    state = await store.snapshot(changed)
    assert (state.counters.decisions, state.counters.pulls.tolist(), len(state.histogram.count)) == (0, [0, 0, 0], 0)
    assert state.counters.conversions.tolist() == [0.0, 0.0, 0.0]
    await store.set_status("c1", CampaignStatus.ACTIVE, {})
    # Event ids and converted decisions are still remembered: a retry stays a duplicate.
    assert await store.apply_conversions(changed, [conversion(changed, "d0", 1, T0, "e0")]) == ["duplicate"]

    # A caller holding version 1 is told to reload, for decisions, feedback and a second change.
    assert (await store.record_decision(campaign, pull(campaign, 0, T0, "d1"), None, 60)).status is DecisionStatus.MOVED
    with pytest.raises(CampaignRefused, match="moved"):
        await store.apply_conversions(campaign, [conversion(campaign, "d9", 0, T0, "e9")])
    with pytest.raises(CampaignMoved):
        await store.change_policy(campaign.with_policy(TO_FIXED_B), {})
    assert (await store.snapshot(changed)).counters.decisions == 0
    assert await store.change_policy(make_campaign("ghost").with_policy(TO_FIXED_B), {}) is None


# two workers, the audit log, replay and rebuild ----------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> int:
        self.now += round(seconds * MICROS)
        return self.now


@dataclass
class Deployment:
    """Two API workers (each its own Redis client and campaign cache) and the audit writer."""

    first: DecisionEngine
    second: DecisionEngine
    writer: AuditWriter
    audit: AuditLog
    clock: Clock
    settings: Settings


@pytest.fixture
async def deployment(redis_url: str, redis_prefix: str, postgres_url: str) -> AsyncIterator[Deployment]:
    settings = Settings(redis_url=redis_url, redis_prefix=redis_prefix, database_url=postgres_url, secret=SECRET)
    audit = AuditLog(settings.sqlalchemy_url)
    audit.create_schema()
    clock = Clock()
    workers = [RedisStore(redis_url, redis_prefix, clock=clock) for _ in range(2)]
    signer = TokenSigner(SECRET)
    first, second = (
        DecisionEngine(worker, signer, clock, np.random.default_rng(seed), EngineOptions(snapshot_interval=0.0))
        for seed, worker in enumerate(workers)
    )
    yield Deployment(first, second, AuditWriter(workers[0], audit, 1000), audit, clock, settings)
    for worker in workers:
        await worker.close()
    audit.dispose()


def conversion_of(decision_id: str, at: int) -> dict:
    return {"type": "conversion", "decision_id": decision_id, "occurred_at": format_time(at)}


async def test_a_policy_change_reaches_every_worker_and_survives_replay_and_rebuild(
    deployment: Deployment, redis_url: str, redis_prefix: str
) -> None:
    first, second, clock = deployment.first, deployment.second, deployment.clock
    await first.create_campaign(SPEC)
    old = []
    for _ in range(12):
        clock.advance(1)
        old.append(await second.choose("promo"))  # the second worker now caches version 1
    assert {decision.policy for decision in old} == {"ucb1"}
    converted = await second.feedback([conversion_of(old[0].decision_id, clock.advance(1))])
    assert converted.accepted == 1
    before_change = clock.now
    clock.advance(1)
    changed = await first.change_policy("promo", TO_FIXED_B)
    assert (changed.version, changed.policy.name) == (2, "fixed")
    clock.advance(1)

    # The stale worker learns of the change from the store and decides with the new policy.
    new = [await second.choose("promo") for _ in range(5)]
    assert {(decision.arm, decision.policy, decision.fallback) for decision in new} == {("b", "fixed", False)}
    assert second.signer.verify(new[0].decision_id).version == 2

    # A worker that still caches version 1 classifies feedback against it; the store sends it to reload.
    stale = DecisionEngine(second.store, second.signer, clock, np.random.default_rng(9), second.options)
    stale.campaigns.remember(Campaign(**SPEC.model_dump(), created_at=T0))
    result = await stale.feedback(
        [conversion_of(new[0].decision_id, clock.advance(1)), conversion_of(old[1].decision_id, clock.now)]
    )
    assert (result.accepted, result.rejected) == (2, [])
    live = await first.state("promo", clock.now)
    assert live["decisions"] == 5
    assert {arm: row["pulls"] for arm, row in live["arms"].items()} == {"a": 0, "b": 5, "c": 0}
    assert live["arms"]["b"]["conversions"] == 1  # the version 2 decision's; the version 1 one is stale

    # The audit log holds both versions' history, and the change itself.
    await deployment.writer.flush()
    records = list(deployment.audit.records("promo", None, None))
    changes = [record for record in records if record["type"] == "campaign" and record["action"] == "policy"]
    assert [change["config"]["version"] for change in changes] == [2]
    assert changes[0]["config"]["policy"] == {"name": "fixed", "params": {"arm": "b"}}
    decisions = [record for record in records if record["type"] == "decision"]
    assert [record["version"] for record in decisions] == [1] * 12 + [2] * 5
    outcomes = [record["outcome"] for record in records if record["type"] == "conversion"]
    assert outcomes == ["counted", "counted", "stale"]

    # A replay of the log reproduces the live state, and the state before the change.
    replayed = await replay_audit(deployment.audit, deployment.settings, "promo")
    assert replayed.campaigns["promo"].version == 2
    assert await replayed.state("promo", clock.now) == live
    earlier = await replay_audit(deployment.audit, deployment.settings, "promo", as_of=before_change)
    past = await earlier.state("promo", before_change)
    assert (past["policy"], past["decisions"]) == ("ucb1", 12)
    assert sum(row["conversions"] for row in past["arms"].values()) == 1

    # Redis loses its data; a rebuild from the audit log restores version 2 and its state.
    client = redis.Redis.from_url(redis_url)
    client.delete(*client.keys(f"{redis_prefix}:*"))
    rebuilt_store = RedisStore(redis_url, redis_prefix, clock=clock)
    try:
        assert (await rebuild_redis(deployment.audit, rebuilt_store, deployment.settings)).campaigns == ["promo"]
        restored = await rebuilt_store.get_campaign("promo")
        assert restored is not None and (restored.version, restored.policy.name) == (2, "fixed")
        assert await first.state("promo", clock.now) == live
        again = await second.choose("promo")  # the rebuilt store still checks the version
        assert (again.arm, again.fallback) == ("b", False)
    finally:
        await rebuilt_store.close()


async def test_a_worker_never_reuses_a_histogram_read_under_the_previous_version(
    redis_url: str, redis_prefix: str
) -> None:
    """Workers reuse a histogram read for up to snapshot_interval; not across a policy change made elsewhere."""
    first, second = (RedisStore(redis_url, redis_prefix) for _ in range(2))
    try:
        campaign = make_campaign()
        await first.create_campaign(campaign, {})
        await first.record_decision(campaign, pull(campaign, 0, T0, "d0"), None, 60)
        assert len((await first.snapshot(campaign, 60.0)).histogram.count) == 1  # cached for a minute
        changed = await second.change_policy(campaign.with_policy(TO_FIXED_B), {})
        assert changed is not None
        fresh = await first.snapshot(changed, 60.0)
        assert (fresh.counters.decisions, len(fresh.histogram.count)) == (0, 0)
    finally:
        await first.close()
        await second.close()
