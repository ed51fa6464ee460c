"""A campaign's next choice (engine/choosing.py): a standing law or a drawn choice, which serves only
statistics of the StateVersion it was computed from, and the Chooser that keeps it, on the embedded store."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from latebandit.campaign import Campaign, CampaignSpec
from latebandit.engine.choosing import NextChoice
from latebandit.engine.core import DecisionEngine, EngineOptions
from latebandit.policies.base import ArmStats, Choice
from latebandit.policies.floor import with_floor
from latebandit.store.base import StateVersion
from latebandit.store.memory import MemoryStore
from latebandit.tokens import TokenSigner

BASIS = StateVersion(policy=1, read=7, stamp=b"3", decisions=10)


def campaign(floor: float = 0.0) -> Campaign:
    return Campaign(id="c", arms=["a", "b", "c", "d"], policy={"name": "delayed-klucb", "params": {}},
                    delay={"family": "exponential", "mean": 60}, window=3600, exploration_floor=floor)  # fmt: skip


def with_floor_law(law: np.ndarray, floor: float) -> np.ndarray:
    """The floored law, from ``with_floor`` itself: each arm's logged propensity when it is drawn."""
    choice = Choice(np.arange(4), law, np.repeat(law[None, :], 4, axis=0))
    floored = with_floor(choice, floor, np.random.default_rng(0))
    assert floored.probabilities is not None
    return floored.probabilities[0]


@pytest.mark.parametrize("floor", [0.0, 0.1])
def test_a_standing_laws_draws_follow_it_with_the_floor_mixed_in(floor: float) -> None:
    """Arm frequencies over many draws match the mixture ``with_floor`` draws from, and each draw's
    propensity is that mixture's probability of its arm (an arm of probability 0 is never drawn)."""
    law = np.array([0.5, 0.0, 0.5, 0.0])
    standing = NextChoice.standing(campaign(floor), BASIS, law, 10**6)
    assert standing is not None
    draws = standing.draw(40_000, np.random.default_rng(23))
    expected = with_floor_law(law, floor)
    counts = np.bincount([arm for arm, _ in draws], minlength=4) / len(draws)
    assert np.all(np.abs(counts - expected) <= 4 * np.sqrt(expected * (1 - expected) / len(draws)))
    assert all(propensity == pytest.approx(expected[arm]) for arm, propensity in draws)
    if floor == 0:
        assert counts[1] == counts[3] == 0


def test_a_standing_law_serves_its_read_and_stamp_for_at_most_its_limit() -> None:
    standing = NextChoice.standing(campaign(), BASIS, np.array([0.25] * 4), 5)
    assert standing is not None
    assert standing.serves(BASIS, 5)
    standing.draw(3, np.random.default_rng(24))
    assert standing.serves(BASIS, 2) and not standing.serves(BASIS, 3)  # its limit, in decisions
    assert standing.serves(StateVersion(1, 7, b"3", 11), 1)  # more pulls and rounds: the staleness of a batch
    assert not standing.serves(StateVersion(1, 7, b"4", 10), 1)  # a counted conversion or a fold: a new stamp
    assert not standing.serves(StateVersion(1, 8, b"3", 10), 1)  # another histogram read (Ñ)
    assert not standing.serves(StateVersion(2, 7, b"3", 10), 1)  # another policy version
    assert not standing.serves(None, 1)  # statistics no store vouches for


def test_no_standing_law_from_a_nan_row() -> None:
    assert NextChoice.standing(campaign(), BASIS, np.full(4, math.nan), 64) is None


def test_a_drawn_choice_serves_one_decision_at_exactly_its_version() -> None:
    drawn = NextChoice.drawn(BASIS, 2, 0.75)
    assert drawn.serves(StateVersion(1, 7, b"3", 10), 1)  # equal by value, not by identity
    assert not drawn.serves(BASIS, 2)
    for other in (StateVersion(1, 7, b"3", 11), StateVersion(1, 7, b"4", 10), StateVersion(1, 8, b"3", 10)):
        assert not drawn.serves(other, 1)
    assert drawn.draw(1, np.random.default_rng(0)) == [(2, 0.75)]
    assert not drawn.serves(BASIS, 1)  # used


async def test_the_embedded_store_makes_nothing_ready_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded store holds no statistics between decisions (each snapshot is built anew), so nothing is
    made ready after an answer: a non-standing policy is called by each request, from the statistics it
    read, exactly once."""
    now = 1_800_000_000_000_000
    store = MemoryStore(clock=lambda: now)
    engine = DecisionEngine(store, TokenSigner("embedded-secret-0123456789abcdef"), lambda: now,
                            np.random.default_rng(0), EngineOptions())  # fmt: skip
    created = await engine.create_campaign(
        CampaignSpec(id="p", arms=["a", "b", "c"], policy={"name": "patient-bandits"})
    )
    policy_class = type(created.policy_impl)
    seen: list[int] = []
    choose_together = policy_class.choose_together

    def counting(self: object, stats: ArmStats, decisions: int, rng: np.random.Generator) -> Choice:
        seen.append(int(stats.pulls.sum()))
        return choose_together(self, stats, decisions, rng)  # type: ignore[arg-type]

    monkeypatch.setattr(policy_class, "choose_together", counting)
    for _ in range(20):
        await engine.choose("p")
        await asyncio.sleep(0)  # the loop runs what the decision scheduled, as a server's does while it answers
    assert seen == list(range(20))  # each request's own call, with the decisions before it counted
