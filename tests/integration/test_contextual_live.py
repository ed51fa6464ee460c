"""Contextual campaigns through the decision engine, on the embedded store, Redis and Redis Cluster: the live
model equals the replay of the audit log through any sequence of decisions, conversions and waits (the
window folding decisions away), in both request forms, with two workers over one store; a worker's own
decisions are seen by its next ones before its next read (those the store counted: not a retried request's),
and by the later ones of their group; the policy's model is prepared while the decision before is recorded,
not by the request; a rebuild restores the model and the kept features."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latebandit.audit.log import AuditLog
from latebandit.audit.writer import AuditWriter
from latebandit.campaign import CampaignSpec
from latebandit.config import Settings
from latebandit.engine.contextual import Offer, linear_stats, policy_stats
from latebandit.engine.core import Decision, DecisionEngine, EngineOptions
from latebandit.policies.linear import OTFLinUCB, PreparedIndex, PreparedStats
from latebandit.replay.rebuild import rebuild_redis
from latebandit.store import redis as redis_store
from latebandit.store.redis import RedisStore
from latebandit.timeutil import MICROS
from latebandit.tokens import TokenSigner
from tests.integration.test_arm_changes_live import STORES, Clock, audit_lines, converted, replayed_state, workers

SPECS = {
    "actions": {"id": "ctx", "policy": {"name": "otf-linucb"}, "features": 3, "window": 600.0},
    "context": {"id": "ctx", "arms": ["a", "b", "c"], "features": 3, "window": 600.0,
                "policy": {"name": "otf-lints", "params": {"sigma0": 0.2, "propensity_samples": 50}}},
}  # fmt: skip


def offer(form: str, seed: int) -> Offer:
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(4 if form == "actions" else 1, 3))
    vectors /= np.maximum(1.0, np.linalg.norm(vectors, axis=1))[:, None]
    labels = tuple(f"item{seed % 7}-{k}" for k in range(len(vectors))) if form == "actions" else None
    return Offer(vectors, labels)


def assert_same_state(live: dict[str, Any], replayed: dict[str, Any]) -> None:
    """Equal, the model's floats up to rounding (a fold adds many decisions' Σ AAᵀ at once, a replay each pull's)."""
    live_model, replayed_model = live.pop("model"), replayed.pop("model")
    assert replayed == live
    for key, value in live_model.items():
        if isinstance(value, float | list):
            np.testing.assert_allclose(replayed_model[key], value, rtol=1e-9, atol=1e-12, err_msg=key)
        elif key != "arms":
            assert replayed_model[key] == value, key
    assert live_model.get("arms", {}).keys() == replayed_model.get("arms", {}).keys()


operations = st.lists(
    st.one_of(
        st.tuples(st.just("choose"), st.integers(0, 1), st.integers(1, 3), st.integers(0, 10_000)),
        st.tuples(st.just("convert"), st.integers(0, 1), st.integers(0, 60), st.integers(0, 900)),
        st.tuples(st.just("wait"), st.integers(1, 1200)),
        st.tuples(st.just("arms"), st.integers(0, 1), st.integers(0, 20)),  # a context campaign's: add or retire
    ),
    min_size=1,
    max_size=25,
)


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("form", ["actions", "context"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=operations)
async def test_live_model_equals_the_replay(request, monkeypatch, kind, form, steps) -> None:
    """Redis folds its ``decided`` string every 2 decisions here, either worker, while the other decides; a
    context campaign's arms are added and retired meanwhile (an added arm is a new model block, a retired one
    is never chosen)."""
    monkeypatch.setattr(redis_store, "FOLD_AFTER", 2)
    clock = Clock()
    async with workers(request, kind, clock) as engines:
        await engines[0].create_campaign(CampaignSpec(**SPECS[form]))
        decisions: list[Decision] = []
        retired: set[str] = set()
        for step in steps:
            engine = engines[step[1] % len(engines)] if step[0] != "wait" else engines[0]
            clock.now += 1000
            if step[0] == "choose":
                for k in range(step[2]):
                    decision = await engine.choose("ctx", offer=offer(form, step[3] + k))
                    assert not decision.fallback and 0 < decision.propensity <= 1
                    assert decision.arm not in retired
                    decisions.append(decision)
            elif step[0] == "arms" and form == "context":
                campaign = await engine.campaign("ctx")
                retirable = [arm for arm in campaign.arms if arm not in retired and arm != campaign.default_arm]
                if step[2] % 2 and len(retirable) > 1:
                    retired.add(arm := retirable[step[2] % len(retirable)])
                    await engine.change_arms("ctx", [], [arm])
                else:
                    await engine.change_arms("ctx", [f"new{step[2]}-{len(decisions)}-{len(retired)}-{clock.now}"], [])
            elif step[0] == "convert" and decisions:
                decision = decisions[step[2] % len(decisions)]
                at = engine.signer.verify(decision.decision_id).decided_at + step[3] * MICROS
                clock.now = max(clock.now, at)
                assert (await engine.feedback([converted(decision, at)])).rejected == []
            elif step[0] == "wait":
                clock.now += step[1] * MICROS
        live = await engines[-1].state("ctx", clock.now)
        assert live["model"]["decisions"] == len(decisions)
        replayed = await replayed_state(await audit_lines(engines[0].store, "ctx"), "ctx", clock.now)
        assert_same_state(live, replayed)


@pytest.mark.parametrize("kind", STORES)
async def test_a_context_campaign_opens_an_added_arm_and_never_chooses_a_retired_one(request, kind) -> None:
    """Deterministic UCB on one repeated context: an added arm is a new block with nothing decided, whose
    width is the largest, so the next decision opens it, whichever worker takes it (the other one holds the
    earlier arm set and reloads); a retired arm's block stays in the model and GET /state, and is never
    chosen again."""
    clock = Clock()
    spec = {"id": "ctx", "arms": ["a", "b"], "features": 2, "window": 600.0, "policy": {"name": "linucb"}}
    same = Offer(np.array([[0.6, 0.8]]), None)
    async with workers(request, kind, clock) as engines:
        first, last = engines[0], engines[-1]
        await first.create_campaign(CampaignSpec(**spec))
        for _ in range(6):
            clock.now += MICROS
            await last.choose("ctx", offer=same)
        await first.change_arms("ctx", ["c"], [])
        clock.now += MICROS
        assert (await last.choose("ctx", offer=same)).arm == "c"
        await first.change_arms("ctx", [], ["b"])
        chosen = []
        for _ in range(8):
            clock.now += MICROS
            chosen.append((await engines[len(chosen) % len(engines)].choose("ctx", offer=same)).arm)
        assert "b" not in chosen and set(chosen) == {"a", "c"}
        state = await last.state("ctx", clock.now)
        assert list(state["model"]["arms"]) == ["a", "b", "c"] and state["model"]["decisions"] == 15
        replayed = await replayed_state(await audit_lines(first.store, "ctx"), "ctx", clock.now)
        assert_same_state(state, replayed)


@pytest.mark.redis
async def test_a_worker_sees_its_own_decisions_before_its_next_read(redis_url, redis_prefix) -> None:
    """Deterministic UCB on one repeated context: with every decision from one read, it would pick one arm
    for the whole read interval; with its own decisions added it spreads over the arms as it learns."""
    clock = Clock()
    store = RedisStore(redis_url, redis_prefix, clock=clock)
    engine = DecisionEngine(store, TokenSigner("x" * 32), clock, np.random.default_rng(0),
                            EngineOptions(snapshot_interval=3600.0))  # fmt: skip
    try:
        spec = {"id": "own", "arms": ["a", "b", "c"], "features": 2, "window": 600.0, "policy": {"name": "linucb"}}
        await engine.create_campaign(CampaignSpec(**spec))
        same = Offer(np.array([[0.6, 0.8]]), None)
        arms = [(await engine.choose("own", offer=same)).arm for _ in range(3)]
        assert sorted(arms) == ["a", "b", "c"]  # each pull narrows its arm's width: the next goes elsewhere
    finally:
        await store.close()


@pytest.mark.redis
async def test_the_decisions_of_a_group_see_the_ones_before_them(redis_url, redis_prefix) -> None:
    """Eight requests at once: the first goes alone, the other seven together (one store call), chosen in turn
    from one prepared model, each with the ones before it added: deterministic UCB on one context plays eight
    different arms (from one model without them, each would be drawn among seven tied arms: all different
    with a chance of 7!/7⁷, under 1 %)."""
    clock = Clock()
    store = RedisStore(redis_url, redis_prefix, clock=clock)
    engine = DecisionEngine(store, TokenSigner("w" * 32), clock, np.random.default_rng(3),
                            EngineOptions(snapshot_interval=3600.0))  # fmt: skip
    calls = 0
    record = store.record_decisions

    async def counted(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        return await record(*args)

    try:
        arms = [f"arm{k}" for k in range(8)]
        spec = {"id": "grp", "arms": arms, "features": 2, "window": 600.0, "policy": {"name": "linucb"}}
        await engine.create_campaign(CampaignSpec(**spec))
        store.record_decisions = counted  # type: ignore[method-assign]
        same = Offer(np.array([[0.6, 0.8]]), None)
        decisions = await asyncio.gather(*(engine.choose("grp", offer=same) for _ in arms))
        assert calls == 2
        assert sorted(decision.arm for decision in decisions) == arms
    finally:
        await store.close()


@pytest.mark.redis
async def test_each_model_is_prepared_while_the_decision_before_is_recorded(
    redis_url, redis_prefix, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the first request of a histogram read no request prepares the policy's model: a lone decision's
    successor (the model plus that decision) is prepared while the store records it, and the next request
    decides from it. It holds what a fresh read of the store then gives (to rounding: V⁻¹ and θ̂ were updated
    by Sherman–Morrison), the decisions' footprints included. A new read (here with a conversion) is another
    state version: its first request prepares its own."""
    clock = Clock()
    store = RedisStore(redis_url, redis_prefix, clock=clock)
    engine = DecisionEngine(store, TokenSigner("v" * 32), clock, np.random.default_rng(4),
                            EngineOptions(snapshot_interval=3600.0))  # fmt: skip
    events: list[str] = []
    models: list[PreparedIndex] = []
    prepare, follow, record = OTFLinUCB.prepare, PreparedIndex.with_decision, store.record_decisions

    def preparing(self: OTFLinUCB, stats: Any) -> Any:
        events.append("prepare")
        models.append(prepare(self, stats))
        return models[-1]

    def following(self: PreparedIndex, *decision: Any) -> PreparedIndex:
        events.append("follow")
        models.append(follow(self, *decision))
        return models[-1]

    async def recording(*args: Any) -> Any:
        events.append("record")
        return await record(*args)

    monkeypatch.setattr(OTFLinUCB, "prepare", preparing)
    monkeypatch.setattr(PreparedIndex, "with_decision", following)
    monkeypatch.setattr(store, "record_decisions", recording)

    async def decide(seed: int) -> list[str]:
        """One request, then the loop's turn (a server's, while the answer travels): what happened meanwhile."""
        mark = len(events)
        decisions.append(await engine.choose("ctx", offer=offer("actions", seed)))
        await asyncio.sleep(0)
        return events[mark:]

    decisions: list[Decision] = []
    try:
        await engine.create_campaign(CampaignSpec(**SPECS["actions"]))
        campaign = await engine.campaign("ctx")
        assert await decide(0) == ["prepare", "record", "follow"]  # a new read: its request prepares
        for seed in range(1, 4):
            clock.now += MICROS
            assert await decide(seed) == ["record", "follow"]
        successor = models[-1]
        read = await store.snapshot(campaign, 0.0)  # a new read: what the store holds after the four decisions
        fresh = prepare(campaign.contextual_policy, linear_stats(campaign, read, clock.now))
        assert isinstance(fresh, PreparedIndex)
        assert successor.decisions.tolist() == fresh.decisions.tolist() == [4.0]
        for part in ("inverse", "theta"):
            np.testing.assert_allclose(getattr(successor.ridge, part), getattr(fresh.ridge, part), rtol=0, atol=1e-12)
        for part in ("window_footprint", "coefficient"):
            np.testing.assert_allclose(getattr(successor, part), getattr(fresh, part), rtol=1e-12)
        assert fresh.window_footprint[0] > 0
        clock.now += MICROS
        assert (await engine.feedback([converted(decisions[0], clock.now)])).accepted == 1
        before = models[-1]
        await store.snapshot(campaign, 0.0)  # a new read (as one after snapshot_interval), with the conversion
        assert await decide(4) == ["prepare", "record", "follow"]
        assert not np.array_equal(models[-2].ridge.theta, before.ridge.theta)  # b has the conversion
    finally:
        await store.close()


@pytest.mark.redis
async def test_a_worker_holds_its_own_counted_decisions_and_no_retried_one(redis_url, redis_prefix) -> None:
    """Between two reads, the model a worker holds is the read's plus its own decisions that the store counted
    (summed while the store records them): a retried request's decision is not added again, whether it comes
    alone or in a group beside a new one."""
    clock = Clock()
    store = RedisStore(redis_url, redis_prefix, clock=clock)
    engine = DecisionEngine(store, TokenSigner("w" * 32), clock, np.random.default_rng(5),
                            EngineOptions(snapshot_interval=3600.0))  # fmt: skip
    counted: list[np.ndarray] = []

    async def choose(request_id: str, seed: int) -> Decision:
        offered = offer("actions", seed)
        decision = await engine.choose("ctx", request_id, offered)
        assert offered.labels is not None
        if decision.arm in offered.labels:  # a new decision (a retried one answers the first request's action)
            counted.append(offered.vectors[offered.labels.index(decision.arm)])
        return decision

    try:
        await engine.create_campaign(CampaignSpec(**SPECS["actions"]))
        campaign = await engine.campaign("ctx")
        for request_id, seed in [("r0", 0), ("r1", 1), ("r0", 2)]:
            clock.now += MICROS
            await choose(request_id, seed)
        clock.now += MICROS
        await asyncio.gather(choose("r3", 3), choose("r1", 4), choose("r5", 5))  # then r1 and r5 in one batch
        assert len(counted) == 4
        held = store.held(campaign, 3600.0)
        assert held is not None and held.model is not None
        expected = sum(np.outer(a, a) for a in counted)
        np.testing.assert_allclose(held.model.gram[0], expected, rtol=1e-12, atol=1e-15)
        inverse = held.model.inverses.of(held.model.gram, 1.0)[0]
        np.testing.assert_allclose(inverse, np.linalg.inv(np.eye(3) + expected), rtol=1e-12, atol=1e-15)
        read = await store.snapshot(campaign, 0.0)  # the store's own sums agree
        assert read.model is not None
        np.testing.assert_allclose(read.model.gram, held.model.gram, rtol=1e-12, atol=1e-15)
    finally:
        await store.close()


@pytest.mark.redis
async def test_a_retried_request_s_choice_never_joins_the_model(request) -> None:
    """A retried request is answered with its first decision; the one chosen for the retry is never recorded.
    Here another worker decided meanwhile, so the store's reply brings exactly the decision count the retry's
    successor model was prepared for: the model the worker decides from next is still the one of what the
    store holds (its own first decision in V, the retry's context nowhere)."""
    clock = Clock()
    async with workers(request, "redis", clock) as engines:
        first, other = engines
        first.options = EngineOptions(snapshot_interval=3600.0)  # one read for the whole test
        await first.create_campaign(CampaignSpec(**SPECS["context"]))
        campaign = await first.campaign("ctx")
        clock.now += MICROS
        earlier = await first.choose("ctx", "retried", offer("context", 1))
        clock.now += MICROS
        await other.choose("ctx", offer=offer("context", 2))
        clock.now += MICROS
        assert (await first.choose("ctx", "retried", offer("context", 3))).decision_id == earlier.decision_id
        await asyncio.sleep(0)  # the answer's callback: the next model made ready
        held = first.store.held(campaign, 3600.0)
        assert held is not None and held.version is not None and held.version.decisions == 2
        model = first._models.kept("ctx", held.version) or first._models.prepare(campaign, held, clock.now)
        fresh = campaign.contextual_policy.prepare(policy_stats(campaign, held, clock.now))
        assert isinstance(model, PreparedStats) and isinstance(fresh, PreparedStats)
        np.testing.assert_array_equal(model.stats.gram, fresh.stats.gram)
        np.testing.assert_array_equal(model.stats.decisions, fresh.stats.decisions)
        retried = offer("context", 3).vectors[0]
        assert not any(np.allclose(block, np.outer(retried, retried)) for block in model.stats.gram)


@pytest.mark.redis
async def test_a_rebuild_restores_the_model_and_the_kept_features(redis_url, redis_prefix, tmp_path) -> None:
    clock = Clock()
    store = RedisStore(redis_url, redis_prefix, clock=clock)
    engine = DecisionEngine(store, TokenSigner("y" * 32), clock, np.random.default_rng(1),
                            EngineOptions(snapshot_interval=0.0))  # fmt: skip
    audit = AuditLog(f"sqlite:///{tmp_path / 'audit.db'}")
    audit.create_schema()
    try:
        await engine.create_campaign(CampaignSpec(**SPECS["actions"]))
        decisions = []
        for seed in range(6):
            clock.now += MICROS
            decisions.append(await engine.choose("ctx", offer=offer("actions", seed)))
        clock.now += MICROS
        assert (await engine.feedback([converted(decisions[0], clock.now)])).accepted == 1
        before = await engine.state("ctx", clock.now)
        await AuditWriter(store, audit, 1000).flush()
        for key in [key async for key in store.client.scan_iter(match=f"{redis_prefix}:*")]:
            await store.client.delete(key)  # the store lost everything
        assert (await rebuild_redis(audit, store, Settings())).campaigns == ["ctx"]
        assert_same_state(await engine.state("ctx", clock.now), before)
        clock.now += MICROS  # a later conversion of a decision made before the loss finds its features
        assert (await engine.feedback([converted(decisions[1], clock.now)])).accepted == 1
        assert (await engine.state("ctx", clock.now))["model"]["conversions"] == 2
    finally:
        await store.close()
        audit.dispose()
