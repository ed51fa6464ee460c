"""guha-bayes: the Bayesian policy of Guha, Munagala & Pál under a known delay, as docs/algorithms/guha.md builds it.

The plan (service/latebandit/policies/guha_plan.py) solves the LP over Block+Stream single-arm policies and orders the
arms by R_i/N_i. Executing it needs, per arm, the resolved posterior (s, f), the plays in flight o and the
steps left h. They are derived from what every caller already keeps [ours]: s = S, f = Ñ − S, o = N − Ñ,
with Ñ the delay-corrected count (for a fixed delay Ñ counts exactly the pulls whose outcome is known, so
the three are exact; for a random delay a pending pull counts by its probability of having converted).
No per-arm block state is stored, so the execution is a Markov rule on (s, f, o, h):

- an arm wants a play iff o < cap, where cap is 0 for QUIT, ℓ for BLOCK(ℓ) and δ + 1 for STREAM in its
  block-start table at (s, f, τ = H − h); and, once plays are in flight, δ + 1 whenever the stream's
  continuation test h >= h*(s, f) passes (a stream started keeps going while it pays);
- Combine (Guha et al., §4, with our practical choices: budget H, no 1/γ scaling, participation 1): each
  step goes to the first arm in priority order that wants a play;
- when no arm wants one (all waiting for feedback, or every plan finished), the step goes to the arm of
  highest posterior mean ("exploit filler", §3.4; the paper idles).

Deviations, because this reads the state instead of storing it: a block whose outcomes come back while it
is still being played may grow into a stream, and the LP mix θ is not drawn: every arm runs P⁺ (λ* − ε,
ties play). A plan on steps (``unit`` > 1, blockstream_steps.py: realistic rates) reads its tables at the
step the arm's resolved count has reached and the grid cell of its posterior mean, and continues a stream
only where the block-start table asks for no block: with a delay of several steps, a block's plays still in
flight would otherwise read as a stream's, and each arm would play for a whole delay before the next one
opens. The reproduction ``guha-lp-gap`` measures what the feasible policy gets against the LP bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from latebandit.delays.models import DelayModel
from latebandit.policies.base import ArmStats, Choice, Param, Policy, Setting
from latebandit.policies.blockstream import QUIT, STREAM, triangle
from latebandit.policies.blockstream_steps import SteppedArm
from latebandit.policies.guha_plan import Plan, check_size, fits, fits_exactly, largest_depth, shapes_for, solve_plan

PLANNING_WINDOW = 100  # the least rolling planning window (docs/design-notes.md), in decisions
WINDOW_DELAYS = 16  # the service's window spans up to this many δ, so that the plan outlives several blocks
STEP_SECONDS = 60.0  # ... in steps of at most a minute of traffic, so that every arm opens within minutes
PLAN_SECONDS = 600.0  # and at least this long at the rate: a plan serves half of it (seconds of solving)
EXACT_HORIZON = 200  # horizons up to this (decisions) are planned exactly when the DP fits (blockstream.py)
HORIZON_STEPS = 64  # a plan on steps counts its horizon in at most this many steps
MAX_DELAY_STEPS = 8  # and δ in at most this many: outcomes later than that are taken when they come
MAX_DELAY_SEARCH = 1 << 40


def delay_in_plays(model: DelayModel, quantile: float, rate: float) -> int:
    """⌈q-quantile of the delay × decisions per unit⌉ (docs/algorithms/guha.md): the least whole number of plays by
    which a fraction ``quantile`` of outcomes is known."""
    target = lambda plays: float(model.cdf(plays / rate)) >= quantile  # noqa: E731
    if not target(MAX_DELAY_SEARCH):
        raise ValueError(f"the delay model never reaches its {quantile:g} quantile: guha-bayes needs a finite delay")
    lo, hi = -1, 1
    while not target(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if target(mid) else (mid, hi)
    return hi


def _values(stats: ArmStats) -> tuple[tuple[str, bytes], ...]:
    """The statistics ``GuhaBayes.wants`` reads, as values (dtype, shape and bytes): equal keys, equal answers."""
    parts = (stats.pulls, stats.conversions, stats.effective, stats.t)
    return tuple((f"{part.dtype.str}{part.shape}", part.tobytes()) for part in map(np.asarray, parts))


class GuhaBayes(Policy):
    """Params: ``prior_a``, ``prior_b`` (Beta prior of every arm, default 1, 1); ``delay`` (δ in decisions: the
    ``delay_quantile`` quantile of the delay model, default 0.95, times ``decisions_per_second`` in the
    service); ``decisions_per_second`` (default: the campaign's declared ``decisions_per_second``, else 1);
    ``horizon`` (decisions planned: the scenario's horizon, or the service's rolling window: WINDOW_DELAYS·δ,
    at most HORIZON_STEPS steps of STEP_SECONDS at the rate, at least 100 decisions and PLAN_SECONDS at the
    rate, so that the plan outlives its blocks and its solve and opens every arm within minutes); ``unit``
    (decisions per plan step: 1 is the exact DP, used by default when the horizon is at most EXACT_HORIZON
    and the DP fits at a depth cap of 64; else ⌈horizon/HORIZON_STEPS⌉, the DP on steps of
    blockstream_steps.py, with δ counted in at most MAX_DELAY_STEPS steps); ``depth`` (depth cap D of the
    exact DP: by default the deepest that fits the size caps, at most the horizon; giving it asks for the
    exact DP); ``priority``: 0 (default) gives each step to the first arm of the LP's R/N order whose plan
    wants it (docs/algorithms/guha.md), 1 to the one of highest posterior mean among them [ours, see
    docs/reproductions.md].

    >>> import numpy as np
    >>> from latebandit.policies import ArmStats, make_policy
    >>> policy = make_policy("guha-bayes", {"horizon": 30, "delay": 2}, 3)  # δ = 2 decisions
    >>> fresh = ArmStats(np.zeros((1, 3)), np.zeros((1, 3)), np.zeros((1, 3)), np.array([1]))
    >>> policy.choose(fresh, np.random.default_rng(0)).arm.tolist()  # no plan yet: highest posterior mean
    [0]
    >>> planned = policy.prepare(fresh)  # solved from the prior (the service solves off the request path)
    >>> planned.plan.order, planned.wants(fresh).tolist()
    ((0, 1, 2), [[True, True, True]])
    >>> waiting = ArmStats(np.array([[3, 0, 0]]), np.zeros((1, 3)), np.zeros((1, 3)), np.array([4]))  # N, S, Ñ, t
    >>> planned.wants(waiting).tolist(), planned.choose(waiting, np.random.default_rng(0)).arm.tolist()
    ([[False, True, True]], [1])

    Arm 0's block of three is in flight, its outcomes not yet known: it waits, and the next arm in the plan's
    order opens.
    """

    name: ClassVar[str] = "guha-bayes"
    delay_corrected: ClassVar[bool] = True
    PARAMS: ClassVar[Mapping[str, Param]] = {
        "prior_a": Param(float, 1.0, 1e-6, 1e6),
        "prior_b": Param(float, 1.0, 1e-6, 1e6),
        "horizon": Param(int, PLANNING_WINDOW, 1, 1e12),
        "delay": Param(int, 0, 0),
        "depth": Param(int, 0, 0),
        "unit": Param(int, 0, 0),
        "delay_quantile": Param(float, 0.95, 0.5, 0.999),
        "decisions_per_second": Param(float, 1.0, 1e-6, 1e9),
        "priority": Param(int, 0, 0, 1),
    }

    def __init__(
        self,
        n_arms: int,
        setting: Setting | None = None,
        plan: Plan | None = None,
        start: int = 1,
        base: tuple[np.ndarray, np.ndarray] | None = None,
        **params: Any,
    ) -> None:
        """``plan`` starts at decision index ``start`` from the resolved counts ``base`` (None: zero)."""
        super().__init__(n_arms, **params)
        resolved = self._params
        if setting is not None and "delay" not in params and setting.delays:
            rate = resolved["decisions_per_second"] if setting.seconds else 1.0
            resolved["delay"] = max(delay_in_plays(m, resolved["delay_quantile"], rate) for m in setting.delays)
        if setting is not None and "horizon" not in params:
            rate = resolved["decisions_per_second"]
            resolved["horizon"] = setting.horizon or max(
                PLANNING_WINDOW,
                min(WINDOW_DELAYS * self._int_param("delay"), math.ceil(HORIZON_STEPS * STEP_SECONDS * rate)),
                math.ceil(PLAN_SECONDS * rate),
            )
        a, b = resolved["prior_a"], resolved["prior_b"]
        horizon, delay = self._int_param("horizon"), self._int_param("delay")
        # A simulation plans once, from the shared prior: one DP. The service re-plans from each arm's own
        # posterior (docs/design-notes.md): up to one DP per arm, which is what its caps must allow.
        roots = 1 if setting is not None and setting.horizon is not None else self.n_arms
        if resolved["unit"] == 0:
            exact = "depth" in params or (horizon <= EXACT_HORIZON and fits_exactly(a, b, horizon, delay, roots))
            resolved["unit"] = 1 if exact else max(1, -(-horizon // HORIZON_STEPS))
            while not exact and not fits(shapes_for([(a, b)], *self.steps(), 0, self._int_param("unit")) * roots):
                resolved["unit"] = self._int_param("unit") * 5 // 4 + 1  # fewer, longer steps (many arms)
        unit = self._int_param("unit")
        if unit == 1:
            if resolved["depth"] == 0:
                resolved["depth"] = largest_depth(a, b, horizon, delay, roots)
            resolved["depth"] = min(resolved["depth"], horizon)
        check_size(shapes_for([(a, b)], *self.steps(), self._int_param("depth"), unit) * roots)
        self._setting = setting
        self.plan = plan
        self.start = start
        self.base = base
        self._last_wants: tuple[tuple[tuple[str, bytes], ...], np.ndarray] | None = None  # see ``wants``

    def steps(self) -> tuple[int, int]:
        """(horizon, delay) in plan steps: whole steps, the delay rounded up (its outcomes are all in by then)
        and, on steps, at most MAX_DELAY_STEPS [ours]: where the delay's quantile is longer, the plan does not
        wait for it; its posterior counts the outcomes in by then (the delay-corrected Ñ), later ones as
        they come (docs/algorithms/guha.md)."""
        unit = self._int_param("unit")
        delay = -(-self._int_param("delay") // unit)
        return -(-self._int_param("horizon") // unit), delay if unit == 1 else min(delay, MAX_DELAY_STEPS)

    def prepare(self, stats: ArmStats) -> GuhaBayes:
        """This policy with its plan solved from the first run's current posteriors (the prior at the
        start), its clock starting at the decision index stats.t."""
        a, b = self._params["prior_a"], self._params["prior_b"]
        successes, failures, _ = self.resolved(stats)
        roots = [(a + s, b + f) for s, f in zip(successes[0], failures[0], strict=True)]
        plan = solve_plan(roots, *self.steps(), self._int_param("depth"), self._int_param("unit"))
        return GuhaBayes(self.n_arms, self._setting, plan, int(stats.t[0]), (successes[0], failures[0]), **self._params)

    def replan_due(self, stats: ArmStats) -> bool:
        """Whether the rolling window (docs/design-notes.md) asks for a new plan: none yet, half of it used, or no arm
        wanting a play at least a delay (δ + 1 steps) after it started (an empty active set: its
        arms have quit, e.g. a first plan from a prior far from the rates seen)."""
        if self.plan is None:
            return True
        age = int(stats.t[0]) - self.start
        idle = age >= (self.plan.delay + 1) * self.plan.unit and not self.wants(stats).any()
        return age >= self.plan.decisions // 2 or idle

    @staticmethod
    def resolved(stats: ArmStats) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Whole successes, failures and in-flight plays per (run, arm)."""
        conversions = np.asarray(stats.conversions, dtype=np.float64)
        effective = np.asarray(stats.effective, dtype=np.float64)
        successes = np.rint(conversions)
        failures = np.rint(np.maximum(effective - conversions, 0.0))
        in_flight = np.rint(np.maximum(np.asarray(stats.pulls, dtype=np.float64) - effective, 0.0))
        return successes, failures, in_flight

    def estimate(self, stats: ArmStats) -> np.ndarray:
        """The posterior mean of the resolved outcomes, (a + s)/(a + b + s + f)."""
        successes, failures, _ = self.resolved(stats)
        a, b = self._params["prior_a"], self._params["prior_b"]
        return (a + successes) / (a + b + successes + failures)

    def effective_pulls(self, stats: ArmStats) -> np.ndarray:
        return np.asarray(stats.effective, dtype=np.float64)

    def wants(self, stats: ArmStats) -> np.ndarray:
        """(R, K) whether each arm's plan asks for a play now (all False without a plan or past its end),
        read-only. The answer for the last statistics asked is kept: a decision asks ``replan_due`` and then
        ``choose`` of the same statistics, and walking the plan's tables is most of its cost."""
        if self.plan is None:
            return np.zeros(np.shape(stats.pulls), dtype=bool)
        key = _values(stats)
        if self._last_wants is not None and self._last_wants[0] == key:
            return self._last_wants[1]
        wanted = self._walk_plan(self.plan, stats)
        wanted.flags.writeable = False
        self._last_wants = (key, wanted)
        return wanted

    def _walk_plan(self, plan: Plan, stats: ArmStats) -> np.ndarray:
        """``wants``, computed: each arm's cap on plays in flight from its tables at its posterior and step."""
        runs, arms = np.shape(stats.pulls)
        successes, failures, in_flight = self.resolved(stats)
        if self.base is not None:
            successes = successes - self.base[0]
            failures = failures - self.base[1]
        unit = plan.unit
        clock = (np.asarray(stats.t, dtype=np.int64) - self.start) // unit  # τ on the real clock (ours)
        left = plan.horizon - clock
        out = np.zeros((runs, arms), dtype=bool)
        live = (left > 0) & (clock >= 0)
        if not live.any():
            return out
        s = np.maximum(successes, 0).astype(np.int64)
        f = np.maximum(failures, 0).astype(np.int64)
        depth = (s + f) if unit == 1 else np.rint((s + f) / unit).astype(np.int64)
        capped = depth > plan.depth
        tau = np.clip(clock, 0, plan.horizon - 1)
        stream = plan.delay + 1
        for k in range(arms):
            a, b = plan.roots[k]
            mean = (a + s[:, k]) / (a + b + s[:, k] + f[:, k])
            table, dp = plan.tables[plan.table_of[k]], plan.arms[plan.table_of[k]]
            if isinstance(dp, SteppedArm):
                row = dp.rows_of(mean, np.minimum(depth[:, k], plan.depth))
            else:
                row = triangle(np.minimum(depth[:, k], plan.depth)) + np.minimum(s[:, k], depth[:, k])
            row = np.where(capped[:, k], 0, row)
            assert table.action is not None and table.stream_from is not None  # P⁺ is solved with its tables
            action = table.action[row, tau]
            cap = np.where(action == STREAM, stream, np.where(action == QUIT, 0, action))
            flowing = (in_flight[:, k] >= 1) & (left >= table.stream_from[row])
            if unit > 1:  # on steps a block's plays in flight are not a stream's (see the module docstring)
                flowing &= action <= QUIT
            cap = np.where(flowing, stream, cap)
            cap = np.where(capped[:, k], np.where(mean >= plan.multiplier, stream, 0), cap)
            out[:, k] = live & (in_flight[:, k] < cap * unit)
        return out

    def _rank(self) -> np.ndarray:
        """(K,) each arm's place in the plan's priority order, 0 first (all 0 without a plan)."""
        rank = np.zeros(self.n_arms)
        if self.plan is not None:
            rank[list(self.plan.order)] = np.arange(self.n_arms)
        return rank

    def index(self, stats: ArmStats) -> np.ndarray:
        """The priority rank of the arms that want a play (lower first), nan for the others."""
        return np.where(self.wants(stats), self._rank()[None, :], np.nan)

    def choose(self, stats: ArmStats, rng: np.random.Generator) -> Choice:
        """The first arm in priority order whose plan wants a play (or, with ``priority`` 1, the one of
        highest posterior mean among them); else the highest posterior mean overall (ties: lowest index).
        Deterministic: propensity 1."""
        wants = self.wants(stats)
        estimate = self.estimate(stats)
        if self._params["priority"] == 1:
            planned = np.where(wants, estimate, -math.inf).argmax(axis=1)
        else:
            planned = np.where(wants, self._rank()[None, :], math.inf).argmin(axis=1)
        filler = estimate.argmax(axis=1)
        arm = np.where(wants.any(axis=1), planned, filler)
        return Choice(arm.astype(np.int64), np.ones(wants.shape[0]))

    def plan_state(self) -> dict[str, Any]:
        """What the service shows under ``policy_state.plan``."""
        plan = self.plan
        if plan is None:
            return {"status": "solving"}
        return {
            "status": "ready", "multiplier": plan.multiplier, "mix": plan.mix, "lp_bound": plan.bound,
            "order": list(plan.order), "horizon": plan.decisions, "delay_plays": plan.delay * plan.unit,
            "unit": plan.unit, "steps": plan.horizon, "depth": plan.depth,
            "start": self.start, "states": plan.cost.states, "table_bytes": plan.cost.table_bytes,
            "working_bytes": plan.cost.working_bytes,
        }  # fmt: skip
