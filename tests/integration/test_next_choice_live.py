"""The next choice on real Redis (engine/choosing.py), observed from outside the engine: the policy's calls
(wrapped on its class) and the store's record calls (wrapped on the store) land in one timeline, so a test
reads whether a decision's request called the policy itself, or whether its choice was made once an earlier
decision was answered. Two workers (engines on stores of their own)
share a campaign; the clock stands still unless a test moves it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from latebandit.campaign import Campaign, CampaignSpec, PolicyChange
from latebandit.engine.core import GROUP_LIMIT, Decision, DecisionEngine, EngineOptions
from latebandit.engine.describe import arm_stats
from latebandit.engine.exposure import exposure
from latebandit.policies.base import ArmStats
from latebandit.store.redis import RedisStore
from latebandit.timeutil import MICROS, format_time
from latebandit.tokens import TokenSigner
from tests.integration.test_store_contract import T0

pytestmark = pytest.mark.redis

SECRET = "next-choice-test-secret-0123456789abcdef"
INTERVAL = 1.0  # seconds a histogram read is reused (EngineOptions.snapshot_interval)
SPEC = CampaignSpec(id="patient", arms=["a", "b", "c"], policy={"name": "patient-bandits"}, window=3600.0)


@dataclass
class Timeline:
    """What happened, in order: ``("call", stats, arm)`` for a policy call, ``("standing", stats)`` for a
    standing law computed, ``("start",)`` and ``("end",)`` around the first worker's record calls."""

    events: list[tuple[Any, ...]] = field(default_factory=list)

    def since(self, mark: int) -> list[str]:
        return [event[0] for event in self.events[mark:]]

    def calls(self, mark: int = 0) -> list[tuple[Any, ...]]:
        return [event for event in self.events[mark:] if event[0] in ("call", "standing")]


class Workers:
    def __init__(self, redis_url: str, prefix: str, timeline: Timeline) -> None:
        self.now = T0
        self.stores = [RedisStore(redis_url, prefix, clock=self.clock) for _ in range(2)]
        options = EngineOptions(snapshot_interval=INTERVAL)
        self.first, self.second = (
            DecisionEngine(store, TokenSigner(SECRET), self.clock, np.random.default_rng(seed), options)
            for seed, store in enumerate(self.stores)
        )
        self.timeline = timeline

    def clock(self) -> int:
        return self.now


@pytest.fixture
async def workers(redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Workers]:
    timeline = Timeline()
    deployment = Workers(redis_url, redis_prefix, timeline)
    store = deployment.stores[0]
    record = store.record_decisions

    async def recording(*args: Any) -> Any:
        timeline.events.append(("start",))
        try:
            return await record(*args)
        finally:
            timeline.events.append(("end",))

    monkeypatch.setattr(store, "record_decisions", recording)
    await deployment.first.create_campaign(SPEC)
    yield deployment
    for each in deployment.stores:
        await each.close()


def observe_policy(campaign: Campaign, timeline: Timeline, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call of the campaign's policy class, by either worker, goes to the timeline with its stats."""
    policy_class = type(campaign.policy_impl)
    choose_together, standing = policy_class.choose_together, policy_class.standing

    def call(self: Any, stats: ArmStats, decisions: int, rng: np.random.Generator) -> Any:
        choice = choose_together(self, stats, decisions, rng)
        timeline.events.append(("call", copied(stats), choice.arm.tolist()))
        return choice

    def law(self: Any, stats: ArmStats) -> np.ndarray:
        timeline.events.append(("standing", copied(stats)))
        return standing(self, stats)

    monkeypatch.setattr(policy_class, "choose_together", call)
    monkeypatch.setattr(policy_class, "standing", law)


def copied(stats: ArmStats) -> ArmStats:
    return ArmStats(*(np.array(part, copy=True) for part in (stats.pulls, stats.conversions, stats.effective, stats.t)))


async def decide(workers: Workers, campaign_id: str = SPEC.id) -> tuple[Decision, list[str]]:
    """A decision of the first worker, then the loop's turn (as a server's, while it writes the answer), and
    the timeline of that request: a policy call before "start" was made by the request itself."""
    mark = len(workers.timeline.events)
    decision = await workers.first.choose(campaign_id)
    await asyncio.sleep(0)
    return decision, workers.timeline.since(mark)


async def past_the_opening(workers: Workers, campaign_id: str = SPEC.id) -> Campaign:
    for _ in SPEC.arms:
        await decide(workers, campaign_id)
    return await workers.first.campaign(campaign_id)


def held_stats(workers: Workers, campaign: Campaign) -> ArmStats:
    """The statistics the first worker holds now, computed here from its store's snapshot with the module
    functions (the clock stands still, so Ñ is the histogram read's)."""
    state = workers.first.store.held(campaign, INTERVAL)
    assert state is not None
    return arm_stats(state, exposure(campaign, state, T0))


def assert_same_stats(got: ArmStats, expected: ArmStats) -> None:
    for part in ("pulls", "conversions", "effective", "t"):
        np.testing.assert_array_equal(getattr(got, part), getattr(expected, part), err_msg=part)


async def test_each_choice_is_made_once_the_previous_decision_is_answered(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the opening no request calls the policy: the one call per decision runs once it is answered,
    from exactly the statistics the worker holds then, and the next decision takes its arm."""
    campaign = await past_the_opening(workers)
    observe_policy(campaign, workers.timeline, monkeypatch)
    await decide(workers)
    for _ in range(30):
        (_, stats, arms) = workers.timeline.calls()[-1]
        assert_same_stats(stats, held_stats(workers, campaign))
        decision, timeline = await decide(workers)
        assert timeline == ["start", "end", "call"]
        assert decision.arm == SPEC.arms[arms[0]]


async def convert_one(workers: Workers) -> None:
    decision = await workers.second.choose(SPEC.id)
    event = {"type": "conversion", "decision_id": decision.decision_id, "occurred_at": format_time(workers.now)}
    assert (await workers.second.feedback([event])).accepted == 1


async def fresh_read(workers: Workers) -> None:
    """The worker's store reads the state anew, as its refresh of an expired histogram read does."""
    workers.now += int(INTERVAL * MICROS) // 10
    await workers.first.store.snapshot(await workers.first.campaign(SPEC.id), 0.0)


async def new_version(workers: Workers) -> None:
    await workers.first.change_policy(SPEC.id, PolicyChange(policy={"name": "patient-bandits", "params": {"kappa": 2}}))


async def other_decision(workers: Workers) -> None:
    await workers.second.choose(SPEC.id)


@pytest.mark.parametrize(
    ("meanwhile", "kept"), [(other_decision, True), (convert_one, True), (fresh_read, False), (new_version, False)]
)
async def test_a_choice_serves_only_the_statistics_version_it_was_made_for(
    workers: Workers,
    monkeypatch: pytest.MonkeyPatch,
    meanwhile: Callable[[Workers], Awaitable[None]],
    kept: bool,
) -> None:
    """What the worker's view does not see yet (another worker's decision, a conversion) keeps the choice, as
    it keeps the view the request reads; a new histogram read or policy version discards it, and the request
    calls the policy itself."""
    campaign = await past_the_opening(workers)
    observe_policy(campaign, workers.timeline, monkeypatch)
    await meanwhile(workers)
    _, timeline = await decide(workers)
    assert timeline[0] == ("start" if kept else "call")


async def test_a_reply_with_other_writes_has_the_next_choice_made_from_them(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record's reply that brings another worker's decision and a conversion (the whole counters) has the
    next choice made from those counters, not from the ones the worker sent."""
    campaign = await past_the_opening(workers)
    observe_policy(campaign, workers.timeline, monkeypatch)
    await other_decision(workers)
    await convert_one(workers)
    _, timeline = await decide(workers)
    assert timeline == ["start", "end", "call"]
    assert_same_stats(workers.timeline.calls()[-1][1], held_stats(workers, campaign))
    assert workers.timeline.calls()[-1][1].pulls.sum() == 3 + 3  # the opening, two of the other worker's, this


async def test_decisions_that_go_together_make_one_call(workers: Workers, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first of three simultaneous decisions goes alone, the two others together once it is recorded:
    nothing is predicted for them while they wait, so the only policy call is the batch's, in its request."""
    campaign = await past_the_opening(workers)
    observe_policy(campaign, workers.timeline, monkeypatch)
    mark = len(workers.timeline.events)
    decisions = await asyncio.gather(*(workers.first.choose(SPEC.id) for _ in range(3)))
    await asyncio.sleep(0)
    assert len({decision.decision_id for decision in decisions}) == 3
    assert workers.timeline.since(mark) == ["start", "end", "call", "start", "end"]


async def standing_campaign(workers: Workers, monkeypatch: pytest.MonkeyPatch, policy: str = "ucb1") -> Campaign:
    await workers.first.create_campaign(
        CampaignSpec(**{**SPEC.model_dump(), "id": "standing", "policy": {"name": policy}})
    )
    campaign = await past_the_opening(workers, "standing")
    observe_policy(campaign, workers.timeline, monkeypatch)
    return campaign


async def test_a_standing_law_is_renewed_once_the_decision_that_used_it_up_is_answered(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standing law serves GROUP_LIMIT decisions; the decision that uses it up has the next one computed
    once it is answered, from the statistics the worker holds then: no request past the opening computes a
    law or calls the policy. A new histogram read is renewed in the request that reads it (its Ñ may fold
    matured cells: I/O)."""
    campaign = await standing_campaign(workers, monkeypatch)
    renewed = 0
    for _ in range(2 * GROUP_LIMIT + 1):
        _, timeline = await decide(workers, "standing")
        assert timeline[0] == "start" and "call" not in timeline
        if "standing" in timeline:
            renewed += 1
            assert timeline == ["start", "end", "standing"]
            assert_same_stats(workers.timeline.calls()[-1][1], held_stats(workers, campaign))
    assert renewed == 2
    workers.now += 2 * int(INTERVAL * MICROS)  # the histogram read expires
    await workers.first.store.snapshot(campaign, 0.0)  # and is read again, as a request's refresh does
    _, timeline = await decide(workers, "standing")
    assert timeline[0] == "standing"


async def test_a_policy_without_a_standing_law_has_its_choice_made_ahead(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """qpm-d stands but its law is always nan: like a policy that does not stand, its next choice is drawn
    once each decision is answered, and no request calls the policy."""
    await standing_campaign(workers, monkeypatch, "qpm-d")
    for _ in range(10):
        _, timeline = await decide(workers, "standing")
        assert timeline == ["start", "end", "standing", "call"]
