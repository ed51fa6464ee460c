"""The campaign LP over Block+Stream single-arm policies (docs/algorithms/guha.md): λ* by bisection, the mix θ
of the two optimal policies at λ*, the LP value (an upper bound for every policy that keeps each arm in
the family), and the priority order by R_i/N_i that Combine uses to make the relaxed solution feasible.

Arms with the same posterior share one DP per λ (docs/algorithms/guha.md). A plan counts time in steps of ``unit``
decisions: 1 for the exact DP (blockstream.py), more for the DP on steps (blockstream_steps.py) that delays
and horizons of thousands of decisions need. Pure: no clock; callers time it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from latebandit.policies.blockstream import ArmShape, ArmSolution, BlockStreamArm
from latebandit.policies.blockstream_steps import SteppedArm, StepShape

MAX_TABLE_STATES = 16_000_000  # (posterior, clock) states over the distinct roots of one plan
MAX_WORK = 250_000_000  # multiply-adds per λ over the distinct roots: ≈ 2.5 s per λ, ≈ 90 s per plan
BRACKET = 1e-9  # bisection stops when hi − lo is below this
STEP_BRACKET = 1e-6  # the same for a plan on steps, whose grid of means is coarser than this anyway
MIN_EXACT_DEPTH = 64  # the exact DP is used only if it fits at a depth cap of at least this (or the horizon)
EPSILON = 1e-7  # P⁺ and P⁻ are solved at λ* ∓ EPSILON (docs/algorithms/guha.md)


class PlanTooLarge(ValueError):
    """A configuration whose DP would not fit the caps; the message says what to lower."""


@dataclass(frozen=True)
class PlanCost:
    states: int  # block-start and streaming states over the distinct roots
    table_bytes: int
    working_bytes: int  # the largest DP working set (arms are solved one after the other)
    work: int  # multiply-adds per λ
    solves: int  # single-arm DP sweeps made (bisection and the final P⁺, P⁻)


@dataclass(frozen=True)
class Plan:
    horizon: int  # in steps of ``unit`` decisions
    delay: int  # in steps
    depth: int  # depth cap in steps (a plan on steps needs none: its horizon)
    unit: int  # decisions per step: 1 for the exact DP
    roots: np.ndarray  # (K, 2) Beta parameters each arm's table starts from
    multiplier: float  # λ*
    mix: float  # θ: the weight of P⁺ in the LP solution
    bound: float  # the LP value θ·ΣR⁺ + (1 − θ)·ΣR⁻
    dual: float  # min over λ of λH + Σ V_λ, evaluated at λ*; equals ``bound`` up to the bracket
    reward: np.ndarray  # (K,) R_i of the mixed solution
    plays: np.ndarray  # (K,) N_i of the mixed solution
    order: tuple[int, ...]  # arms by decreasing R_i/N_i, ties by index (docs/algorithms/guha.md)
    tables: tuple[ArmSolution, ...]  # P⁺ with its tables, one per distinct root
    table_of: np.ndarray  # (K,) which table each arm reads
    cost: PlanCost
    arms: tuple[BlockStreamArm | SteppedArm, ...]  # the DP of each table (a plan on steps reads its rows)

    @property
    def decisions(self) -> int:
        """The decisions the plan covers."""
        return self.horizon * self.unit


Shape = ArmShape | StepShape


def shapes_for(
    roots: Sequence[tuple[float, float]], horizon: int, delay: int, depth: int, unit: int = 1
) -> list[Shape]:
    """One DP shape per distinct root, in first-seen order; horizon and delay in steps of ``unit``."""
    distinct = dict.fromkeys((float(a), float(b)) for a, b in roots)
    if unit > 1:
        return [StepShape(a, b, horizon, delay, unit) for a, b in distinct]
    return [ArmShape(a, b, horizon, delay, depth) for a, b in distinct]


def check_size(shapes: Sequence[Shape]) -> None:
    states = sum(shape.states for shape in shapes)
    work = sum(shape.work for shape in shapes)
    if states > MAX_TABLE_STATES or work > MAX_WORK:
        one = shapes[0]
        cap = f"depth cap {one.depth}" if isinstance(one, ArmShape) else f"steps of {one.unit} decisions"
        raise PlanTooLarge(
            f"the guha-bayes plan would have {states:,} states and {work:,} multiply-adds per multiplier "
            f"(horizon {one.horizon}, delay {one.delay} plays, {cap}, {len(shapes)} distinct "
            f"prior(s)); the caps are {MAX_TABLE_STATES:,} states and {MAX_WORK:,} operations: lower the "
            "horizon, the depth cap or the delay in plays"
        )


def largest_depth(a: float, b: float, horizon: int, delay: int, copies: int) -> int:
    """The deepest depth cap (at most the horizon) whose DP, for ``copies`` distinct roots, fits the caps."""
    depth = horizon
    while depth > 1:
        try:
            check_size([ArmShape(a, b, horizon, delay, depth)] * copies)
            return depth
        except PlanTooLarge:
            depth = depth * 3 // 4
    check_size([ArmShape(a, b, horizon, delay, 1)] * copies)
    return 1


def fits(shapes: Sequence[Shape]) -> bool:
    """Whether these DPs fit the caps."""
    try:
        check_size(shapes)
    except PlanTooLarge:
        return False
    return True


def fits_exactly(a: float, b: float, horizon: int, delay: int, copies: int) -> bool:
    """Whether the exact DP fits the caps at a depth cap of MIN_EXACT_DEPTH (or the whole horizon)."""
    return fits([ArmShape(a, b, horizon, delay, min(horizon, MIN_EXACT_DEPTH))] * copies)


def solve_plan(roots: Sequence[tuple[float, float]], horizon: int, delay: int, depth: int, unit: int = 1) -> Plan:
    """λ* = the least λ with Σ_i N_i(λ) <= H, found by bisection on [0, 1] (μ <= 1, so no state plays at
    λ = 1 + TIE); θ mixes P⁺ (λ* − ε, ties play) and P⁻ (λ* + ε, ties quit) so that Σ N = H. Horizon
    and delay in steps of ``unit`` decisions (1: the exact DP)."""
    shapes = shapes_for(roots, horizon, delay, depth, unit)
    check_size(shapes)
    arms: list[BlockStreamArm | SteppedArm] = [
        SteppedArm(shape) if isinstance(shape, StepShape) else BlockStreamArm(shape) for shape in shapes
    ]
    bracket = BRACKET if unit == 1 else STEP_BRACKET
    key = {(shape.prior_a, shape.prior_b): i for i, shape in enumerate(shapes)}
    table_of = np.array([key[(float(a), float(b))] for a, b in roots])
    copies = Counter(table_of.tolist())
    solves = 0

    def total_plays(lam: float) -> float:
        nonlocal solves
        solves += len(arms)
        return sum(copies[i] * arm.solve(lam).plays for i, arm in enumerate(arms))

    lo, hi = 0.0, 1.0
    if total_plays(0.0) <= horizon:
        hi = 0.0
    while hi - lo > bracket:
        mid = (lo + hi) / 2
        if total_plays(mid) > horizon:
            lo = mid
        else:
            hi = mid
    lam = hi
    upper = [arm.solve(max(lam - EPSILON, 0.0), tie_play=True, tables=True) for arm in arms]
    lower = [arm.solve(lam + EPSILON, tie_play=False) for arm in arms]
    centre = [arm.solve(lam) for arm in arms]
    solves += 3 * len(arms)
    up_plays = np.array([upper[i].plays for i in table_of])
    down_plays = np.array([lower[i].plays for i in table_of])
    spread = up_plays.sum() - down_plays.sum()
    mix = 1.0 if spread <= 1e-12 else float(np.clip((horizon - down_plays.sum()) / spread, 0.0, 1.0))
    reward = mix * np.array([upper[i].reward for i in table_of]) + (1 - mix) * np.array(
        [lower[i].reward for i in table_of]
    )
    plays = mix * up_plays + (1 - mix) * down_plays
    ratio = np.divide(reward, plays, out=np.zeros_like(reward), where=plays > 0)
    order = tuple(int(i) for i in np.argsort(-ratio, kind="stable"))
    dual = lam * horizon + sum(centre[i].value for i in table_of)
    cost = PlanCost(
        states=sum(shape.states for shape in shapes),
        table_bytes=sum(shape.table_bytes for shape in shapes),
        working_bytes=max(shape.working_bytes for shape in shapes),
        work=sum(shape.work for shape in shapes),
        solves=solves,
    )
    return Plan(
        horizon, delay, horizon if unit > 1 else depth, unit, np.array(roots, dtype=np.float64), lam, mix,
        float(reward.sum()), float(dual), reward, plays, order, tuple(upper), table_of, cost, tuple(arms),
    )  # fmt: skip
