"""The contract of the policies that learn from anonymous sums: they play arms in scheduled segments.

ODAAF (Pike-Burke et al. 2018), ARS-UCB, ARS-EXP3 and CLW (Wang et al. 2021) never see which decision a
reward came from, only the reward observed while an arm was being played. So they commit to a plan of
segments (an arm for a number of consecutive slots) and learn from the sum observed during each segment.

A plan is computed by ``plan(state, closed, open_, rng)``, a pure function: the policy's own JSON state,
the segments whose feedback is complete since the last plan (``closed``, in play order), the segments still
waiting for late feedback (``open_``, provisional sums) and the caller's generator. It returns the
segments to play next, the ``hold`` segment played when the plan has run out before the next plan is in
place, when that next plan may be made, and the new state. The simulator calls it per run; the service
calls it when a campaign's plan runs out, and commits the result atomically in the store (one plan per
version, so API replicas never disagree on which arm a slot belongs to).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np

from latebandit.delays.models import DelayModel
from latebandit.policies.base import ArmStats, Choice, Param, Policy

State = dict[str, Any]  # JSON-serialisable: it is stored in Redis and in the audit log


class Next(StrEnum):
    """When the plan after this one may be made."""

    PLAYED = "played"  # as soon as the segments have been played
    CLOSED = "closed"  # once they have been played and their feedback is complete (watermark or lateness)
    NEVER = "never"  # this plan's hold is played for good


@dataclass(frozen=True)
class Segment:
    """``slots`` consecutive slots of one arm. ``counted``: the sum observed during it is evidence about
    the arm; otherwise it is discarded (a bridge, a hold, CLW's block head). ``propensity``: the probability
    the policy had of choosing this arm for the segment (1 for a deterministic schedule)."""

    arm: int
    slots: int
    counted: bool = True
    propensity: float = 1.0
    kind: str = "block"
    epoch: int = 0  # the doubling epoch it belongs to: a restarted learner ignores older segments

    def to_json(self) -> dict[str, Any]:
        return {
            "arm": self.arm, "slots": self.slots, "counted": self.counted, "p": self.propensity,
            "kind": self.kind, "epoch": self.epoch,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Segment:
        return cls(
            int(data["arm"]), int(data["slots"]), bool(data["counted"]), float(data["p"]), str(data["kind"]),
            int(data["epoch"]),
        )  # fmt: skip


@dataclass(frozen=True)
class Observed:
    """A segment as played: the slots it really lasted (a hold lasts as long as the wait) and the reward
    observed (event time) while it was played."""

    segment: Segment
    slots: int
    reward: float


@dataclass(frozen=True)
class Plan:
    segments: tuple[Segment, ...]
    hold: Segment
    next: Next
    state: State = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "segments": [segment.to_json() for segment in self.segments],
            "hold": self.hold.to_json(),
            "next": self.next.value,
            "state": self.state,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        segments = tuple(Segment.from_json(item) for item in data["segments"])
        return cls(segments, Segment.from_json(data["hold"]), Next(data["next"]), dict(data["state"]))


def leader(reward: np.ndarray, slots: np.ndarray, among: Sequence[int]) -> int:
    """The arm of ``among`` with the highest mean reward per slot (the first on ties; unplayed arms last)."""
    means = [reward[arm] / slots[arm] if slots[arm] > 0 else -math.inf for arm in among]
    return int(among[int(np.argmax(means))])


class SchedulePolicy(Policy):
    """A policy that plays planned segments and learns from the anonymous sums observed during them.

    ``horizon`` (slots) is the T of the papers' analyses; 0 means unknown, and the policies that need a
    horizon then double it, T_ℓ = ``first_epoch``·2^ℓ (each policy documents how: ODAAF keeps what it
    learned, the others start afresh in each epoch). ``reward_cap`` divides every reported value before
    the policy sees it (the papers need the reward of one slot in [0, 1]; a wall-clock slot serving many
    users can earn more).
    """

    feedback: ClassVar[str] = "anonymous"
    BASE_PARAMS: ClassVar[Mapping[str, Param]] = {
        "horizon": Param(int, 0, 0),
        "reward_cap": Param(float, 1.0, 1e-12),
        "first_epoch": Param(int, 1024, 16),
    }

    @classmethod
    def declared_defaults(
        cls, params: Mapping[str, Any], delays: Sequence[DelayModel], per_slot: float | None
    ) -> dict[str, Any]:
        """``params`` with the defaults this policy derives from the declared delay model of each arm
        (``per_slot`` model units make one slot; None when slots have no fixed length): none here."""
        return dict(params)

    @abstractmethod
    def plan(
        self, state: State | None, closed: Sequence[Observed], open_: Sequence[Observed], rng: np.random.Generator
    ) -> Plan:
        """The next plan. ``state`` is None for the first plan of a campaign."""

    def cannot_learn(self) -> str | None:
        """Why this policy, with these parameters, could not learn from its sums (a campaign is refused
        with it), or None."""
        return None

    def choose(self, stats: ArmStats, rng: np.random.Generator) -> Choice:
        raise TypeError(f"policy {self.name!r} plays planned segments: use plan(), not choose()")

    def arm_sums(self, observed: Sequence[Observed]) -> tuple[np.ndarray, np.ndarray]:
        """(slots, reward / reward_cap) per arm over the counted segments of ``observed``."""
        slots, reward = np.zeros(self.n_arms), np.zeros(self.n_arms)
        for item in observed:
            if item.segment.counted:
                slots[item.segment.arm] += item.slots
                reward[item.segment.arm] += item.reward
        return slots, reward / self._params["reward_cap"]

    def epoch_horizon(self, epoch: int) -> int:
        """The horizon of doubling epoch ``epoch`` (0-based), or the given horizon."""
        given = self._int_param("horizon")
        return given if given else self._int_param("first_epoch") << epoch
