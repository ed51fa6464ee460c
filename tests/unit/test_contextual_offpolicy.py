"""The contextual evaluation (replay/contextual.py) on hand-written logs: what the evaluated policy is shown,
and when (a conversion once the service received it, and only within the window; a decision only where the
policy agreed with the log), and the logs and policies it refuses."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest

from latebandit.policies.linear import Array, ContextualPolicy, LinearChoice, LinearStats
from latebandit.replay.contextual import evaluate_contextual, read_contextual_log, replay_offers
from latebandit.replay.evaluate import evaluate
from latebandit.replay.logged import NotEvaluable, read_campaign_log
from latebandit.timeutil import MICROS, format_time


class Spy(ContextualPolicy):
    """Always the first action (or arm); keeps what it was shown at every decision."""

    name: ClassVar[str] = "spy"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[LinearStats] = []

    def ridge(self) -> float:
        return 1.0

    def _first(self, stats: LinearStats) -> LinearChoice:
        self.seen.append(stats)
        return LinearChoice(np.zeros(1, dtype=np.int64), np.ones(1), np.zeros(1))

    def choose(self, stats: LinearStats, actions: Array, rng: np.random.Generator) -> LinearChoice:
        return self._first(stats)

    def choose_arm(self, stats: LinearStats, context: Array, rng: np.random.Generator) -> LinearChoice:
        return self._first(stats)


def time(seconds: float) -> str:
    return format_time(round(seconds * MICROS))


def campaign_line(**extra: Any) -> dict[str, Any]:
    """An actions campaign's creation line as exported (its one model block named as its arm), unless
    ``extra`` gives arms."""
    return {"type": "campaign", "id": "c", "policy": {"name": "linucb", "params": {}}, "features": 1,
            "window": 30, "created_at": time(0), "arms": ["actions"], "offers": "actions",
            **extra}  # fmt: skip


def arms_campaign(**extra: Any) -> dict[str, Any]:
    return campaign_line(arms=["a", "b"], offers="context", **extra)


def decision(n: int, arm: str, at: float, features: list[float], **extra: Any) -> dict[str, Any]:
    return {"type": "decision", "campaign": "c", "decision_id": f"d{n}", "arm": arm, "at": time(at),
            "propensity": 0.5, "features": features, "footprint": 0.0, **extra}  # fmt: skip


def conversion(n: int, occurred: float, received: float) -> dict[str, Any]:
    return {"type": "conversion", "campaign": "c", "decision_id": f"d{n}", "event_id": f"e{n}",
            "occurred_at": time(occurred), "received_at": time(received)}  # fmt: skip


def offered(*rows: tuple[str, float]) -> list[dict[str, Any]]:
    return [{"id": label, "features": [value]} for label, value in rows]


def test_a_conversion_reaches_the_policy_when_received_and_only_within_the_window() -> None:
    lines = [
        arms_campaign(),
        decision(1, "a", 1, [1.0]),
        conversion(1, 11, 41),  # 10 s after its decision: counts, but from 41 s on
        decision(2, "a", 21, [1.0]),
        decision(3, "a", 45, [1.0]),
        conversion(2, 61, 62),  # 40 s after its decision: after the 30 s window, never counts
        decision(4, "a", 70, [1.0]),
        decision(5, "a", 200, [1.0]),
    ]
    spy = Spy()
    played = replay_offers(read_contextual_log(lines, None, None), spy, 100.0, np.random.default_rng(0))
    assert played.accepted.all()  # μ = 1/2 everywhere: M = 2 accepts every agreement
    assert [float(stats.reward[0, 0]) for stats in spy.seen] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert [stats.decisions.tolist() for stats in spy.seen] == [[0, 0], [1, 0], [2, 0], [3, 0], [4, 0]]
    assert [float(stats.gram[0, 0, 0]) for stats in spy.seen] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_only_the_decisions_the_policy_agrees_with_enter_its_statistics() -> None:
    lines = [
        campaign_line(log_actions=True),
        decision(1, "p", 1, [0.5], actions=offered(("p", 0.5), ("q", 0.8))),
        decision(2, "q", 2, [0.8], actions=offered(("p", 0.6), ("q", 0.8))),  # the spy takes p: rejected
        decision(3, "p", 3, [0.1], actions=offered(("p", 0.1))),
        decision(4, "p", 100, [0.1], actions=offered(("p", 0.1))),
    ]
    spy = Spy()
    log = read_contextual_log(lines, None, None)
    assert [offer.chosen for offer in log.offers] == [0, 1, 0, 0]
    played = replay_offers(log, spy, 100.0, np.random.default_rng(0))
    assert played.accepted.tolist() == [True, False, True, True]
    assert [float(stats.gram[0, 0, 0]) for stats in spy.seen] == pytest.approx([0.0, 0.25, 0.25, 0.26])


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        ([campaign_line(), decision(1, "p", 1, [0.5])], "set log_actions"),
        ([campaign_line(log_actions=True), decision(1, "r", 1, [0.5], actions=offered(("p", 0.5)))],
         "not among the actions"),
        ([campaign_line(log_actions=True), decision(1, "p", 1, [0.5], actions=[["p", 0.5]])], "list of"),
        ([arms_campaign(), decision(1, "a", 1, [0.5, 0.5])], "dimension 1"),
        ([arms_campaign(), decision(1, "c", 1, [0.5])], "unknown arm"),
        ([{**arms_campaign(), "policy": {"name": "ucb1"}, "features": None, "offers": None}, decision(1, "a", 1, [1])],
         "not contextual"),
    ],
)  # fmt: skip
def test_a_log_that_cannot_say_what_was_offered_is_refused(lines: list[dict[str, Any]], reason: str) -> None:
    with pytest.raises(NotEvaluable, match=reason):
        read_contextual_log(lines, None, None)


def test_contextual_and_arm_policies_stay_on_their_own_logs() -> None:
    contextual = [arms_campaign(), decision(1, "a", 1, [1.0]), decision(2, "b", 100, [1.0])]
    with pytest.raises(NotEvaluable, match="is contextual: evaluate a contextual policy"):
        read_campaign_log(contextual, None, None)
    log = read_contextual_log(contextual, None, None)
    with pytest.raises(NotEvaluable, match="contextual and policy 'ucb1' is not"):
        evaluate_contextual(log, "ucb1", {})
    with pytest.raises(NotEvaluable, match="unknown contextual policy 'nope'"):
        evaluate_contextual(log, "nope", {})
    with pytest.raises(NotEvaluable, match="correction 'cs'"):
        evaluate_contextual(log, "otf-linucb", {"correction": "cs"})
    arms = [{**arms_campaign(), "policy": {"name": "uniform"}, "features": None, "offers": None},
            decision(1, "a", 1, [1.0]), decision(2, "b", 100, [1.0])]  # fmt: skip
    with pytest.raises(NotEvaluable, match="'otf-linucb' is contextual, and campaign 'c' is not"):
        evaluate(read_campaign_log(arms, None, None), "otf-linucb", {})
