"""A contextual campaign's Σ AAᵀ on Redis: decisions are appended to its ``decided`` string and folded into the
model by whichever worker finds the string long. Whatever the interleaving of decisions and folds across two
workers, the model read is Σ AAᵀ of every decision recorded, computed here from the decisions' own features;
a fold whose read is no longer the stored state (another fold, a policy change, a rebuild) writes nothing."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from latebandit.campaign import CampaignSpec, PolicyChange
from latebandit.engine.contextual import Offer
from latebandit.engine.core import DecisionEngine
from latebandit.store import redis as redis_store
from latebandit.store.base import StateUnreadable
from latebandit.store.redis import RedisStore
from latebandit.timeutil import MICROS
from tests.integration.test_arm_changes_live import Clock, workers

pytestmark = pytest.mark.redis
D = 4
SPEC = {"id": "fold", "arms": ["a", "b"], "features": D, "window": 600.0, "policy": {"name": "otf-linucb"}}


def context(rng: np.random.Generator) -> Offer:
    vector = rng.normal(size=D)
    return Offer((vector / max(1.0, float(np.linalg.norm(vector))))[None], None)


def expected_grams(chosen: list[tuple[int, np.ndarray]]) -> np.ndarray:
    """Σ a·aᵀ per arm, one outer product at a time."""
    grams = np.zeros((len(SPEC["arms"]), D, D))
    for arm, features in chosen:
        grams[arm] += np.outer(features, features)
    return grams


async def stored_model(store: RedisStore, campaign_id: str) -> tuple[np.ndarray, bytes]:
    campaign = await store.get_campaign(campaign_id)
    assert campaign is not None
    snapshot = await store.snapshot(campaign)
    assert snapshot.model is not None
    decided = await store.client.get(store.keys.decided(campaign_id)) or b""
    return snapshot.model.gram, decided


async def decide(
    engine: DecisionEngine, clock: Clock, rng: np.random.Generator, count: int
) -> list[tuple[int, np.ndarray]]:
    """``count`` decisions taken one at a time, a second apart: each one's arm and features."""
    chosen = []
    for _ in range(count):
        clock.now += MICROS
        offer = context(rng)
        chosen.append((SPEC["arms"].index((await engine.choose("fold", offer=offer)).arm), offer.vectors[0]))
    return chosen


async def settle(stores: list[RedisStore]) -> None:
    """Until no fold is in flight on any worker."""
    while any(store._folding for store in stores):
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("kind", ["redis", "cluster"])
async def test_the_model_is_every_decision_s_gram_whichever_worker_folds(request, monkeypatch, kind) -> None:
    monkeypatch.setattr(redis_store, "FOLD_AFTER", 3)
    clock, rng = Clock(), np.random.default_rng(7)
    async with workers(request, kind, clock) as engines:
        await engines[0].create_campaign(CampaignSpec(**SPEC))
        chosen = []
        for step in range(40):
            clock.now += MICROS
            offers = [context(rng) for _ in range(1 + step % 3)]
            engine = engines[step % 2]
            decisions = await asyncio.gather(*(engine.choose("fold", offer=offer) for offer in offers))
            chosen += [(SPEC["arms"].index(d.arm), o.vectors[0]) for d, o in zip(decisions, offers, strict=True)]
        stores = [engine.store for engine in engines]
        await settle(stores)  # type: ignore[arg-type]
        gram, decided = await stored_model(stores[0], "fold")  # type: ignore[arg-type]
        np.testing.assert_allclose(gram, expected_grams(chosen), rtol=1e-12, atol=1e-12)
        assert len(decided) < 3 * (D + 1) * 8 * 2, "folds keep the string short"
        assert (await stores[1].client.hget(stores[1].keys.model("fold"), "fold")) is not None, "it was folded"


async def test_a_fold_that_raced_another_writes_nothing(request) -> None:
    clock, rng = Clock(), np.random.default_rng(3)
    async with workers(request, "redis", clock) as engines:
        campaign = await engines[0].create_campaign(CampaignSpec(**SPEC))
        chosen = await decide(engines[0], clock, rng, 10)
        stores: list[RedisStore] = [engine.store for engine in engines]  # type: ignore[misc]
        outcomes = await asyncio.gather(*(store.fold_model(campaign, least=1) for store in stores))
        assert sorted(outcomes) in ([False, True], [True, True])  # two reads of one state: one fold; else two
        gram, decided = await stored_model(stores[1], "fold")
        np.testing.assert_allclose(gram, expected_grams(chosen), rtol=1e-12, atol=1e-12)
        assert decided == b""


async def stale_fold(store: RedisStore, campaign_id: str, version: int) -> list:
    """A fold's arguments from a read now, to be sent later."""
    async with store.client.pipeline(transaction=True) as pipe:
        pipe.hgetall(store.keys.model(campaign_id))
        pipe.get(store.keys.decided(campaign_id))
        raw, decided = await pipe.execute()
    garbage = np.full((D, D), 1e6).astype("<f8").tobytes()  # what a stale fold would wrongly write
    return [version, raw.get(b"fold", b""), len(decided), "stale", 0, garbage]


@pytest.mark.parametrize("change", ["policy", "rebuild", "fold", "purge"])
async def test_a_fold_read_before_a_change_writes_nothing(request, change) -> None:
    clock, rng = Clock(), np.random.default_rng(5)
    async with workers(request, "redis", clock) as engines:
        campaign = await engines[0].create_campaign(CampaignSpec(**SPEC))
        await decide(engines[0], clock, rng, 4)
        store: RedisStore = engines[0].store  # type: ignore[assignment]
        args = await stale_fold(store, "fold", campaign.version)
        if change == "policy":
            campaign = await engines[0].change_policy("fold", PolicyChange(policy={"name": "linucb"}))
        elif change == "rebuild":
            snapshot = await store.snapshot(campaign)
            assert snapshot.model is not None
            await store.replace_state(campaign, snapshot.counters, snapshot.histogram, {}, model=snapshot.model)
        elif change == "fold":
            assert await engines[1].store.fold_model(campaign, least=1)  # type: ignore[attr-defined]
        else:  # the campaign's keys deleted, as the purge of an archived campaign does
            await store.client.delete(*store.keys.purged("fold"))
        before = await store.client.hgetall(store.keys.model("fold"))
        keys = [store.keys.counters("fold"), store.keys.model("fold"), store.keys.decided("fold")]
        assert await store._run("fold_model", keys, args) == 0
        assert await store.client.hgetall(store.keys.model("fold")) == before
        if change == "purge":
            assert not await store.client.exists(*store.keys.purged("fold")), "a fold brought a key back"


async def test_a_worker_holding_another_arm_set_does_not_fold(request) -> None:
    """After an arm is added, a worker that still holds the earlier arm set folds nothing (the decisions of the
    added arm name a block it lacks); one holding the new set folds every decision, the added arm's too."""
    clock, rng = Clock(), np.random.default_rng(6)
    async with workers(request, "redis", clock) as engines:
        stale = await engines[0].create_campaign(CampaignSpec(**SPEC))
        chosen = await decide(engines[0], clock, rng, 3)
        current = await engines[0].change_arms("fold", ["c"], [])
        while chosen[-1][0] != 2:  # until the added arm is chosen (its empty block's interval is the widest)
            clock.now += MICROS
            offer = context(rng)
            decision = await engines[0].choose("fold", offer=offer)
            chosen.append((current.arms.index(decision.arm), offer.vectors[0]))
        store: RedisStore = engines[1].store  # type: ignore[assignment]
        assert not await store.fold_model(stale, least=1)
        assert await store.fold_model(current, least=1)
        snapshot = await store.snapshot(current)
        assert snapshot.model is not None
        grams = np.zeros((3, D, D))
        for arm, features in chosen:
            grams[arm] += np.outer(features, features)
        np.testing.assert_allclose(snapshot.model.gram, grams, rtol=1e-12, atol=1e-12)


async def test_a_short_decided_string_is_left_to_grow(request) -> None:
    """The workers that found the string long at once fold it once: the later ones find it short, and go."""
    clock, rng = Clock(), np.random.default_rng(4)
    async with workers(request, "redis", clock) as engines:
        campaign = await engines[0].create_campaign(CampaignSpec(**SPEC))
        await decide(engines[0], clock, rng, 3)
        store: RedisStore = engines[0].store  # type: ignore[assignment]
        assert not await store.fold_model(campaign)  # 3 decisions, FOLD_AFTER 512
        assert not await store.fold_model(campaign, least=4)
        assert await store.fold_model(campaign, least=3)
        assert await store.client.get(store.keys.decided("fold")) is None


@pytest.mark.parametrize("decided", [b"\x00" * 44, np.array([[7.0, 0, 0, 0, 0]]).astype("<f8").tobytes()])
async def test_a_decided_string_the_scripts_never_write_is_unreadable(request, decided) -> None:
    """Not whole entries, or an entry of no arm: the campaign's reads and folds say so, and nothing is written."""
    async with workers(request, "redis", Clock()) as engines:
        campaign = await engines[0].create_campaign(CampaignSpec(**SPEC))
        store: RedisStore = engines[0].store  # type: ignore[assignment]
        await store.client.set(store.keys.decided("fold"), decided)
        with pytest.raises(StateUnreadable, match="fold"):
            await store.snapshot(campaign)
        with pytest.raises(StateUnreadable, match="model"):
            await store.fold_model(campaign, least=1)
        assert await store.client.get(store.keys.decided("fold")) == decided
