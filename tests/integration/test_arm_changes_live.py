"""Arm changes through the decision engine, on the embedded store, Redis and Redis Cluster: a new arm is
opened, a retired one is never chosen again (propensity 0, the others' a distribution) while its late
conversions count, a worker holding the earlier arm set is moved onto the new one, and the live state equals
the replay of the audit log through any sequence of decisions, conversions, additions and retirements."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latebandit.audit.records import Record
from latebandit.campaign import ArmsRefused, CampaignSpec
from latebandit.config import Settings
from latebandit.engine.core import Decision, DecisionEngine, EngineOptions
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


operations = st.lists(
    st.one_of(
        st.tuples(st.just("choose"), st.integers(0, 1), st.integers(1, 4)),  # worker, decisions
        st.tuples(st.just("convert"), st.integers(0, 1), st.integers(0, 60), st.integers(0, 900)),  # which, delay
        st.tuples(st.just("add"), st.integers(0, 1)),
        st.tuples(st.just("retire"), st.integers(0, 1), st.integers(0, 20)),  # worker, which active arm
        st.tuples(st.just("wait"), st.integers(1, 1200)),
    ),
    min_size=1,
    max_size=30,
)


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("policy", ["delayed-ucb", "thompson"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=operations)
async def test_live_state_equals_the_replay_through_any_arm_changes(request, kind, policy, steps) -> None:
    clock = Clock()
    async with workers(request, kind, clock) as engines:
        spec = CampaignSpec(id="prop", arms=["a", "b"], policy={"name": policy}, window=600.0,
                            delay={"family": "exponential", "mean": 120.0})  # fmt: skip
        await engines[0].create_campaign(spec)
        decisions: list[Decision] = []
        retired_at: dict[str, int] = {}
        added = 0
        for step in steps:
            engine: Callable[[int], DecisionEngine] = lambda which: engines[which % len(engines)]  # noqa: E731
            clock.now += 1000
            if step[0] == "choose":
                for _ in range(step[2]):
                    decision = await engine(step[1]).choose("prop")
                    assert decision.arm not in retired_at and 0 < decision.propensity <= 1
                    decisions.append(decision)
            elif step[0] == "convert" and decisions:
                decision = decisions[step[2] % len(decisions)]
                at = engine(step[1]).signer.verify(decision.decision_id).decided_at + step[3] * MICROS
                clock.now = max(clock.now, at)
                result = await engine(step[1]).feedback([converted(decision, at)])
                assert result.rejected == []
            elif step[0] == "add":
                added += 1
                await engine(step[1]).change_arms("prop", [f"new{added}"], [])
            elif step[0] == "retire":
                current = await engine(step[1]).campaign("prop", fresh=True)
                choices = [arm for arm in current.arms if arm not in current.retired and arm != current.default_arm]
                if choices:
                    arm = choices[step[2] % len(choices)]
                    await engine(step[1]).change_arms("prop", [], [arm])
                    retired_at[arm] = clock.now
            else:
                clock.now += step[1] * MICROS
        live = await engines[-1].state("prop", clock.now)
        assert {arm for arm, row in live["arms"].items() if row.get("retired")} == set(retired_at)
        assert await replayed_state(await audit_lines(engines[0].store, "prop"), "prop", clock.now) == live
