"""A non-standing policy's next choice, prepared while a lone decision is recorded or once it is answered
(engine/prepared.py), on real Redis: it is what the policy computes from the statistics the next decision
reads, with the uniforms the engine's generator held when it was prepared; the next request then draws
nothing. A new histogram read or a new policy version discards it (the request calls the policy itself);
what the worker's view does not see yet (another worker's decision, a conversion) keeps it, as it keeps the
view the request would read. A standing policy's used-up standing choice is renewed the same way."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import pytest

from latebandit.campaign import Campaign, CampaignSpec, PolicyChange
from latebandit.delays.exposure import exposure
from latebandit.engine.core import GROUP_LIMIT, DecisionEngine, EngineOptions
from latebandit.engine.describe import arm_stats
from latebandit.store.base import StateSnapshot
from latebandit.store.redis import RedisStore
from latebandit.timeutil import MICROS, format_time
from latebandit.tokens import TokenSigner
from tests.integration.test_store_contract import T0

pytestmark = pytest.mark.redis

SECRET = "prepared-choice-test-secret-0123456789abcdef"
INTERVAL = 1.0  # seconds a histogram read is reused (EngineOptions.snapshot_interval)
SPEC = CampaignSpec(id="patient", arms=["a", "b", "c"], policy={"name": "patient-bandits"}, window=3600.0)


class ObservedEngine(DecisionEngine):
    """Notes where its generator stood when it began preparing the choice it keeps: a request's own draws end
    there (a choice is prepared while the request's decision is recorded, inside the request's ``choose``)."""

    rng_at_prepare: dict | None = None

    def _prepare_next(self, key: tuple[str, int], campaign: Campaign, state: StateSnapshot) -> None:
        before, kept = copy.deepcopy(self.rng.bit_generator.state), self._prepared.get(campaign.id)
        super()._prepare_next(key, campaign, state)
        if self._prepared.get(campaign.id) is not kept:
            self.rng_at_prepare = before


class Workers:
    def __init__(self, redis_url: str, prefix: str) -> None:
        self.now = T0
        self.stores = [RedisStore(redis_url, prefix, clock=self.clock) for _ in range(2)]
        options = EngineOptions(snapshot_interval=INTERVAL)
        self.first, self.second = (
            ObservedEngine(store, TokenSigner(SECRET), self.clock, np.random.default_rng(seed), options)
            for seed, store in enumerate(self.stores)
        )

    def clock(self) -> int:
        return self.now


@pytest.fixture
async def workers(redis_url: str, redis_prefix: str) -> AsyncIterator[Workers]:
    deployment = Workers(redis_url, redis_prefix)
    await deployment.first.create_campaign(SPEC)
    yield deployment
    for store in deployment.stores:
        await store.close()


def expected_choice(engine: DecisionEngine, campaign: Campaign, rng: np.random.Generator) -> tuple[str, float]:
    """The policy's choice from the statistics the engine's store holds now, computed here from the store's
    snapshot with the module functions (the clock stands still, so Ñ is the histogram read's)."""
    state = engine.store.held(campaign, INTERVAL)
    assert state is not None
    choice = campaign.policy_impl.choose_together(arm_stats(state, exposure(campaign, state, T0)), 1, rng)
    return campaign.arms[int(choice.arm[0])], float(choice.propensity[0])


def uniforms_between(before: dict, after: dict) -> int:
    """How many uniforms a generator drew to go from state ``before`` to ``after``."""
    probe = np.random.Generator(np.random.PCG64())
    probe.bit_generator.state = before
    for drawn in range(16):
        if probe.bit_generator.state == after:
            return drawn
        probe.random()
    raise AssertionError("more than 15 uniforms drawn")


def generator_at(state: dict) -> np.random.Generator:
    generator = np.random.Generator(np.random.PCG64())
    generator.bit_generator.state = state
    return generator


async def decide_drawing(engine: ObservedEngine, campaign_id: str = SPEC.id) -> tuple[tuple[str, float], int]:
    """A decision, and how many uniforms the request itself drew before a next choice was prepared: 0 from a
    prepared choice, 1 from a standing one, K (one per arm) from the argmax policy's own call."""
    before = copy.deepcopy(engine.rng.bit_generator.state)
    engine.rng_at_prepare = None
    decision = await engine.choose(campaign_id)
    end = engine.rng_at_prepare or engine.rng.bit_generator.state
    return (decision.arm, decision.propensity), uniforms_between(before, end)


async def past_the_opening(engine: DecisionEngine, campaign_id: str = SPEC.id) -> None:
    for _ in SPEC.arms:
        await engine.choose(campaign_id)


async def test_the_next_choice_is_the_policys_own_prepared_while_the_decision_is_recorded(workers: Workers) -> None:
    """The choice prepared while the previous decision was recorded is the policy's own from the statistics the
    store holds once that decision is answered, with the uniforms the generator held when it was prepared."""
    engine = workers.first
    await past_the_opening(engine)
    for _ in range(30):
        campaign = await engine.campaign(SPEC.id)
        await asyncio.sleep(0)  # the answered decision's check: what was prepared meanwhile serves
        assert engine.rng_at_prepare is not None
        expected = expected_choice(engine, campaign, generator_at(engine.rng_at_prepare))
        assert await decide_drawing(engine) == (expected, 0)


async def convert_one(workers: Workers) -> None:
    decision = await workers.second.choose(SPEC.id)
    event = {"type": "conversion", "decision_id": decision.decision_id, "occurred_at": format_time(workers.now)}
    assert (await workers.first.feedback([event])).accepted == 1


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
async def test_a_prepared_choice_serves_only_the_statistics_it_was_computed_from(
    workers: Workers, meanwhile: Callable[[Workers], Awaitable[None]], kept: bool
) -> None:
    await past_the_opening(workers.first)
    await workers.first.choose(SPEC.id)
    await asyncio.sleep(0)
    await meanwhile(workers)
    await asyncio.sleep(0)
    _, drawn = await decide_drawing(workers.first)
    assert drawn == (0 if kept else len(SPEC.arms))
    await asyncio.sleep(0)
    _, drawn = await decide_drawing(workers.first)  # and the next one is prepared again
    assert drawn == 0


async def test_the_choice_is_prepared_during_the_record_and_kept_after_the_answer(workers: Workers) -> None:
    """The next choice exists when ``choose`` returns, before the loop has run anything else (so it was made
    while the decision was recorded), and the check after the answer keeps that very choice: it was computed
    from the counters the reply brought."""
    engine = workers.first
    await past_the_opening(engine)
    for _ in range(10):
        await engine.choose(SPEC.id)
        during = engine._prepared.get(SPEC.id)
        assert during is not None
        await asyncio.sleep(0)  # the answer's check
        assert engine._prepared.get(SPEC.id) is during


async def test_a_reply_with_another_workers_decision_leaves_the_preparation_to_the_answer(workers: Workers) -> None:
    """Where a record's reply brings another worker's decision, the choice prepared during the record (from
    counters that lacked it) does not serve: it is made ready again once the decision is answered, and the
    next decisions prepare theirs after their answer until a reply holds no other writer's decision."""
    engine = workers.first
    await past_the_opening(engine)
    await other_decision(workers)
    _, drawn = await decide_drawing(engine)  # the choice prepared before the other decision: the view lacks it
    assert drawn == 0
    await asyncio.sleep(0)
    assert engine._predictable[SPEC.id] is False
    _, drawn = await decide_drawing(engine)  # prepared after the previous answer, from the counters it brought
    assert drawn == 0
    assert SPEC.id not in engine._prepared  # nothing during this record: it waits for the answer
    await asyncio.sleep(0)
    assert engine._predictable[SPEC.id] is True and SPEC.id in engine._prepared
    await engine.choose(SPEC.id)
    assert SPEC.id in engine._prepared  # a quiet reply: the next one is prepared during the record again


async def test_nothing_is_prepared_for_decisions_that_go_together(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first of three simultaneous decisions goes alone, the two others together once it is recorded: its
    record's preparation finds them waiting and prepares nothing (a batch computes its own rows), so the only
    policy call is the batch's."""
    engine = workers.first
    await past_the_opening(engine)
    await asyncio.sleep(0)
    calls: list[int] = []
    policy_call = engine._policy_call
    monkeypatch.setattr(engine, "_policy_call", lambda *args: calls.append(1) or policy_call(*args))
    decisions = await asyncio.gather(*(engine.choose(SPEC.id) for _ in range(3)))
    assert len({decision.decision_id for decision in decisions}) == 3  # the first alone, two together
    await asyncio.sleep(0)
    assert len(calls) == 1
    _, drawn = await decide_drawing(engine)
    assert drawn == len(SPEC.arms)


async def standing_campaign(engine: DecisionEngine, policy: str = "ucb1") -> Campaign:
    """A campaign of ``policy`` past its opening, its last opening decision's callback run."""
    await engine.create_campaign(CampaignSpec(**{**SPEC.model_dump(), "id": "standing", "policy": {"name": policy}}))
    await past_the_opening(engine, "standing")
    await asyncio.sleep(0)
    return await engine.campaign("standing")


def refuse_policy_calls(engine: DecisionEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request that computes the statistics for a policy call (``_stats``) fails the test."""

    async def refused(*args: object) -> object:
        raise AssertionError("a request computed the statistics for a policy call")

    monkeypatch.setattr(engine, "_stats", refused)


async def test_a_standing_policy_keeps_drawing_from_its_standing_choice(workers: Workers) -> None:
    """No choice is prepared for a policy with a standing law: past its opening each decision is one uniform
    drawn from that law (engine/standing.py), never a prepared choice."""
    engine = workers.first
    await standing_campaign(engine)
    for _ in range(10):
        _, drawn = await decide_drawing(engine, "standing")
        assert drawn == 1
        await asyncio.sleep(0)


async def test_a_used_up_standing_choice_is_renewed_between_requests(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standing choice serves GROUP_LIMIT decisions; the decision that uses it up has the next one computed
    while it is recorded, from the statistics the next request reads: no request past the opening calls the
    policy, each draws one uniform from a standing law, and that law is the policy's own for the held
    statistics, computed here independently."""
    engine = workers.first
    campaign = await standing_campaign(engine)
    renewals: list[int] = []
    policy_class = type(campaign.policy_impl)
    standing = policy_class.standing
    monkeypatch.setattr(policy_class, "standing", lambda self, stats: renewals.append(1) or standing(self, stats))
    in_request = engine._stats
    refuse_policy_calls(engine, monkeypatch)
    for decision in range(1, 2 * GROUP_LIMIT + 2):
        if decision % GROUP_LIMIT == 1 and decision > 1:  # the law renewed after the previous answer
            state = engine.store.held(campaign, INTERVAL)
            assert state is not None
            law = standing(campaign.policy_impl, arm_stats(state, exposure(campaign, state, T0)))[0]
        (arm, propensity), drawn = await decide_drawing(engine, "standing")
        assert drawn == 1
        if decision > GROUP_LIMIT:
            assert propensity == law[SPEC.arms.index(arm)] > 0
        await asyncio.sleep(0)
    assert len(renewals) == 2  # after the 64th and the 128th standing draw
    monkeypatch.setattr(engine, "_stats", in_request)
    workers.now += int(INTERVAL * MICROS) * 2  # the histogram read expires
    await engine.store.snapshot(campaign, 0.0)  # and is read again, as a request's refresh does
    _, drawn = await decide_drawing(engine, "standing")
    assert drawn == 1
    assert len(renewals) == 3  # the first request on the new read computes its Ñ (I/O to fold) and renews


async def test_nothing_is_made_ready_while_a_decision_is_being_recorded(workers: Workers) -> None:
    """An earlier decision's check after its answer can run while another decision of the campaign waits for
    its record: it then leaves the choices alone, since that pull is not in the counters it holds; the
    decision being recorded makes the next one ready itself (its standing choice renewed)."""
    engine = workers.first
    campaign = await standing_campaign(engine)
    key = (campaign.id, campaign.version)
    before = engine.store.held(campaign, INTERVAL)
    assert before is not None
    engine._standing[campaign.id].remaining = 1
    recording = asyncio.create_task(engine.choose("standing"))
    while not engine._decisions.busy(key):
        await asyncio.sleep(0)
    standing = engine._standing[campaign.id]
    engine._prepare_after(key, campaign, before)
    assert engine._standing[campaign.id] is standing and campaign.id not in engine._prepared
    await recording
    await asyncio.sleep(0)
    assert engine._standing[campaign.id].remaining == GROUP_LIMIT


async def test_a_policy_without_a_standing_law_has_its_choice_prepared(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """qpm-d stands but its law is always nan (engine/standing.py): like a policy that does not stand, its
    next choice is prepared after each lone answer, and no request calls the policy."""
    engine = workers.first
    await standing_campaign(engine, "qpm-d")
    refuse_policy_calls(engine, monkeypatch)
    for _ in range(10):
        await decide_drawing(engine, "standing")
        await asyncio.sleep(0)
