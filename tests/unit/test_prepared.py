"""PreparedChoice.serves (engine/prepared.py): a prepared choice serves one decision taken from exactly the
objects it was computed from, and nothing else: another campaign object, counters, histogram or delay
histogram, equal in value or not, or a batch of decisions."""

from __future__ import annotations

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


@pytest.mark.parametrize("changed", ["campaign", "counters", "histogram", "delays"])
def test_an_equal_copy_of_any_input_is_not_the_same_statistics(changed: str) -> None:
    choice, state = prepared()
    current = choice.campaign.model_copy() if changed == "campaign" else choice.campaign
    if changed != "campaign":
        state = dataclasses.replace(state, **{changed: copy.deepcopy(getattr(state, changed))})
    assert not choice.serves(current, state, 1)
