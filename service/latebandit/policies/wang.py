"""ARS-UCB and ARS-EXP3 of Wang, Wang & Huang (AAAI 2021), and the CLW baseline of Cesa-Bianchi,
Gentile & Mansour (2018) (docs/algorithms/wang.md). Rewards are anonymous and composite: a play's reward is
spread over later slots, and only the per-slot total is seen. None of them needs the delay to vanish:
ARS-* play rounds long enough that the edge effects average out, CLW learns only from the last d̂ slots of
randomly ended blocks of at least 2d̂ slots.

Choices, where the paper leaves room: round sizes ⌈k^β⌉ with the exact integer K (A1–A3); the
leftover slots after round K are one more draw, then, with a given horizon, rounds of g(K) slots go on with
the same rule; with no horizon, the paper's EXP3 updates restart in doubling epochs (A15). ARS-UCB's index
uses the sums observed so far, late ones included as they arrive (the paper's rule; its rounds are long
next to the feedback pipeline's lateness). EXP3 updates are applied when a round's feedback is complete,
so in the service the next round is drawn with the weights of the completed rounds (a one-round-delayed
update, §4.5); in the simulator feedback is complete at once.

Defaults that differ from the paper, because with the paper's a campaign of a few arms at a few percent,
delays of minutes and tens of decisions a second learns nothing in hours (measured in docs/algorithms/
wang.md); the paper's algorithms stay one parameter away (``round_unit`` 1, ``adaptive_width`` 0, ``eta`` 0)
and the reproductions use them:

- Rounds of c·f(k) slots, c the declared delay's median in slots (``round_unit``). Theorem 1 charges each
  round of ARS-UCB a bias of at most d1 (Lemma 1's term d1·K_i/N_i), Theorem 2 each round of ARS-EXP3 at
  most d (its 2dK): rounds of 1, 4, 9… slots against delays of thousands of slots hold almost nothing of
  their own arm's reward. Sec. 2.2 admits f(k) = c·k^β for any integer c (Theorem 1's condition (ii)) and
  Remark 1 prefers the faster-growing f; c = 1 when the campaign declares no delay or no slot length.
- ARS-UCB's width sqrt(4·v_i·α·ln t / N_i) with α = 2: Lemma 1's Bernstein step bounds the variance of a
  slot's reward by 1/4, the worst case for a reward in [0, 1]; a reward in [0, 1] of mean s has variance
  at most s(1 − s) ≤ s, so v_i = min(1/4, M_i/N_i + sqrt(ln t / N_i)) (the mean's upper confidence bound)
  keeps a bound where the paper's width, at s of a few percent, needs about 5 times the slots to separate
  arms; with v_i = 1/4 it is the paper's width. Theorem 1 takes α > 4 to absorb its bias terms d1·K_i/N_i,
  which rounds of the median delay shrink by c; α = 2 is UCB1's confidence level, t⁻⁴ (Remark 1: a
  smaller α helps when d1 and d2 are small). Simulating the example world of docs/algorithms/wang.md
  with the best arm listed first (2 seeds of 16 runs), the regret went from about 1,550 with α = 4 to
  about 970.
- ARS-EXP3 and CLW: the update η·x/p with x = (r − b)/max(r, b) in [−1, 1], r the segment's reward per
  slot and b the rate of every counted segment completed before it, in one epoch (no restarts) whose γ
  follows the slots t played: ARS-EXP3's is Theorem 2's γ for K = t/c, CLW's the paper's γ with T = t.
  Theorem 2's γ and normaliser g(K) are tuned for its worst case: its bound 3g(K)·sqrt(NK·ln N) + 2dK
  exceeds T unless T is far beyond d³ (for N = 9 and d = 10, at every T ≤ 10⁵), and with x = Z'/g(K), at
  most the conversion rate, ARS-EXP3 played as uniform play does for 200,000 decisions (docs/algorithms/
  wang.md). x measures a segment in the rate's own scale; it grows with r, and b does not depend on the
  arm drawn, so the arm with the higher rate gains more weight in expectation, as in EXP3. The doubling
  restarts (footnote 3) threw away what each epoch had learned. Rounds of c·⌈√k⌉ slots are only about 24
  draws in W1's 200,000 decisions: a γ computed from the draws stays near 0.4 (40 % uniform play), one
  from the slots falls to 0.17. η = 3 did at least as well as 0.3, 1 and 6 in our simulations of it.
- CLW's d̂: a heavy-tailed delay has no bound, and the bound of a bounded one can be days. A slot ends a
  block with probability q(1 − q)^(2d̂ − 1) ≈ 1/(2e·d̂), so blocks last about 2e·d̂ slots; d̂ = the declared
  delay's median in slots over e makes a typical block two median delays long, so that a play's reward
  mostly lands in its own block, and leaves blocks short enough for EXP3 to draw one every few minutes.
  ARS-CLW (App. C, Theorem 3) runs the same block rule with a d̂ below d in all its early phases and pays
  only h⁻¹(d) for it.
- ARS-EXP3 and CLW play every arm once first, in index order (propensity 1), as Algorithm 1 does: drawn
  at random, four arms need about eight rounds on average (4·(1 + 1/2 + 1/3 + 1/4)) to all be played,
  half an hour of rounds of the median delay at 20 decisions a second.
"""

from __future__ import annotations

import functools
import math
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from latebandit.delays.models import DelayModel
from latebandit.policies.base import WORST_VARIANCE, Param, variance_bound
from latebandit.policies.schedule import Next, Observed, Plan, SchedulePolicy, Segment, State

GAP_CHUNK = 16  # gaps between CLW coins 1 drawn at once; a block ends after e of them on average
RELATIVE_ETA = 3.0  # the default learning rate of the EXP3 policies on relative rewards (module docstring)


def delay_quantile(model: DelayModel, level: float) -> float:
    """The smallest delay d with F(d) >= ``level`` (to a relative 1e-9), by bisection on the model's CDF;
    inf when F never reaches ``level``."""
    high = 1.0
    while float(model.cdf(high)) < level:
        high *= 2.0
        if high > 1e300:
            return math.inf
    low = 0.0
    while high - low > 1e-9 * high:
        middle = (low + high) / 2.0
        low, high = (low, middle) if float(model.cdf(middle)) >= level else (middle, high)
    return high


def declared_delay(delays: Sequence[DelayModel], per_slot: float | None, level: float) -> float | None:
    """The largest ``level``-quantile of the arms' declared delays, in slots; None when it cannot be known
    (no delay model, slots with no fixed length, or a quantile beyond every finite delay)."""
    if per_slot is None or not delays or any(model.family == "unknown" for model in delays):
        return None
    slots = max(delay_quantile(model, level) for model in delays) / per_slot
    return slots if math.isfinite(slots) else None


def with_default(params: Mapping[str, Any], name: str, slots: float | None) -> dict[str, Any]:
    """``params`` with ``name`` set to ``slots`` rounded up to a whole slot, unless given or unknown."""
    filled = dict(params)
    if filled.get(name) is None and slots is not None:
        filled[name] = max(1, math.ceil(slots))
    return filled


def exp3_gamma(arms: int, rounds: float) -> float:
    """Theorem 2's γ = min(1, sqrt(N·ln N / ((e − 1)·K))) for K rounds (1 for a single arm)."""
    return min(1.0, math.sqrt(arms * math.log(arms) / ((math.e - 1.0) * rounds))) if arms > 1 else 1.0


def relative_reward(rate: float, baseline: float) -> float:
    """(rate − baseline) / max(rate, baseline), in [−1, 1]: a segment's reward per slot against the rate
    seen so far on every arm (0 when both are 0)."""
    larger = max(rate, baseline)
    return (rate - baseline) / larger if larger > 0 else 0.0


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


class RoundsOfTheMedianDelay:
    """ARS-UCB's and ARS-EXP3's round unit c defaults to the declared delay's median in slots (module
    docstring): a round of the paper's growth, in units of c, then spans delays, not single slots."""

    @classmethod
    def declared_defaults(
        cls, params: Mapping[str, Any], delays: Sequence[DelayModel], per_slot: float | None
    ) -> dict[str, Any]:
        return with_default(params, "round_unit", declared_delay(delays, per_slot, 0.5))


class ArsUcb(RoundsOfTheMedianDelay, SchedulePolicy):
    """ARS-UCB (Algorithm 1): arm i's k-th round lasts f(k) = c·k^``power`` slots, c = ``round_unit``; the
    arm is chosen by u_i = min(M_i/N_i + w_i, 1), ties to the smallest N_i, then the smallest index (A8).
    Every observation made while an arm is scheduled counts for it (nothing is discarded). Anytime.

    Three defaults differ from the paper's (module docstring): c is the declared delay's median in slots (the
    paper: c = 1), the width w_i = sqrt(4·v_i·α·ln t / N_i) uses the variance bound v_i = min(1/4,
    M_i/N_i + sqrt(ln t / N_i)) (``adaptive_width`` 1) where the paper has v_i = 1/4 (``adaptive_width`` 0),
    and α = 2 (the paper: 4).

    >>> import numpy as np
    >>> from latebandit.policies import make_policy
    >>> from latebandit.policies.schedule import Observed
    >>> policy, rng = make_policy("ars-ucb", {}, 2), np.random.default_rng(0)
    >>> plan = policy.plan(None, [], [], rng)  # every arm's first round: f(1) = 1 slot
    >>> [(s.arm, s.slots) for s in plan.segments]
    [(0, 1), (1, 1)]
    >>> plan = policy.plan(plan.state, [Observed(s, s.slots, 0.5 * s.slots) for s in plan.segments], [], rng)
    >>> [(s.arm, s.slots) for s in plan.segments]  # a tie: arm 0's second round, f(2) = 4 slots
    [(0, 4)]
    """

    name: ClassVar[str] = "ars-ucb"
    PARAMS: ClassVar[Mapping[str, Param]] = {
        **SchedulePolicy.BASE_PARAMS,
        "alpha": Param(float, 2.0, 0.0),
        "power": Param(int, 2, 1, 4),
        "round_unit": Param(int, 1, 1),
        "adaptive_width": Param(int, 1, 0, 1),
    }

    def upper_bounds(self, slots: np.ndarray, reward: np.ndarray) -> np.ndarray:
        """u_i per arm; not ``Policy.index``, which ranks from ArmStats: this policy ranks from slot sums."""
        log_t = math.log(max(slots.sum(), 2.0))
        played = np.maximum(slots, 1.0)
        mean = reward / played
        variance: np.ndarray | float = WORST_VARIANCE
        if self._params["adaptive_width"]:
            variance = variance_bound(np.maximum(mean, 0.0) + np.sqrt(log_t / played))
        width = np.sqrt(4.0 * variance * self._params["alpha"] * log_t / played)
        return np.where(slots > 0, np.minimum(mean + width, 1.0), 1.0)

    def plan(
        self, state: State | None, closed: Sequence[Observed], open_: Sequence[Observed], rng: np.random.Generator
    ) -> Plan:
        unit = self._int_param("round_unit")
        if state is None:  # initialisation: one round of f(1) slots per arm, in index order
            rounds = tuple(Segment(arm, unit, True, kind="round") for arm in range(self.n_arms))
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
        size = unit * k ** self._params["power"]
        return Plan((Segment(arm, size, True, kind="round"),), Segment(arm, 1, True, kind="hold"), Next.PLAYED, state)


class Exp3Schedule(SchedulePolicy):
    """What ARS-EXP3 and CLW share: log-weights per arm, arms drawn from (1 − γ)·softmax + γ/N, and an
    update of the drawn arm when its segment's feedback is complete. ``eta`` 0: the paper's γ·x/(N·p) with
    x the paper's reward in [0, 1], in doubling epochs when no horizon is given. ``eta`` > 0 (the default):
    η·x/p with x the segment's relative reward (``relative_reward``), in one epoch whose γ shrinks with the
    number k of segments drawn, γ_k = min(1, sqrt(N·ln N / ((e − 1)·k))) (module docstring)."""

    @abstractmethod
    def gamma(self, horizon: int) -> float:
        """γ of the paper for this horizon, or the ``gamma`` param when set."""

    def scale(self, horizon: int) -> float:
        """The divisor of the log-weights inside the softmax (g(K) for ARS-EXP3, 1 for CLW)."""
        return 1.0

    @abstractmethod
    def feedback_value(self, item: Observed) -> float:
        """The paper's x in [0, 1] fed to the update for a completed counted segment."""

    @abstractmethod
    def anytime_gamma(self, state: State) -> float:
        """γ for the slots played so far (``eta`` > 0), or the ``gamma`` param when set."""

    def fresh(self, epoch: int) -> State:
        return {"epoch": epoch, "round": 1, "closed": 0, "log_weights": [0.0] * self.n_arms}

    def learn(self, state: State | None, closed: Sequence[Observed], open_: Sequence[Observed]) -> State:
        """Fold completed segments of the current epoch into the weights; start a new epoch when due."""
        if state is None:
            return self.fresh(0)
        if self._params["eta"]:
            return self.learn_relative(state, closed)
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

    def learn_relative(self, state: State, closed: Sequence[Observed]) -> State:
        """η·x/p for each completed counted segment, x its reward per slot relative to the rate of the
        counted segments completed before it (``seen``: their reward and slots, every arm together);
        ``played``: the slots of every completed segment."""
        log_weights = np.array(state["log_weights"])
        reward, slots = state.get("seen", (0.0, 0))
        played = state.get("played", 0) + sum(item.slots for item in closed)
        for item in closed:
            if not item.segment.counted or item.slots <= 0:
                continue
            observed = item.reward / self._params["reward_cap"]
            baseline = reward / slots if slots else observed / item.slots
            x = relative_reward(observed / item.slots, baseline)
            log_weights[item.segment.arm] += self._params["eta"] * x / item.segment.propensity
            reward, slots = reward + observed, slots + item.slots
        return {**state, "log_weights": log_weights.tolist(), "seen": [reward, slots], "played": played}

    def draw(self, state: State, rng: np.random.Generator) -> tuple[int, float]:
        """The arm of the next segment and its probability; with ``eta`` > 0 the first N segments play
        every arm once, in index order, as ARS-UCB's initialisation does (Algorithm 1)."""
        if self._params["eta"] and state["round"] <= self.n_arms:
            return state["round"] - 1, 1.0
        if self._params["eta"]:
            gamma, scale = self.anytime_gamma(state), 1.0
        else:
            horizon = self.epoch_horizon(state["epoch"])
            gamma, scale = self.gamma(horizon), self.scale(horizon)
        probabilities = mixed_probabilities(np.array(state["log_weights"]) / scale, gamma)
        arm = min(int(np.searchsorted(np.cumsum(probabilities), rng.random(), side="right")), self.n_arms - 1)
        return arm, float(probabilities[arm])


class ArsExp3(RoundsOfTheMedianDelay, Exp3Schedule):
    """ARS-EXP3 (Algorithm 2): round k lasts g(k) = c·⌈k^β⌉ slots on one drawn arm, c = ``round_unit``.
    ``eta`` 0 is the paper's algorithm (c = 1): Z' = min(Z, g(k)) is fed as Z'/g(K) through the softmax
    normaliser g(K), with Theorem 2's γ unless ``gamma`` is given. The defaults (module docstring): c is
    the declared delay's median in slots, and the update is Exp3Schedule's relative one.

    >>> import numpy as np
    >>> from latebandit.policies import make_policy
    >>> from latebandit.policies.schedule import Observed
    >>> policy, rng = make_policy("ars-exp3", {}, 2), np.random.default_rng(0)
    >>> plan = policy.plan(None, [], [], rng)
    >>> for _ in range(3):  # each round played in full: arm 1 earns 0.9 a slot, arm 0 nothing
    ...     played = [Observed(s, s.slots, 0.9 * s.arm * s.slots) for s in plan.segments]
    ...     plan = policy.plan(plan.state, played, [], rng)
    >>> [(s.arm, s.slots, round(s.propensity, 2)) for s in plan.segments]
    [(1, 2, 0.79)]
    """

    name: ClassVar[str] = "ars-exp3"
    PARAMS: ClassVar[Mapping[str, Param]] = {
        **SchedulePolicy.BASE_PARAMS,
        "beta": Param(float, 0.5, 0.0, 1.0),
        "gamma": Param(float, 0.0, 0.0, 1.0),
        "round_unit": Param(int, 1, 1),
        "eta": Param(float, RELATIVE_ETA, 0.0),
    }

    def anytime_gamma(self, state: State) -> float:
        """Theorem 2's γ for K = the rounds of one unit (c slots) played so far, at least the rounds drawn:
        exploration fades with the time played, not with the few dozen draws of a day (module docstring)."""
        if self._params["gamma"]:
            return self._params["gamma"]
        return exp3_gamma(
            self.n_arms, max(float(state["round"]), state.get("played", 0) / self._int_param("round_unit"))
        )

    def rounds(self, horizon: int) -> int:
        """K: the complete rounds in ``horizon`` slots."""
        return max(1, complete_rounds(self._params["beta"], horizon // self._int_param("round_unit")))

    def gamma(self, horizon: int) -> float:
        return self._params["gamma"] or exp3_gamma(self.n_arms, self.rounds(horizon))

    def scale(self, horizon: int) -> float:
        return float(self._int_param("round_unit") * math.ceil(self.rounds(horizon) ** self._params["beta"]))

    def feedback_value(self, item: Observed) -> float:
        reward = item.reward / self._params["reward_cap"]
        return min(reward, float(item.segment.slots))

    def plan(
        self, state: State | None, closed: Sequence[Observed], open_: Sequence[Observed], rng: np.random.Generator
    ) -> Plan:
        state = self.learn(state, closed, open_)
        k, unit, beta = state["round"], self._int_param("round_unit"), self._params["beta"]
        if self._params["eta"]:
            size = unit * math.ceil(k**beta)
        else:
            horizon = self.epoch_horizon(state["epoch"])
            last = self.rounds(horizon)
            size = unit * math.ceil(min(k, last) ** beta)
            if k == last + 1:  # the leftover slots after the last complete round (A3)
                size = max(1, horizon - unit * round_sizes_total(beta, last))
        arm, probability = self.draw(state, rng)
        segment = Segment(arm, size, True, probability, kind="round", epoch=state["epoch"])
        hold = Segment(arm, 1, False, kind="hold", epoch=state["epoch"])
        return Plan((segment,), hold, Next.PLAYED, {**state, "round": k + 1})


class Clw(Exp3Schedule):
    """CLW as Wang et al. 2021 use it, §4.2 (ARS-CLW's block rule, one phase, fixed d̂ = ``max_delay``): a block ends at
    slot t when coin B_t = 1 and the next 2d̂ − 1 coins are 0 (q = 1/(2d̂)), so blocks after the first last
    at least 2d̂ slots; EXP3 learns only from the block's last d̂ slots; the rest is discarded. ``eta`` 0:
    the paper's x = Σ of those slots / (2d̂). The defaults (module docstring): d̂ is the declared delay's
    median in slots over e, and the update is Exp3Schedule's relative one.

    The coins after a block end are known to be 0, so the next block is 2d̂ − 1 slots plus the wait for
    the first 1 followed by 2d̂ − 1 zeros in fresh coins: each block's length is drawn when it starts.

    >>> import numpy as np
    >>> from latebandit.policies import make_policy
    >>> from latebandit.policies.schedule import Observed
    >>> policy, rng = make_policy("clw", {"max_delay": 5}, 2), np.random.default_rng(0)
    >>> plan = policy.plan(None, [], [], rng)  # a block: its head discarded, its last d̂ slots learned from
    >>> [(s.arm, s.slots, s.counted) for s in plan.segments]
    [(0, 2, False), (0, 5, True)]
    >>> for _ in range(3):  # each block played in full: arm 1 earns 0.9 a slot, arm 0 nothing
    ...     played = [Observed(s, s.slots, 0.9 * s.arm * s.slots) for s in plan.segments]
    ...     plan = policy.plan(plan.state, played, [], rng)
    >>> [(s.arm, round(s.propensity, 2)) for s in plan.segments]
    [(1, 1.0), (1, 0.73)]
    """

    name: ClassVar[str] = "clw"
    PARAMS: ClassVar[Mapping[str, Param]] = {
        **SchedulePolicy.BASE_PARAMS,
        "max_delay": Param(float, None, 1.0),
        "gamma": Param(float, 0.0, 0.0, 1.0),
        "eta": Param(float, RELATIVE_ETA, 0.0),
    }

    @classmethod
    def declared_defaults(
        cls, params: Mapping[str, Any], delays: Sequence[DelayModel], per_slot: float | None
    ) -> dict[str, Any]:
        median = declared_delay(delays, per_slot, 0.5)
        return with_default(params, "max_delay", None if median is None else median / math.e)

    @property
    def window(self) -> int:
        """d̂ in whole slots."""
        return math.ceil(self._params["max_delay"])

    def gamma(self, horizon: int) -> float:
        if self._params["gamma"]:
            return self._params["gamma"]
        d, arms = self.window, self.n_arms
        return min(1.0, math.sqrt(2.0 * d * arms * math.log(arms) / (horizon + d))) if arms > 1 else 1.0

    def anytime_gamma(self, state: State) -> float:
        """The paper's γ with T = the slots played so far."""
        return self.gamma(max(1, state.get("played", 0)))

    def feedback_value(self, item: Observed) -> float:
        return min(item.reward / self._params["reward_cap"] / (2.0 * self.window), 1.0)

    def wait_for_end(self, rng: np.random.Generator) -> int:
        """Slots until the first coin 1 followed by 2d̂ − 1 coins 0, in fresh Bernoulli(1/(2d̂)) coins.

        Drawn as the gaps between coins 1 (geometric): the end is the first 1 whose gap to the next exceeds
        2d̂ − 1. The same law as drawing the coins one by one, in about e draws whatever d̂: coins drawn in
        chunks found no 1 at all at bounds of millions of slots."""
        quiet, chance = 2 * self.window - 1, 1.0 / (2 * self.window)
        candidate = int(rng.geometric(chance))  # the first coin 1
        while True:
            gaps = rng.geometric(chance, GAP_CHUNK)  # gaps[i]: from the i-th candidate on to the next coin 1
            long = np.flatnonzero(gaps > quiet)
            if long.size:
                return candidate + int(gaps[: long[0]].sum())
            candidate += int(gaps.sum())

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
