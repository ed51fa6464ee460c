"""PreparedChoice.serves (engine/prepared.py): a prepared choice serves one decision taken from exactly the
campaign object and histogram reads it was computed from and counters of the same values (a record's reply
builds new ones), and nothing else: another campaign object, histogram or delay histogram, equal in value or
not, counters that differ in any count, or a batch of decisions."""

from __future__ import annotations

import asyncio
import copy
import dataclasses

import numpy as np
import pytest

from latebandit.engine.prepared import PreparedChoice
from latebandit.store.base import StateSnapshot
from tests.unit.test_standing import campaign, snapshot


def prepared() -> tuple[PreparedChoice, StateSnapshot]:
    state = dataclasses.replace(snapshot([1.0, 2.0, 3.0, 4.0]), delays=np.zeros((4, 4), dtype=np.int64))
    return PreparedChoice(campaign(), state, 1, 1.0), state


def test_it_serves_a_lone_decision_from_the_same_objects() -> None:
    choice, state = prepared()
    same = StateSnapshot(state.counters, state.histogram, state.delays)  # a store's new snapshot of its held read
    assert choice.serves(choice.campaign, same, 1)
    assert not choice.serves(choice.campaign, same, 2)


@pytest.mark.parametrize("changed", ["campaign", "histogram", "delays"])
def test_an_equal_copy_of_the_campaign_or_a_read_is_not_the_same_statistics(changed: str) -> None:
    choice, state = prepared()
    current = choice.campaign.model_copy() if changed == "campaign" else choice.campaign
    if changed != "campaign":
        state = dataclasses.replace(state, **{changed: copy.deepcopy(getattr(state, changed))})
    assert not choice.serves(current, state, 1)


def test_counters_serve_by_value() -> None:
    choice, state = prepared()
    copied = dataclasses.replace(state, counters=copy.deepcopy(state.counters))
    assert choice.serves(choice.campaign, copied, 1)
    counters = state.counters
    changes = {"decisions": counters.decisions + 1, "pulls": counters.pulls + 1,
               "conversions": counters.conversions + 0.5, "matured": counters.matured + 1}  # fmt: skip
    for field, changed in changes.items():
        other = dataclasses.replace(state, counters=dataclasses.replace(counters, **{field: changed}))
        assert not choice.serves(choice.campaign, other, 1), field


async def test_the_embedded_store_prepares_nothing_it_could_not_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded store builds a decision's statistics anew each time, so no prepared choice would serve
    one: a non-standing policy's lone decisions call it once each, in the request, and nothing more."""
    from latebandit.campaign import CampaignSpec
    from latebandit.engine.core import DecisionEngine, EngineOptions
    from latebandit.store.memory import MemoryStore
    from latebandit.tokens import TokenSigner

    now = 1_800_000_000_000_000
    engine = DecisionEngine(MemoryStore(clock=lambda: now), TokenSigner("embedded"), lambda: now,
                            np.random.default_rng(0), EngineOptions())  # fmt: skip
    await engine.create_campaign(CampaignSpec(id="p", arms=["a", "b", "c"], policy={"name": "patient-bandits"}))
    calls: list[int] = []
    policy_call = engine._policy_call
    monkeypatch.setattr(engine, "_policy_call", lambda *args: calls.append(1) or policy_call(*args))
    for _ in range(20):
        await engine.choose("p")
        await asyncio.sleep(0)
    assert len(calls) == 20 and not engine._prepared
