"""ODAAF, ODAAF-B and ODAAF-V of Pike-Burke, Agrawal, Szepesvári & Grünewälder (ICML 2018), as
their Algorithm 1: Improved-UCB in phases, each active arm played in one contiguous block per phase,
elimination on the anonymous sums observed during an arm's own blocks (cumulative over phases).

Phase m has tolerance Δ̃_m = 2^−m; every active arm reaches N_m = ⌈n_m⌉ credited slots (Q1), ν_m = N_m −
N_{m−1} new ones; arm j is eliminated when X̄_j + Δ̃_m < max X̄ (a tie survives, §7.9). n_m is §2.2–2.4,
with the delay facts in slots (E[τ] ``mean_delay``, d ``max_delay``, V ``delay_variance``).

Choices made here, where the paper leaves room:
- ODAAF-B and ODAAF-V play a bridge of ν_m slots on the *empirical leader* of the survivors (Q4: 25% less
  regret than the first active arm in a reference run); plain ODAAF has none (the paper's
  experiments). In the service the next phase starts only once the feedback of the phase's blocks is
  complete; until then the provisional leader is held (a discarded segment: a longer bridge is safe).
- Phasing stops when T·Δ̃_m² <= e (Q2) or one arm is left (Q6); the leader is then played to the horizon.
- With no horizon, doubling epochs T_ℓ = first_epoch·2^ℓ (Q7): each is a fresh ODAAF, preceded by a
  bridge of max(d, ⌈10·E[τ]⌉) slots on the previous leader so that old rewards do not land in its first
  block (10 mean delays: at most e^−10 of an exponential delay's mass leaks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from latebandit.policies.base import EPS_N, TIE_RTOL, ArmStats, Choice, Param, Policy, uniform_among
from latebandit.policies.schedule import Next, Observed, Plan, SchedulePolicy, Segment, State, leader

EPOCH_BRIDGE_MEANS = 10.0  # mean delays of bridge before a new doubling epoch


def tolerance(m: int) -> float:
    return 2.0**-m


def log_term(horizon: int, m: int) -> float:
    """L_m = ln(T·Δ̃_m²)."""
    return math.log(horizon * tolerance(m) ** 2)


def samples_needed(delta: float, log_t: float, bias: float) -> float:
    """The smallest n with Δ̃·n/2 >= sqrt(2nL) + (4/3)L + bias/2… in the closed form of §2.2:
    (1/Δ̃²)·(sqrt(2L) + sqrt(2L + (8/3)Δ̃L + Δ̃·bias))²."""
    return (math.sqrt(2 * log_t) + math.sqrt(2 * log_t + 8 / 3 * delta * log_t + delta * bias)) ** 2 / delta**2


class Odaaf(SchedulePolicy):
    """ODAAF (A1: E[τ] known): n_m with the accumulated bias 6·m·E[τ] (§2.2). No bridge."""

    name: ClassVar[str] = "odaaf"
    bridged: ClassVar[bool] = False
    PARAMS: ClassVar[Mapping[str, Param]] = {**SchedulePolicy.BASE_PARAMS, "mean_delay": Param(float, None, 0.0)}

    def n(self, m: int, horizon: int) -> float:
        """n_m of §2.2."""
        return samples_needed(tolerance(m), log_term(horizon, m), 6.0 * m * self._params["mean_delay"])

    def bridge_slots(self) -> int:
        """The bridge before a new doubling epoch."""
        longest = math.ceil(self._params.get("max_delay", 0.0))
        return max(longest, math.ceil(EPOCH_BRIDGE_MEANS * self._params["mean_delay"]), 1)

    def fresh(self, epoch: int) -> State:
        arms = self.n_arms
        return {"epoch": epoch, "m": 1, "active": list(range(arms)), "samples": 0, "nu": 0, "phase_open": False,
                "closed": 0, "slots": [0] * arms, "reward": [0.0] * arms}  # fmt: skip

    def plan(
        self, state: State | None, closed: Sequence[Observed], open_: Sequence[Observed], rng: np.random.Generator
    ) -> Plan:
        """Deterministic: ``rng`` is not used (the schedule is the same in every run, §5)."""
        if state is None:
            return self._next_phase(self.fresh(0), 0, [])
        state = self._fold(state, closed)
        played = state["closed"] + sum(item.slots for item in open_)
        prefix: list[Segment] = []
        if state["phase_open"]:
            state, prefix = self._eliminate(state)
        if not self._params["horizon"] and played >= self.epoch_horizon(state["epoch"]):
            fresh = self.fresh(state["epoch"] + 1)
            fresh["closed"] = state["closed"] - played  # slots still open belong to the epoch that ends
            bridge = Segment(self._leader(state, state["active"]), self.bridge_slots(), False, kind="bridge")
            return self._next_phase(fresh, 0, [bridge])
        return self._next_phase(state, played, prefix)

    def _fold(self, state: State, closed: Sequence[Observed]) -> State:
        slots, reward = self.arm_sums([item for item in closed if item.segment.kind == "block"])
        return {
            **state,
            "closed": state["closed"] + sum(item.slots for item in closed),
            "slots": (np.array(state["slots"]) + slots).tolist(),
            "reward": (np.array(state["reward"]) + reward).tolist(),
        }

    def _leader(self, state: State, among: Sequence[int]) -> int:
        return leader(np.array(state["reward"], dtype=float), np.array(state["slots"], dtype=float), among)

    def _eliminate(self, state: State) -> tuple[State, list[Segment]]:
        """Steps 2–4 at the end of phase m: eliminate, halve the tolerance, bridge on the leader."""
        m, active = state["m"], state["active"]
        slots, reward = np.array(state["slots"], dtype=float), np.array(state["reward"], dtype=float)
        means = reward[active] / np.maximum(slots[active], 1.0)
        survivors = [arm for arm, mean in zip(active, means, strict=True) if mean + tolerance(m) >= means.max()]
        bridge = [Segment(self._leader(state, survivors), state["nu"], False, kind="bridge")] if self.bridged else []
        return {**state, "m": m + 1, "active": survivors, "phase_open": False}, bridge

    def _next_phase(self, state: State, played: int, prefix: list[Segment]) -> Plan:
        """The blocks of phase m over the active arms in arm-id order (Q5), cut at the horizon (Q3)."""
        horizon = self.epoch_horizon(state["epoch"])
        m, active = state["m"], state["active"]
        room = horizon - played - sum(segment.slots for segment in prefix)
        if len(active) == 1 or horizon * tolerance(m) ** 2 <= math.e or room <= 0:
            return self._exploit(state, room, prefix)
        target = max(math.ceil(self.n(m, horizon)), state["samples"])
        nu = target - state["samples"]
        blocks = []
        for arm in active:
            if room > 0:
                blocks.append(Segment(arm, min(nu, room), True, kind="block"))
            room -= nu
        hold = Segment(self._leader(state, active), 1, False, kind="hold")
        state = {**state, "samples": target, "nu": nu, "phase_open": True}
        return Plan((*prefix, *blocks), hold, Next.CLOSED, state)

    def _exploit(self, state: State, room: int, prefix: list[Segment]) -> Plan:
        """The leader of the active arms to the end of the epoch (for good with a given horizon)."""
        best = Segment(self._leader(state, state["active"]), 1, False, kind="exploit")
        if self._params["horizon"]:
            return Plan(tuple(prefix), best, Next.NEVER, state)
        rest = Segment(best.arm, max(room, 1), False, kind="exploit")
        return Plan((*prefix, rest), best, Next.PLAYED, state)


class OdaafB(Odaaf):
    """ODAAF-B (A1 + A2: delays <= d): n_m = max(nB_m, m·min(d, n_m^ODAAF/m)) and a bridge (§2.3)."""

    name: ClassVar[str] = "odaaf-b"
    bridged: ClassVar[bool] = True
    PARAMS: ClassVar[Mapping[str, Param]] = {**Odaaf.PARAMS, "max_delay": Param(float, None, 0.0)}

    def n(self, m: int, horizon: int) -> float:
        delta, log_t = tolerance(m), log_term(horizon, m)
        bounded = samples_needed(delta, log_t, 4.0 * self._params["mean_delay"])
        return max(bounded, m * min(self._params["max_delay"], super().n(m, horizon) / m))


class OdaafV(Odaaf):
    """ODAAF-V (A1 + A3: Var(τ) known): bias 4·(E[τ] + 2V(τ)), and a bridge (§2.4)."""

    name: ClassVar[str] = "odaaf-v"
    bridged: ClassVar[bool] = True
    PARAMS: ClassVar[Mapping[str, Param]] = {**Odaaf.PARAMS, "delay_variance": Param(float, None, 0.0)}

    def n(self, m: int, horizon: int) -> float:
        facts = self._params
        return samples_needed(
            tolerance(m), log_term(horizon, m), 4.0 * (facts["mean_delay"] + 2.0 * facts["delay_variance"])
        )


class QpmD(Policy):
    """QPM-D of Joulani, György & Szepesvári (2013) with UCB1 as the base, the attributed baseline of
    Pike-Burke 2018 (§3). The base only learns a pull's reward once it is resolved, and while its
    recommended arm's reward is outstanding it keeps recommending it. We play the argmax of UCB1 over
    *all* resolved pulls: S/R + sqrt(2·ln t_b / R), R = pulls − pending, t_b = Σ R. The original feeds an
    arm's queued rewards only when the base asks for that arm, so its counts can lag R for the other arms:
    not the same algorithm, but the same regret within noise (58.4 ± 1.8 against 60.7 ± 1.6 over 60 runs,
    tests/integration/test_reproduce_anonymous.py). An arm with nothing resolved is the base's first try:
    the lowest index.

    A pull is resolved when its conversion arrives or, in the censored model, when its window ends
    (a non-conversion never reports; the paper's model, where every reward reports after its delay, is
    what the simulator's resolution feed gives). Ties go uniformly at random.
    """

    name: ClassVar[str] = "qpm-d"
    needs_pending: ClassVar[bool] = True

    def effective_pulls(self, stats: ArmStats) -> np.ndarray:
        if stats.pending is None:
            raise ValueError("qpm-d needs the pending pulls of each arm")
        return np.asarray(stats.pulls, dtype=np.float64) - np.asarray(stats.pending, dtype=np.float64)

    def index(self, stats: ArmStats) -> np.ndarray:
        resolved = self.effective_pulls(stats)
        fed = np.maximum(resolved.sum(axis=1, keepdims=True), 1.0)
        width = np.sqrt(2.0 * np.log(fed) / np.maximum(resolved, 1.0))
        return np.where(resolved > EPS_N, self.estimate(stats) + width, np.inf)

    def choose(self, stats: ArmStats, rng: np.random.Generator) -> Choice:
        index = self.index(stats)
        forced = np.isposinf(index)
        first_forced = forced & (np.cumsum(forced, axis=1) == 1)
        top = np.where(forced, -np.inf, index).max(axis=1, keepdims=True)
        best = index >= top - TIE_RTOL * np.abs(top)
        return uniform_among(np.where(forced.any(axis=1, keepdims=True), first_forced, best), rng)
