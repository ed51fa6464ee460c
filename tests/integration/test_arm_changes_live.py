"""Arm changes through the decision engine, on the embedded store, Redis and Redis Cluster: a new arm is
opened, a retired one is never chosen again (propensity 0, the others' a distribution) while its late
conversions count, a worker holding the earlier arm set is moved onto the new one, and the live state equals
the replay of the audit log through any sequence of decisions, conversions, additions, retirements and
archives (after which nothing is decided or changed, and conversions are recorded until feedback_until); once
purged, an archived campaign has no key left, whatever that sequence was."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latebandit.audit.records import Record
from latebandit.campaign import ArmsRefused, Campaign, CampaignSpec
from latebandit.config import Settings
from latebandit.engine.core import Decision, DecisionEngine, EngineOptions
from latebandit.engine.describe import describe_state
from latebandit.engine.directory import CampaignArchived
from latebandit.replay.apply import Replayer, records_as_lines
from latebandit.store.base import StateStore
from latebandit.store.memory import MemoryStore
from latebandit.store.redis import RedisStore
from latebandit.timeutil import MICROS, format_time
from latebandit.tokens import TokenSigner
from tests.conftest import delete_keys

T0 = 1_800_000_000_000_000
SECRET = "arm-changes-test-secret-0123456789abcdef"
STORES = ["memory", *(pytest.param(name, marks=pytest.mark.redis) for name in ("redis", "cluster"))]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@asynccontextmanager
async def workers(request: pytest.FixtureRequest, kind: str, clock: Clock) -> AsyncIterator[list[DecisionEngine]]:
    """Two workers over one store: each its own Redis client and campaign cache (one worker, embedded)."""
    signer, options = TokenSigner(SECRET), EngineOptions(snapshot_interval=0.0)
    if kind == "memory":
        store = MemoryStore(clock=clock)
        yield [DecisionEngine(store, signer, clock, np.random.default_rng(0), options)]
        return
    if kind == "cluster":
        url, prefix, cluster = request.getfixturevalue("redis_cluster_url"), f"lb{uuid.uuid4().hex[:12]}", True
    else:
        url, prefix, cluster = request.getfixturevalue("redis_url"), f"lbarms{uuid.uuid4().hex[:10]}", False
    stores = [RedisStore(url, prefix, clock=clock, cluster=cluster) for _ in range(2)]
    try:
        yield [DecisionEngine(s, signer, clock, np.random.default_rng(i), options) for i, s in enumerate(stores)]
    finally:
        await delete_keys(stores[0].client, prefix)
        for store in stores:
            await store.close()


async def audit_lines(store: StateStore, campaign: str) -> list[dict]:
    records: list[Record] = [record for entry in await store.read_audit(campaign, 100_000) for record in entry.records]
    return list(records_as_lines(records))


async def replayed_state(lines: list[dict], campaign: str, as_of: int) -> dict:
    replayer = Replayer(settings=Settings())
    await replayer.apply_all(lines)
    return await replayer.state(campaign, as_of)


def converted(decision: Decision, at: int) -> dict:
    return {"type": "conversion", "decision_id": decision.decision_id, "occurred_at": format_time(at)}


@pytest.mark.parametrize("kind", STORES)
async def test_an_added_arm_is_opened_and_a_retired_one_never_chosen(request, kind: str) -> None:
    clock = Clock()
    async with workers(request, kind, clock) as engines:
        first, last = engines[0], engines[-1]
        spec = CampaignSpec(id="ads", arms=["a", "b", "c"], policy={"name": "ucb1"}, window=3600.0)
        await first.create_campaign(spec)
        before: list[Decision] = []
        for _ in range(9):
            clock.now += MICROS
            before.append(await last.choose("ads"))  # the last worker caches the three arms
        before_addition = clock.now
        clock.now += MICROS
        assert (await first.change_arms("ads", ["d"], [])).arms == ["a", "b", "c", "d"]
        clock.now += MICROS
        opened = await last.choose("ads")  # a stale worker: moved onto the new arm set, and UCB1 opens the arm
        assert (opened.arm, opened.propensity, opened.fallback) == ("d", 1.0, False)

        retired_c = next(decision for decision in before if decision.arm == "c")
        clock.now += MICROS
        changed = await last.change_arms("ads", [], ["c"])
        assert changed.retired == ["c"] and changed.arms_version == 2
        after = []
        for _ in range(30):
            clock.now += MICROS
            after.append(await first.choose("ads"))  # the first worker still holds the arm set with c active
        assert "c" not in {decision.arm for decision in after}
        assert all(0 < decision.propensity <= 1 for decision in after)

        clock.now += MICROS
        late = await first.feedback([converted(retired_c, clock.now)])  # the retired arm's late conversion counts
        assert (late.accepted, late.stale, late.rejected) == (1, 0, [])
        new_arm = await first.feedback([converted(opened, clock.now)])  # a worker may learn of d from feedback
        assert (new_arm.accepted, new_arm.rejected) == (1, [])

        live = await last.state("ads", clock.now)
        assert live["arms"]["c"]["retired"] is True and live["arms"]["c"]["conversions"] == 1
        assert live["arms"]["c"]["index"] is None and "retired" not in live["arms"]["d"]
        assert live["arms"]["d"]["pulls"] >= 1 and live["arms"]["d"]["conversions"] == 1

        lines = await audit_lines(first.store, "ads")
        changes = [line for line in lines if line["type"] == "arms"]
        assert [(line["added"], line["retired"]) for line in changes] == [(["d"], []), ([], ["c"])]
        assert await replayed_state(lines, "ads", clock.now) == live
        # As of a moment before the addition, a replay sees the three arms alone.
        earlier = Replayer(as_of=before_addition, settings=Settings())
        await earlier.apply_all(lines)
        assert list((await earlier.state("ads"))["arms"]) == ["a", "b", "c"]

        with pytest.raises(ArmsRefused, match="default arm"):
            await first.change_arms("ads", [], ["a"])


STEPS = (
    st.tuples(st.just("choose"), st.integers(0, 1), st.integers(1, 4), st.sampled_from([None, "r1", "r2"])),
    st.tuples(st.just("convert"), st.integers(0, 1), st.integers(0, 60), st.integers(0, 900)),  # which, delay
    st.tuples(st.just("add"), st.integers(0, 1)),
    st.tuples(st.just("retire"), st.integers(0, 1), st.integers(0, 20)),  # worker, which active arm
    st.tuples(st.just("archive"), st.integers(0, 1)),
    st.tuples(st.just("wait"), st.integers(1, 1200)),
)  # each step but a wait names its worker second
operations = st.lists(st.one_of(*STEPS), min_size=1, max_size=30)


def spec(policy: str, reward: dict | None = None) -> CampaignSpec:
    """Archived, it records conversions for 900 s (window and lateness): a sequence's waits and conversion
    delays reach past that."""
    return CampaignSpec(id="prop", arms=["a", "b"], policy={"name": policy}, window=600.0, allowed_lateness=300.0,
                        delay={"family": "exponential", "mean": 120.0}, reward=reward or {})  # fmt: skip


@dataclass
class Played:
    """What a sequence did, for the checks after it."""

    decisions: list[Decision] = field(default_factory=list)
    retired_at: dict[str, int] = field(default_factory=dict)
    archived: Campaign | None = None


async def play(engines: list[DecisionEngine], clock: Clock, steps: list[tuple]) -> Played:
    """Apply ``steps`` to campaign "prop", asserting what each answers: no retired arm chosen, and once
    archived no decision and no arm change, while conversions are recorded until its feedback_until. Every
    decision converts once more at the end, and an archived campaign's once more after its feedback_until."""
    played, added = Played(), 0
    for step in steps:
        clock.now += 1000
        if step[0] == "wait":
            clock.now += step[1] * MICROS
            continue
        engine = engines[step[1] % len(engines)]
        if step[0] == "choose":
            for _ in range(step[2]):
                if played.archived is not None:
                    with pytest.raises(CampaignArchived):
                        await engine.choose("prop", step[3])
                    continue
                decision = await engine.choose("prop", step[3])
                repeated = any(earlier.decision_id == decision.decision_id for earlier in played.decisions)
                assert repeated or decision.arm not in played.retired_at
                assert 0 < decision.propensity <= 1
                played.decisions.append(decision)
        elif step[0] == "convert" and played.decisions:
            decision = played.decisions[step[2] % len(played.decisions)]
            at = engine.signer.verify(decision.decision_id).decided_at + step[3] * MICROS
            clock.now = max(clock.now, at)
            await feedback(engine, played, clock, [converted(decision, at)])
        elif step[0] == "add":
            added += 1
            await changed_arms(engine, played, [f"new{added}"], [])
        elif step[0] == "retire":
            current = await engine.campaign("prop", fresh=True)
            choices = [arm for arm in current.arms if arm not in current.retired and arm != current.default_arm]
            if choices:
                arm = choices[step[2] % len(choices)]
                if await changed_arms(engine, played, [], [arm]):
                    played.retired_at[arm] = clock.now
        else:
            archived = await engine.archive("prop")
            first = played.archived or archived
            assert (archived.archived_at, archived.feedback_until) == (first.archived_at, first.feedback_until)
            played.archived = first
    made = {decision.decision_id: decision for decision in played.decisions}.values()  # a retried request's once
    await feedback(engines[-1], played, clock, [converted(decision, clock.now) for decision in made])
    if played.archived is not None and played.archived.feedback_until is not None:
        clock.now = max(clock.now, played.archived.feedback_until + 1)
        await feedback(engines[0], played, clock, [converted(decision, clock.now) for decision in made])
    return played


async def feedback(engine: DecisionEngine, played: Played, clock: Clock, events: list[dict]) -> None:
    """Send ``events``: all recorded, unless the campaign is archived and its feedback_until has passed."""
    if not events:
        return
    result = await engine.feedback(events)
    until = played.archived.feedback_until if played.archived is not None else None
    ended = until is not None and clock.now > until
    assert [item["reason"] for item in result.rejected] == ["campaign_archived"] * (len(events) if ended else 0)


async def changed_arms(engine: DecisionEngine, played: Played, added: list[str], retired: list[str]) -> bool:
    """Whether the arms changed: always, unless the campaign is archived, which takes no change."""
    if played.archived is None:
        await engine.change_arms("prop", added, retired)
        return True
    with pytest.raises(CampaignArchived):
        await engine.change_arms("prop", added, retired)
    return False


async def live_state(engine: DecisionEngine, now: int) -> dict:
    """The campaign's state now. An archived one's is read from its store state, which conversions still change
    until its feedback_until, though the engine no longer describes it (GET /state answers 410)."""
    campaign = await engine.campaign("prop", fresh=True)
    if campaign.archived_at is None:
        return await engine.state("prop", now)
    return describe_state(campaign, await engine.store.snapshot(campaign, 0.0), now)


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("policy", ["delayed-ucb", "thompson"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=operations)
async def test_live_state_equals_the_replay_through_arm_changes_and_archive(request, kind, policy, steps) -> None:
    clock = Clock()
    async with workers(request, kind, clock) as engines:
        await engines[0].create_campaign(spec(policy))
        played = await play(engines, clock, steps)
        live = await live_state(engines[-1], clock.now)
        assert {arm for arm, row in live["arms"].items() if row.get("retired")} == set(played.retired_at)
        assert await replayed_state(await audit_lines(engines[0].store, "prop"), "prop", clock.now) == live


@pytest.mark.parametrize("kind", STORES)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=operations)
async def test_an_archived_campaign_leaves_no_key_once_purged(request, kind, steps) -> None:
    """Whatever the campaign went through, the sweep after its feedback_until removes all it had in Redis (its
    request-id keys and, its rewards adding up, the credited hash too); only the registry of archived campaigns
    still names it."""
    clock = Clock()
    async with workers(request, kind, clock) as engines:
        await engines[0].create_campaign(spec("delayed-ucb", {"max": 5.0, "per_decision": "sum"}))
        played = await play(engines, clock, steps)
        archived = played.archived or await engines[-1].archive("prop")
        assert archived.feedback_until is not None
        store = engines[0].store
        entries = await store.read_audit("prop", 100_000)  # the audit writer's drain, which the sweep waits for
        await store.ack_audit("prop", [entry.entry_id for entry in entries])
        assert await store.purge_archived(archived.feedback_until) == []  # conversions are recorded until then
        clock.now = max(clock.now, archived.feedback_until + 1)
        assert await store.purge_archived(clock.now) == ["prop"]
        assert await store.purge_archived(clock.now) == []
        if isinstance(store, RedisStore):
            left = [key async for key in store.client.scan_iter(match=f"{store.keys.prefix}:*")]
            assert left == [store.keys.archived().encode()]
