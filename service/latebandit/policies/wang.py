"""ARS-UCB and ARS-EXP3 of Wang, Wang & Huang (AAAI 2021), and the CLW baseline of Cesa-Bianchi,
Gentile & Mansour (2018) (docs/algorithms/wang.md). Rewards are anonymous and composite: a play's reward is
spread over later slots, and only the per-slot total is seen. None of them needs the delay to vanish:
ARS-* play rounds long enough that the edge effects average out, CLW learns only from the last d̂ slots of
randomly ended blocks of at least 2d̂ slots.

Choices, where the paper leaves room: round sizes ⌈k^β⌉ with the exact integer K (A1–A3); the
leftover slots after round K are one more draw, then, with a given horizon, rounds of g(K) slots go on with
the same rule; with no horizon, ARS-EXP3 and CLW restart in doubling epochs (A15). ARS-UCB's index uses
the sums observed so far, late ones included as they arrive (the paper's rule; its rounds are long next to
the feedback pipeline's lateness). EXP3 updates are applied when a round's feedback is complete, so in the
service the next round is drawn with the weights of the completed rounds (a one-round-delayed update,
§4.5); in the simulator feedback is complete at once and this is the paper's algorithm.
"""

from __future__ import annotations

import functools
import math
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from latebandit.policies.base import Param
from latebandit.policies.schedule import Next, Observed, Plan, SchedulePolicy, Segment, State

COIN_CHUNK = 4096  # CLW coins drawn at once while looking for the end of a block


def round_sizes_total(beta: float, rounds: int) -> int:
    """G(K) = Σ_{k <= K} ⌈k^β⌉."""
    return int(np.ceil(np.arange(1, rounds + 1) ** beta).sum())


@functools.lru_cache(maxsize=64)
def complete_rounds(beta: float, horizon: int) -> int:
    """K = max{K : G(K) <= T} (A2), by bisection on the increasing G."""
    low, high = 0, max(1, horizon)
    while low < high:
        mid = (low + high + 1) // 2
        if round_sizes_total(beta, mid) <= horizon:
            low = mid
        else:
            high = mid - 1
    return low


def mixed_probabilities(log_weights: np.ndarray, gamma: float) -> np.ndarray:
    """(1 − γ)·softmax + γ/N, computed by log-sum-exp (A14: the weights grow past exp's range)."""
    shifted = np.exp(log_weights - log_weights.max())
    return (1.0 - gamma) * shifted / shifted.sum() + gamma / log_weights.size


class ArsUcb(SchedulePolicy):
    """ARS-UCB (Algorithm 1): arm i's k-th round lasts f(k) = k^``power`` slots; the arm is chosen by
    u_i = min(M_i/N_i + sqrt(α·ln t / N_i), 1), ties to the smallest N_i, then the smallest index (A8).
    Every observation made while an arm is scheduled counts for it (nothing is discarded). Anytime."""

    name: ClassVar[str] = "ars-ucb"
    PARAMS: ClassVar[Mapping[str, Param]] = {
        **SchedulePolicy.BASE_PARAMS,
        "alpha": Param(float, 4.0, 0.0),
        "power": Param(int, 2, 1, 4),
    }

    def upper_bounds(self, slots: np.ndarray, reward: np.ndarray) -> np.ndarray:
        """u_i per arm; not ``Policy.index``, which ranks from ArmStats: this policy ranks from slot sums."""
        t = max(slots.sum(), 2.0)
        width = np.sqrt(self._params["alpha"] * math.log(t) / np.maximum(slots, 1.0))
        return np.where(slots > 0, np.minimum(reward / np.maximum(slots, 1.0) + width, 1.0), 1.0)

    def plan(
        self, state: State | None, closed: Sequence[Observed], open_: Sequence[Observed], rng: np.random.Generator
    ) -> Plan:
        if state is None:  # initialisation: one round of f(1) slots per arm, in index order
            rounds = tuple(Segment(arm, 1, True, kind="round") for arm in range(self.n_arms))
            state = {"next_round": [2] * self.n_arms, "slots": [0] * self.n_arms, "reward": [0.0] * self.n_arms}
            return Plan(rounds, Segment(self.n_arms - 1, 1, True, kind="hold"), Next.PLAYED, state)
        slots, reward = self.arm_sums(closed)
        slots += np.array(state["slots"], dtype=float)
        reward += np.array(state["reward"], dtype=float)
        state = {**state, "slots": slots.tolist(), "reward": reward.tolist()}
        pending_slots, pending_reward = self.arm_sums(open_)
        index = self.upper_bounds(slots + pending_slots, reward + pending_reward)
        candidates = np.flatnonzero(index == index.max())
        tied_slots = (slots + pending_slots)[candidates]
        arm = int(candidates[np.flatnonzero(tied_slots == tied_slots.min())[0]])
        k = state["next_round"][arm]
        state["next_round"] = [*state["next_round"][:arm], k + 1, *state["next_round"][arm + 1 :]]
        size = k ** self._params["power"]
        return Plan((Segment(arm, size, True, kind="round"),), Segment(arm, 1, True, kind="hold"), Next.PLAYED, state)


class Exp3Schedule(SchedulePolicy):
    """What ARS-EXP3 and CLW share: log-weights per arm, arms drawn from (1 − γ)·softmax + γ/N, an
    update γ·x/(N·p) for the drawn arm when its segment's feedback is complete, and doubling epochs."""

    @abstractmethod
    def gamma(self, horizon: int) -> float:
        """γ of the paper for this horizon, or the ``gamma`` param when set."""

    def scale(self, horizon: int) -> float:
        """The divisor of the log-weights inside the softmax (g(K) for ARS-EXP3, 1 for CLW)."""
        return 1.0

    @abstractmethod
    def feedback_value(self, item: Observed) -> float:
        """x fed to the update for a completed counted segment."""

    def fresh(self, epoch: int) -> State:
        return {"epoch": epoch, "round": 1, "closed": 0, "log_weights": [0.0] * self.n_arms}

    def learn(self, state: State | None, closed: Sequence[Observed], open_: Sequence[Observed]) -> State:
        """Fold completed segments of the current epoch into the weights; start a new epoch when due."""
        if state is None:
            return self.fresh(0)
        horizon = self.epoch_horizon(state["epoch"])
        log_weights = np.array(state["log_weights"])
        gamma = self.gamma(horizon)
        for item in closed:
            segment = item.segment
            if segment.counted and segment.epoch == state["epoch"]:
                log_weights[segment.arm] += gamma * self.feedback_value(item) / (self.n_arms * segment.propensity)
        state = {**state, "log_weights": log_weights.tolist(), "closed": state["closed"] + sum(i.slots for i in closed)}
        played = state["closed"] + sum(item.slots for item in open_)
        if not self._params["horizon"] and played >= horizon:
            fresh = self.fresh(state["epoch"] + 1)
            fresh["closed"] = state["closed"] - played  # slots still open belong to the epoch that ends
            return fresh
        return state

    def draw(self, state: State, rng: np.random.Generator) -> tuple[int, float]:
        horizon = self.epoch_horizon(state["epoch"])
        probabilities = mixed_probabilities(np.array(state["log_weights"]) / self.scale(horizon), self.gamma(horizon))
        arm = min(int(np.searchsorted(np.cumsum(probabilities), rng.random(), side="right")), self.n_arms - 1)
        return arm, float(probabilities[arm])


class ArsExp3(Exp3Schedule):
    """ARS-EXP3 (Algorithm 2): round k lasts g(k) = ⌈k^β⌉ slots on one drawn arm; Z' = min(Z, g(k)) is
    fed as Z'/g(K) through the softmax normaliser g(K) (Theorem 2's γ unless ``gamma`` is given)."""

    name: ClassVar[str] = "ars-exp3"
    PARAMS: ClassVar[Mapping[str, Param]] = {
        **SchedulePolicy.BASE_PARAMS,
        "beta": Param(float, 0.5, 0.0, 1.0),
        "gamma": Param(float, 0.0, 0.0, 1.0),
    }

    def rounds(self, horizon: int) -> int:
        return max(1, complete_rounds(self._params["beta"], horizon))

    def gamma(self, horizon: int) -> float:
        if self._params["gamma"]:
            return self._params["gamma"]
        arms = self.n_arms
        return min(1.0, math.sqrt(arms * math.log(arms) / ((math.e - 1.0) * self.rounds(horizon)))) if arms > 1 else 1.0

    def scale(self, horizon: int) -> float:
        return float(math.ceil(self.rounds(horizon) ** self._params["beta"]))

    def feedback_value(self, item: Observed) -> float:
        reward = item.reward / self._params["reward_cap"]
        return min(reward, float(item.segment.slots))

    def plan(
        self, state: State | None, closed: Sequence[Observed], open_: Sequence[Observed], rng: np.random.Generator
    ) -> Plan:
        state = self.learn(state, closed, open_)
        horizon = self.epoch_horizon(state["epoch"])
        k = state["round"]
        last = self.rounds(horizon)
        size = math.ceil(min(k, last) ** self._params["beta"])
        if k == last + 1:  # the leftover slots after the last complete round (A3)
            size = max(1, horizon - round_sizes_total(self._params["beta"], last))
        arm, probability = self.draw(state, rng)
        segment = Segment(arm, size, True, probability, kind="round", epoch=state["epoch"])
        hold = Segment(arm, 1, False, kind="hold", epoch=state["epoch"])
        return Plan((segment,), hold, Next.PLAYED, {**state, "round": k + 1})


class Clw(Exp3Schedule):
    """CLW as Wang et al. 2021 use it, §4.2 (ARS-CLW's block rule, one phase, fixed d̂ = ``max_delay``): a block ends at
    slot t when coin B_t = 1 and the next 2d̂ − 1 coins are 0 (q = 1/(2d̂)), so blocks after the first last
    at least 2d̂ slots; EXP3 receives x = Σ of the block's last d̂ slots / (2d̂); the rest is discarded.

    The coins after a block end are known to be 0, so the next block is 2d̂ − 1 slots plus the wait for
    the first 1 followed by 2d̂ − 1 zeros in fresh coins: each block's length is drawn when it starts.
    """

    name: ClassVar[str] = "clw"
    PARAMS: ClassVar[Mapping[str, Param]] = {
        **SchedulePolicy.BASE_PARAMS,
        "max_delay": Param(float, None, 1.0),
        "gamma": Param(float, 0.0, 0.0, 1.0),
    }

    @property
    def window(self) -> int:
        """d̂ in whole slots."""
        return math.ceil(self._params["max_delay"])

    def gamma(self, horizon: int) -> float:
        if self._params["gamma"]:
            return self._params["gamma"]
        d, arms = self.window, self.n_arms
        return min(1.0, math.sqrt(2.0 * d * arms * math.log(arms) / (horizon + d))) if arms > 1 else 1.0

    def feedback_value(self, item: Observed) -> float:
        return min(item.reward / self._params["reward_cap"] / (2.0 * self.window), 1.0)

    def wait_for_end(self, rng: np.random.Generator) -> int:
        """Slots until the first coin 1 followed by 2d̂ − 1 coins 0, in fresh Bernoulli(1/(2d̂)) coins."""
        quiet = 2 * self.window - 1
        ones: list[int] = []
        drawn = 0
        while True:
            coins = rng.random(COIN_CHUNK) < 1.0 / (2 * self.window)
            ones.extend((np.flatnonzero(coins) + drawn + 1).tolist())
            drawn += COIN_CHUNK
            for position, following in zip(ones, [*ones[1:], math.inf], strict=True):
                if following - position > quiet and position + quiet <= drawn:
                    return position
            ones = ones[-1:]

    def plan(
        self, state: State | None, closed: Sequence[Observed], open_: Sequence[Observed], rng: np.random.Generator
    ) -> Plan:
        state = self.learn(state, closed, open_)
        first = state["round"] == 1
        length = self.wait_for_end(rng) + (0 if first else 2 * self.window - 1)
        arm, probability = self.draw(state, rng)
        tail = min(self.window, length)
        tail_segment = Segment(arm, tail, True, probability, kind="tail", epoch=state["epoch"])
        head = (Segment(arm, length - tail, False, kind="head", epoch=state["epoch"]),) if length > tail else ()
        hold = Segment(arm, 1, False, kind="hold", epoch=state["epoch"])
        return Plan((*head, tail_segment), hold, Next.PLAYED, {**state, "round": state["round"] + 1})
