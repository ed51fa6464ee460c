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
- Phasing stops when one arm is left (Q6): it is played for good; with a given horizon also when
  T·Δ̃_m² <= e (Q2). A phase that does not fit before a given T is cut there (Q3), in arm-id order, as
  the paper's Algorithm 1 does and §5's figures measure (ODAAF-V ends above ODAAF with exponential
  delays because its cut phase plays the worse arm). When T is too short for the phase that separates
  the arms, ODAAF plays blocks in turn and the cut one can cost more than uniform play: see
  docs/algorithms/pike-burke.md.
- With no horizon (the service), the paper (§3, Algorithm 1 takes T) gives no anytime version. We keep
  one run of phases and double the T of L_m = ln(T·Δ̃_m²) before a phase until that phase's blocks fit
  before it: T_ℓ = first_epoch·2^ℓ (the doubling trick, Q7, without its restarts). A restart would
  forget every elimination and, with a first epoch shorter than one arm's block, cut the first block at
  the epoch's end and start again on the same arm: the first arm for ever. Raising T only lengthens the
  later phases (n_m grows with ln T), so each elimination still holds with the confidence of the T of
  its own phase. Without a horizon a phase plays its blocks highest estimate first: Q5 allows any order
  fixed at the phase's start; wherever the campaign is stopped, the phase under way has then spent its
  slots on the likely best arms first (in arm-id order the worst arm could open every phase: at E[τ] =
  300 slots, means 0.3 / 0.5 / 0.4, that was 1.4x uniform's regret after 100,000 slots), and the
  leader's block follows the bridge on the leader, so no other arm's reward leaks into it.

The confidence width, ``adaptive_width`` (1 by default; 0 is the paper's, which the reproductions set).
Algorithm 1 and Theorem 1 size phase m so that |X̄_j − μ_j| <= Δ̃_m/2: n_m is the smallest n with
Δ̃_m·n/2 >= sqrt(2nL) + (4/3)L + 3m·E[τ] (ODAAF; L = ln(TΔ̃_m²)). We read its first two terms as two
Freedman deviations, 2·(sqrt(2·n·v·L) + (2/3)L), of martingales whose increments are at most 1 with a
conditional variance v = 1/4 per slot, the worst case of a reward in [0, 1], and the last as the bias
of the rewards that leave a block after it ends or enter it from the plays before (at most E[τ] per
block, summed over the phases). With ``adaptive_width`` 1, phase m >= 2 takes instead
v_m = min(1/4, max over the active arms of X̄_j + Δ̃_{m−1}/2) (``variance_bound``); only the deviation
term changes, the range term (4/3)L and the delay term stay the paper's (ODAAF-B's and ODAAF-V's n_m
share the first two terms and take the same v_m). Why it is still sound: each
increment is a reward r in [0, 1] (times whether it lands in the block) minus its conditional mean, so
its variance is at most E[r²] <= E[r], the mean of the arm that earned it; on the event the analysis
already works on after phase m − 1, |X̄_j − μ_j| <= Δ̃_{m−1}/2 for every active arm, the best arm is
active, and no arm (eliminated ones, whose late rewards still land, included) has a mean above the best
one's, so v_m bounds every increment's variance. Phase 1 knows nothing of the rewards: the paper's
width. At conversion rates of a few percent v_m falls to about 0.07 by phase 6, and the deviation term,
which dominates n_m when the delay is short, shrinks with it: at 5 % against 2 % without delay the 2 %
arm goes after 49,574 decisions instead of 321,288 (tests/unit/test_schedule_policies.py). The delay
term does not shrink: it bounds a bias, not a deviation. It alone makes n_m >= 6m·E[τ]·2^m, so a
campaign whose mean delay is thousands of slots is refused as before (``cannot_learn`` checks phase 1,
which is the paper's either way): docs/algorithms/pike-burke.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from latebandit.delays.facts import FACT_PARAMS
from latebandit.policies.base import (
    EPS_N,
    TIE_RTOL,
    WORST_VARIANCE,
    ArmStats,
    Choice,
    Param,
    Policy,
    Setting,
    uniform_among,
    variance_bound,
)
from latebandit.policies.schedule import Next, Observed, Plan, SchedulePolicy, Segment, State, leader

DELAY_SHARE_LIMIT = 0.99  # the largest share of the first phase the delay may take (cannot_learn)


def tolerance(m: int) -> float:
    return 2.0**-m


def log_term(horizon: int, m: int) -> float:
    """L_m = ln(T·Δ̃_m²)."""
    return math.log(horizon * tolerance(m) ** 2)


def samples_needed(delta: float, log_t: float, bias: float, variance: float = WORST_VARIANCE) -> float:
    """The smallest n with Δ̃·n/2 >= sqrt(8vnL) + (4/3)L + bias/2, in the closed form of §2.2:
    (1/Δ̃²)·(sqrt(8vL) + sqrt(8vL + (8/3)Δ̃L + Δ̃·bias))². v bounds the variance of a slot's reward; the
    paper's v = 1/4 (the worst case in [0, 1]) gives its sqrt(2L)."""
    deviation = 8.0 * variance * log_t
    return (math.sqrt(deviation) + math.sqrt(deviation + 8 / 3 * delta * log_t + delta * bias)) ** 2 / delta**2


class Odaaf(SchedulePolicy):
    """ODAAF (A1: E[τ] known): n_m with the accumulated bias 6·m·E[τ] (§2.2). No bridge.

    >>> import numpy as np
    >>> from latebandit.policies import make_policy
    >>> from latebandit.policies.schedule import Observed
    >>> policy = make_policy("odaaf", {"horizon": 10000, "mean_delay": 5}, 2)
    >>> rng = np.random.default_rng(0)
    >>> plan = policy.plan(None, [], [], rng)  # phase 1: every arm for the same number of slots
    >>> [(s.arm, s.slots) for s in plan.segments], plan.next.value  # the next plan once their feedback is in
    ([(0, 430), (1, 430)], 'closed')
    >>> played = [Observed(s, s.slots, 0.1 * s.slots if s.arm == 0 else 0.9 * s.slots) for s in plan.segments]
    >>> plan = policy.plan(plan.state, played, [], rng)
    >>> plan.state["active"], [(s.arm, s.slots, s.kind) for s in plan.segments], plan.hold.arm  # arm 0 eliminated
    ([1], [], 1)
    """

    name: ClassVar[str] = "odaaf"
    bridged: ClassVar[bool] = False
    PARAMS: ClassVar[Mapping[str, Param]] = {
        **SchedulePolicy.BASE_PARAMS,
        "mean_delay": Param(float, None, 0.0),
        "adaptive_width": Param(int, 1, 0, 1),
    }

    def n(self, m: int, horizon: int, variance: float = WORST_VARIANCE) -> float:
        """n_m of §2.2 for slot rewards of variance at most ``variance``."""
        return samples_needed(tolerance(m), log_term(horizon, m), 6.0 * m * self._params["mean_delay"], variance)

    def variance(self, state: State) -> float:
        """The bound v on a slot's reward variance for phase ``state["m"]``: with ``adaptive_width`` 1,
        variance_bound of max_j X̄_j + Δ̃_{m−1}/2 over the active arms (module docstring); 1/4 otherwise
        and in phase 1."""
        m, active = state["m"], state["active"]
        if not self._params["adaptive_width"] or m == 1:
            return WORST_VARIANCE
        reward, slots = np.array(state["reward"])[active], np.array(state["slots"])[active]
        upper = float(np.max(reward / np.maximum(slots, 1.0))) + tolerance(m - 1) / 2
        return float(variance_bound(upper))

    def first_block(self) -> int:
        """N_1: how many slots every arm is played before the first elimination (deterministic)."""
        return int(self.plan(None, [], [], np.random.default_rng(0)).state["samples"])

    def scaled_delay(self, factor: float) -> Odaaf:
        """The same policy with every delay fact scaled as the delay: E[τ] and d by ``factor``, V by its square."""
        params = dict(self._params)
        for name in FACT_PARAMS:
            if name in params:
                params[name] *= factor**2 if name == "delay_variance" else factor
        return type(self)(self.n_arms, None, **params)

    def delay_share(self) -> float:
        """The share of the first phase that is there only for the delay: 1 − N_1(no delay) / N_1 (0 where a
        horizon of a few slots leaves no first phase to play: the plan exploits at once)."""
        first = self.first_block()
        return 0.0 if first == 0 else 1.0 - self.scaled_delay(0.0).first_block() / first

    def cannot_learn(self) -> str | None:
        """Refused where the delay is more than DELAY_SHARE_LIMIT of the first phase. Every arm then plays
        N_1 slots mostly to absorb the delay (the n_m of §2.2–2.4 grow with E[τ], as the regret of §5 and
        App. F does), before an elimination that at Δ̃_1 = 1/2 can only drop arms half the reward range
        worse: the service would spend hours on rounds of blocks no better than uniform play. The bound on
        the mean delay that passes this check is reported, in slots (passing it is necessary, not enough:
        the arms must also be far apart on the reward scale, docs/algorithms/pike-burke.md). Phase 1 has the
        paper's width whatever ``adaptive_width``: the variance-aware width serves no campaign this refuses."""
        share = self.delay_share()
        if share <= DELAY_SHARE_LIMIT:
            return None
        low, high = 0.0, 1.0
        for _ in range(40):  # the largest delay scale whose share is within the limit (the share grows with it)
            middle = (low + high) / 2
            low, high = (
                (middle, high) if self.scaled_delay(middle).delay_share() <= DELAY_SHARE_LIMIT else (low, middle)
            )
        mean = self._params["mean_delay"]
        return (
            f"policy {self.name!r} cannot learn at this delay: a mean delay of {mean:,.0f} slots makes it play each "
            f"arm {self.first_block():,} slots before its first elimination, {share:.1%} of them only to absorb the "
            f"delay (its block sums would mostly hold the rewards of the arm played before). The delay stays within "
            f"{DELAY_SHARE_LIMIT:.0%} of that block where the mean delay is at most about {mean * low:,.0f} slots: "
            "with one decision per slot, a delay that short at the declared decisions_per_second; or set "
            "slot_seconds so that the mean delay is that many slots (with reward_cap about a slot's 99th-percentile "
            "total); or, if conversions carry their "
            "decision id, use qpm-d or a policy for attributed conversions"
        )

    def fresh(self) -> State:
        """Before the first phase; ``epoch``: the doubling ℓ of the T the phases are planned for."""
        arms = self.n_arms
        return {"epoch": 0, "m": 1, "active": list(range(arms)), "samples": 0, "nu": 0, "phase_open": False,
                "closed": 0, "slots": [0] * arms, "reward": [0.0] * arms}  # fmt: skip

    def plan(
        self, state: State | None, closed: Sequence[Observed], open_: Sequence[Observed], rng: np.random.Generator
    ) -> Plan:
        """Deterministic: ``rng`` is not used (the schedule is the same in every run, §5)."""
        if state is None:
            return self._next_phase(self.fresh(), 0, [])
        state = self._fold(state, closed)
        played = state["closed"] + sum(item.slots for item in open_)
        prefix: list[Segment] = []
        if state["phase_open"]:
            state, prefix = self._eliminate(state)
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
        """The blocks of phase m over the active arms, or the leader for good. The order (Q5): arm ids with a
        given horizon (the paper's figures), highest estimate first without one."""
        m, active = state["m"], state["active"]
        start = played + sum(segment.slots for segment in prefix)
        if len(active) == 1:
            return self._exploit(state, prefix)
        order = active
        if self._params["horizon"]:
            horizon = self._int_param("horizon")
            target = self._target(state, horizon)
            if horizon * tolerance(m) ** 2 <= math.e or start >= horizon:
                return self._exploit(state, prefix)
        else:
            epoch = state["epoch"]
            while not self._fits(state, self.epoch_horizon(epoch), start):
                epoch += 1
            horizon = self.epoch_horizon(epoch)
            state = {**state, "epoch": epoch}
            target = self._target(state, horizon)
            order = self._by_estimate(state, active)
        nu = target - state["samples"]
        room = horizon - start  # a phase cut at a given T (Q3): the arms after the cut get no block
        blocks = [
            Segment(arm, min(nu, room - i * nu), True, kind="block") for i, arm in enumerate(order) if room > i * nu
        ]
        hold = Segment(self._leader(state, active), 1, False, kind="hold")
        state = {**state, "samples": target, "nu": nu, "phase_open": True}
        return Plan((*prefix, *blocks), hold, Next.CLOSED, state)

    def _by_estimate(self, state: State, active: Sequence[int]) -> list[int]:
        """The active arms, highest estimate first (unplayed arms after, each group by id)."""
        reward, slots = state["reward"], state["slots"]
        return sorted(active, key=lambda arm: -reward[arm] / slots[arm] if slots[arm] > 0 else math.inf)

    def _target(self, state: State, horizon: int) -> int:
        """N_m for a horizon T (never fewer than the slots every active arm has already)."""
        return max(math.ceil(self.n(state["m"], horizon, self.variance(state))), state["samples"])

    def _fits(self, state: State, horizon: int, start: int) -> bool:
        """Whether phase m, planned for T = ``horizon`` from slot ``start``, ends before T with L_m > 1."""
        new = self._target(state, horizon) - state["samples"]
        return horizon * tolerance(state["m"]) ** 2 > math.e and start + len(state["active"]) * new <= horizon

    def _exploit(self, state: State, prefix: list[Segment]) -> Plan:
        """The leader of the active arms, for good."""
        best = Segment(self._leader(state, state["active"]), 1, False, kind="exploit")
        return Plan(tuple(prefix), best, Next.NEVER, state)


class OdaafB(Odaaf):
    """ODAAF-B (A1 + A2: delays <= d): n_m = max(nB_m, m·min(d, n_m^ODAAF/m)) and a bridge (§2.3).

    >>> import numpy as np
    >>> from latebandit.policies import make_policy
    >>> from latebandit.policies.schedule import Observed
    >>> policy = make_policy("odaaf-b", {"horizon": 10000, "mean_delay": 5, "max_delay": 10}, 2)
    >>> rng = np.random.default_rng(0)
    >>> plan = policy.plan(None, [], [], rng)  # phase 1: every arm for the same number of slots
    >>> [(s.arm, s.slots) for s in plan.segments], plan.next.value  # the next plan once their feedback is in
    ([(0, 398), (1, 398)], 'closed')
    >>> played = [Observed(s, s.slots, 0.1 * s.slots if s.arm == 0 else 0.9 * s.slots) for s in plan.segments]
    >>> plan = policy.plan(plan.state, played, [], rng)
    >>> plan.state["active"], [(s.arm, s.slots, s.kind) for s in plan.segments], plan.hold.arm  # arm 0 eliminated
    ([1], [(1, 398, 'bridge')], 1)
    """

    name: ClassVar[str] = "odaaf-b"
    bridged: ClassVar[bool] = True
    PARAMS: ClassVar[Mapping[str, Param]] = {**Odaaf.PARAMS, "max_delay": Param(float, None, 0.0)}

    def n(self, m: int, horizon: int, variance: float = WORST_VARIANCE) -> float:
        delta, log_t = tolerance(m), log_term(horizon, m)
        bounded = samples_needed(delta, log_t, 4.0 * self._params["mean_delay"], variance)
        return max(bounded, m * min(self._params["max_delay"], super().n(m, horizon, variance) / m))


class OdaafV(Odaaf):
    """ODAAF-V (A1 + A3: Var(τ) known): bias 4·(E[τ] + 2V(τ)), and a bridge (§2.4).

    >>> import numpy as np
    >>> from latebandit.policies import make_policy
    >>> policy = make_policy("odaaf-v", {"horizon": 10000, "mean_delay": 5, "delay_variance": 4}, 2)
    >>> rng = np.random.default_rng(0)
    >>> plan = policy.plan(None, [], [], rng)  # phase 1: every arm for the same number of slots
    >>> [(s.arm, s.slots) for s in plan.segments], plan.next.value  # the next plan once their feedback is in
    ([(0, 500), (1, 500)], 'closed')

    Its phases then eliminate and bridge as ODAAF-B's do (its example above).
    """

    name: ClassVar[str] = "odaaf-v"
    bridged: ClassVar[bool] = True
    PARAMS: ClassVar[Mapping[str, Param]] = {**Odaaf.PARAMS, "delay_variance": Param(float, None, 0.0)}

    def n(self, m: int, horizon: int, variance: float = WORST_VARIANCE) -> float:
        facts = self._params
        bias = 4.0 * (facts["mean_delay"] + 2.0 * facts["delay_variance"])
        return samples_needed(tolerance(m), log_term(horizon, m), bias, variance)


class QpmD(Policy):
    """QPM-D of Joulani, György & Szepesvári (2013) with UCB1 as the base, the attributed baseline of
    Pike-Burke 2018 (§3). The base only learns a pull's reward once it is resolved, and while its
    recommended arm's reward is outstanding it keeps recommending it. We play the argmax of UCB1 over
    *all* resolved pulls: S/R + sqrt(2·ln t_b / R), R = resolved pulls, t_b = Σ R. The original feeds an
    arm's queued rewards only when the base asks for that arm, so its counts can lag R for the other arms:
    not the same algorithm, but the same regret within noise (58.4 ± 1.8 against 60.7 ± 1.6 over 60 runs,
    tests/integration/test_reproduce_anonymous.py). An arm with nothing resolved is the base's first try:
    the lowest index. Ties go uniformly at random.

    Which pulls are resolved. In the paper's model (§1 of the spec: every reward, a zero included, reports
    after its delay; the simulator's resolution feed) R = pulls − pending. In the service a non-conversion
    never reports: it is known to be 0 only when the censoring window ends, 30 days by default. Counting it
    pending until then leaves R = the converted pulls, every estimate S/R = 1 and the widest index on the
    arm with the fewest conversions: the worst arm. So in the service R is the number of pulls whose
    outcome the delay model says is in, Ñ = Σ F(min(age, window)) (``effective``): the conversions seen
    are then a sample of R resolved pulls in expectation (E[S] = μ·Ñ). Without a delay model Ñ is the
    pull count: a pending pull counts as a 0, as for a delay-naive UCB1.

    >>> import numpy as np
    >>> from latebandit.policies import ArmStats, make_policy
    >>> stats = ArmStats(np.array([[10, 10, 10]]), np.array([[2.0, 5.0, 1.0]]), np.array([[10.0] * 3]), np.array([31]),
    ...                   pending=np.array([[2, 5, 0]]))  # outcomes not resolved yet
    >>> policy = make_policy("qpm-d", {}, 3)  # the simulator's resolution feed: R = N − pending
    >>> policy.index(stats).round(3).tolist(), policy.choose(stats, np.random.default_rng(0)).arm.tolist()
    ([[1.135, 2.12, 0.892]], [1])
    """

    name: ClassVar[str] = "qpm-d"
    needs_pending: ClassVar[bool] = True

    def __init__(self, n_arms: int, setting: Setting | None = None, **params: Any) -> None:
        super().__init__(n_arms, setting, **params)
        self._censored = setting is not None and setting.seconds  # the service: zeros never report

    def effective_pulls(self, stats: ArmStats) -> np.ndarray:
        if self._censored:
            return np.asarray(stats.effective, dtype=np.float64)
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
