"""guha-bayes: the Block+Stream DP against brute force, the LP against an independent solve and exact
worked values (an exact joint DP), and the policy's Bayesian regret against the delay-naive baselines."""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np
import pytest
from scipy.optimize import linprog

from latebandit.delays.models import delay_from_spec
from latebandit.policies import ArmStats, make_policy
from latebandit.policies.blockstream import ArmShape, BlockStreamArm, first_continuing
from latebandit.policies.guha import delay_in_plays
from latebandit.policies.guha_plan import PlanTooLarge, check_size, solve_plan
from latebandit.sim.runner import run_policy
from latebandit.sim.scenario import scenario_from_mapping


def brute_force(a: float, b: float, horizon: int, delay: int, lam: float) -> float:
    """max E[Σ outcomes − λ·plays] over the Block+Stream family, by walking real time step by step with the
    plays in flight as an explicit queue and every outcome enumerated when it is revealed (at play time
    + δ + 1, or at the end). Shares nothing with the module: no Beta-Binomial law, no depth layers."""

    @cache
    def step(t: int, s: int, f: int, queue: tuple[int, ...], mode: str, left: int) -> float:
        if queue and (queue[0] + delay + 1 <= t or t == horizon):  # reveal the oldest outcome
            mu = (a + s) / (a + b + s + f)
            rest = queue[1:]
            return mu * (1 + step(t, s + 1, f, rest, mode, left)) + (1 - mu) * step(t, s, f + 1, rest, mode, left)
        if t == horizon:
            return 0.0
        if mode == "start":
            if queue:  # still waiting for the block's outcomes
                return step(t + 1, s, f, queue, mode, left)
            options = [0.0]  # quit
            for size in range(1, min(delay + 1, horizon - t) + 1):
                options.append(play(t, s, f, queue, "block", size))
            if horizon - t > delay + 1:
                options.append(play(t, s, f, queue, "blind", delay + 1))
            return max(options)
        if mode in ("block", "blind"):
            return play(t, s, f, queue, mode, left)
        if mode == "stream":  # stop for good (the plays in flight still pay) or play once more
            return max(step(t + 1, s, f, queue, "done", 0), play(t, s, f, queue, "stream", 0))
        return step(t + 1, s, f, queue, "done", 0)  # done: only reveals remain

    def play(t: int, s: int, f: int, queue: tuple[int, ...], mode: str, left: int) -> float:
        after = {"block": "start" if left == 1 else "block", "blind": "stream" if left == 1 else "blind"}
        next_mode = after.get(mode, mode)
        return -lam + step(t + 1, s, f, (*queue, t), next_mode, left - 1)

    return step(0, 0, 0, (), "start", 0)


@pytest.mark.parametrize(
    ("a", "b", "horizon", "delay", "lam"),
    [(1, 1, 4, 1, 0.5), (1, 1, 5, 1, 0.45), (1, 1, 6, 2, 0.5), (2, 1, 6, 1, 0.6), (1, 3, 7, 2, 0.3),
     (1, 1, 7, 0, 0.55), (0.5, 0.5, 6, 3, 0.5), (1, 1, 8, 2, 0.52)],
)  # fmt: skip
def test_dp_matches_brute_force_enumeration(a: float, b: float, horizon: int, delay: int, lam: float) -> None:
    solution = BlockStreamArm(ArmShape(a, b, horizon, delay, horizon)).solve(lam)
    assert solution.value == pytest.approx(brute_force(a, b, horizon, delay, lam), abs=1e-9)
    assert solution.value == pytest.approx(solution.reward - lam * solution.plays, abs=1e-9)


@pytest.mark.parametrize(
    ("horizon", "lam", "value", "reward", "plays"),
    [(1, 0.5, 0.0, 0.5, 1.0), (2, 0.5, 1 / 12, 0.833333, 1.5), (3, 0.5, 1 / 6, 1.166667, 2.0), (3, 0.6, 0, 0, 0),
     (5, 0.6, 0.086667, 1.566667, 2.466667), (10, 0.6, 0.369091, 2.976948, 4.346429)],
)  # fmt: skip
def test_spec_t1_delay_free_single_arm(horizon: int, lam: float, value: float, reward: float, plays: float) -> None:
    solution = BlockStreamArm(ArmShape(1, 1, horizon, 0, horizon)).solve(lam)
    assert (solution.value, solution.reward, solution.plays) == pytest.approx((value, reward, plays), abs=1e-6)


@pytest.mark.parametrize(
    ("horizon", "delay", "lam", "value", "reward", "plays", "root"),
    [(6, 1, 0.5, 0.35, 2.266667, 3.833333, "stream"), (10, 2, 0.5, 0.633135, 3.615873, 5.965476, "stream"),
     (10, 2, 0.55, 0.4025, 2.666667, 4.116667, "block(1)")],
)  # fmt: skip
def test_spec_t4_block_stream_single_arm(
    horizon: int, delay: int, lam: float, value: float, reward: float, plays: float, root: str
) -> None:
    solution = BlockStreamArm(ArmShape(1, 1, horizon, delay, horizon)).solve(lam, tables=True)
    assert (solution.value, solution.reward, solution.plays) == pytest.approx((value, reward, plays), abs=1e-6)
    assert {-1: "stream", 1: "block(1)"}[int(solution.action[0, 0])] == root


@pytest.mark.parametrize(
    ("horizon", "delay", "bound"),
    [(2, 0, 10 / 9), (3, 0, 1.772727), (5, 0, 3.170370), (10, 0, 6.640306), (20, 0, 13.765927),
     (4, 1, 2.333333), (6, 1, 3.684967), (8, 1, 5.061925), (8, 2, 4.862346), (10, 2, 6.241514)],
)  # fmt: skip
def test_spec_t2_t3_lp_values(horizon: int, delay: int, bound: float) -> None:
    plan = solve_plan([(1, 1), (1, 1)], horizon, delay, horizon)
    assert plan.bound == pytest.approx(bound, abs=1e-6)
    assert plan.dual == pytest.approx(plan.bound, abs=1e-6)  # the dual gap closes (catches tie pitfalls)
    assert plan.plays.sum() == pytest.approx(horizon, abs=1e-6) or plan.multiplier == 0.0


def lp1_linprog(priors: list[tuple[float, float]], horizon: int) -> float:
    """The delay-free LP1 in occupancy form (Guha et al., §3.1), solved by HiGHS: x = P(reach u), y = P(play at u)."""
    index: dict[tuple[int, int, int, str], int] = {}
    for i in range(len(priors)):
        for d in range(horizon + 1):
            for s in range(d + 1):
                index[(i, d, s, "x")] = len(index)
                if d < horizon:
                    index[(i, d, s, "y")] = len(index)
    cost = np.zeros(len(index))
    rows_eq, rhs_eq, rows_ub, rhs_ub = [], [], [], []
    budget = np.zeros(len(index))
    for i, (a, b) in enumerate(priors):
        root = np.zeros(len(index))
        root[index[(i, 0, 0, "x")]] = 1.0
        rows_eq.append(root)
        rhs_eq.append(1.0)
        for d in range(horizon):
            for s in range(d + 1):
                mu = (a + s) / (a + b + d)
                y = index[(i, d, s, "y")]
                cost[y] = -mu
                budget[y] = 1.0
                cap = np.zeros(len(index))
                cap[y], cap[index[(i, d, s, "x")]] = 1.0, -1.0
                rows_ub.append(cap)
                rhs_ub.append(0.0)
        for d in range(1, horizon + 1):
            for s in range(d + 1):
                flow = np.zeros(len(index))
                flow[index[(i, d, s, "x")]] = 1.0
                if s >= 1:  # from (s − 1, f) by a success
                    flow[index[(i, d - 1, s - 1, "y")]] -= (a + s - 1) / (a + b + d - 1)
                if s <= d - 1:  # from (s, f − 1) by a failure
                    flow[index[(i, d - 1, s, "y")]] -= 1 - (a + s) / (a + b + d - 1)
                rows_eq.append(flow)
                rhs_eq.append(0.0)
    rows_ub.append(budget)
    rhs_ub.append(horizon)
    result = linprog(cost, A_ub=np.array(rows_ub), b_ub=rhs_ub, A_eq=np.array(rows_eq), b_eq=rhs_eq, method="highs")
    assert result.success
    return -result.fun


@pytest.mark.parametrize(
    ("priors", "horizon"),
    [([(1, 1), (1, 1)], 5), ([(1, 1), (1, 3)], 3), ([(1, 1), (1, 3)], 5), ([(2, 1), (1, 1), (1, 2)], 6)],
)
def test_delay_free_lp_matches_linprog(priors: list[tuple[float, float]], horizon: int) -> None:
    assert solve_plan(priors, horizon, 0, horizon).bound == pytest.approx(lp1_linprog(priors, horizon), abs=1e-7)


def test_spec_asymmetric_values_and_order() -> None:
    assert solve_plan([(1, 1), (1, 3)], 3, 0, 3).bound == pytest.approx(1.516667, abs=1e-6)
    plan = solve_plan([(1, 3), (1, 1)], 5, 0, 5)
    assert plan.bound == pytest.approx(2.579365, abs=1e-6)
    assert plan.order == (1, 0)  # the optimistic prior has the larger R/N


def test_stream_threshold_is_monotone_in_h_and_lambda() -> None:
    arm = BlockStreamArm(ArmShape(1, 1, 30, 3, 30))
    low, high = arm.solve(0.45, tables=True), arm.solve(0.6, tables=True)
    assert (low.stream_from <= high.stream_from).all()
    assert (low.stream_from < high.stream_from).any()


def test_first_continuing_reads_the_least_h_from_which_play_continues() -> None:
    keep = np.array([[False, False, True, True], [False, True, False, True], [False, False, False, False]])
    assert first_continuing(keep).tolist() == [2, 3, 4]


def test_values_fall_and_plays_do_not_grow_with_lambda() -> None:
    arm = BlockStreamArm(ArmShape(1, 2, 12, 2, 12))
    solutions = [arm.solve(lam) for lam in np.linspace(0.1, 0.7, 13)]
    assert all(x.value >= y.value - 1e-12 for x, y in itertools.pairwise(solutions))
    assert all(x.plays >= y.plays - 1e-12 for x, y in itertools.pairwise(solutions))


def test_block_stream_lp_bounds() -> None:
    """LP_BlockStream <= LP1 (delay removes information) and >= the blocks-only LP of the reference (T3)."""
    for horizon, delay in ((8, 1), (10, 2)):
        delayed = solve_plan([(1, 1), (1, 1)], horizon, delay, horizon).bound
        assert delayed <= solve_plan([(1, 1), (1, 1)], horizon, 0, horizon).bound + 1e-9
    assert solve_plan([(1, 1), (1, 1)], 10, 2, 10).bound >= 5.548052


def test_depth_cap_and_size_limits() -> None:
    capped = solve_plan([(1, 1), (1, 1)], 30, 2, 8)
    exact = solve_plan([(1, 1), (1, 1)], 30, 2, 30)
    assert capped.bound == pytest.approx(exact.bound, rel=0.05)
    with pytest.raises(PlanTooLarge, match="lower the horizon"):
        check_size([ArmShape(1, 1, 5000, 10, 5000)])
    with pytest.raises(ValueError, match="guha-bayes plan would have"):
        make_policy("guha-bayes", {"horizon": 3000, "depth": 3000}, 2)
    assert make_policy("guha-bayes", {"horizon": 3000}, 2).params()["unit"] > 1  # {} fits by itself, on steps


def test_delay_in_plays_is_the_quantile() -> None:
    assert delay_in_plays(delay_from_spec({"family": "fixed", "value": 7}), 0.95, 1.0) == 7
    assert delay_in_plays(delay_from_spec({"family": "geometric", "p": 0.1}), 0.95, 1.0) == 28  # 1 − 0.9^29 ≥ .95
    assert delay_in_plays(delay_from_spec({"family": "exponential", "mean": 60}), 0.95, 2.0) == 360  # 179.7 s · 2/s


def scenario(horizon: int, delay: int, runs: int) -> dict:
    thompson = {"propensity_samples": 1}
    return {
        "horizon": horizon, "runs": runs, "seed": 7, "arms": [0.5, 0.5], "prior": {"a": 1, "b": 1},
        "delay": {"family": "fixed", "value": delay},
        "policies": [{"name": "guha-bayes"}, {"name": "thompson", "params": thompson}, {"name": "klucb"},
                     {"name": "ucb1"}],
    }  # fmt: skip


@pytest.mark.parametrize(("horizon", "delay", "strictly"), [(10, 2, True), (20, 4, False)])
def test_bayesian_regret_at_least_as_good_as_the_delay_naive_baselines(
    horizon: int, delay: int, strictly: bool
) -> None:
    """Paired over common random numbers (same prior draws and outcomes), 3000 runs. At the reference T3 setting
    (T = 10, δ = 2) guha-bayes's Bayesian regret is below every delay-naive baseline's by more than three
    standard errors of the paired difference; at T = 20, δ = 4 it is not above any by more than three."""
    sc = scenario_from_mapping(scenario(horizon, delay, 3000))
    guha, *baselines = (run_policy(sc, spec) for spec in sc.policies)
    for baseline in baselines:
        difference = guha.final - baseline.final
        se = difference.std(ddof=1) / np.sqrt(difference.size)
        limit = -3 * se if strictly else 3 * se
        assert difference.mean() < limit, (baseline.label, difference.mean(), se)


def test_delay_free_reward_is_at_least_half_the_lp() -> None:
    """Theorem 2: the rounding earns at least LP1/2 (ours adds the filler, so it earns more)."""
    sc = scenario_from_mapping(scenario(10, 0, 2000))
    regret = run_policy(sc, sc.policies[0]).final.mean()
    assert 10 * 2 / 3 - regret >= 6.640306 / 2


def test_a_fixed_delay_resolves_exactly_and_the_plan_plays_the_spec_root_action() -> None:
    policy = make_policy("guha-bayes", {"horizon": 10, "delay": 2}, 2)
    fresh = ArmStats(np.zeros((1, 2)), np.zeros((1, 2)), np.zeros((1, 2)), np.ones(1))
    planned = policy.prepare(fresh)
    assert planned.plan.bound == pytest.approx(6.241514, abs=1e-6)
    assert planned.choose(fresh, np.random.default_rng(0)).arm.tolist() == [planned.plan.order[0]]


def test_delayed_thompson_counts_a_pending_pull_by_its_chance_of_having_converted() -> None:
    stats = ArmStats(np.array([[10.0, 4.0]]), np.array([[3.0, 1.0]]), np.array([[6.5, 0.5]]), np.array([15]))
    delayed, naive = make_policy("delayed-thompson", {}, 2), make_policy("thompson", {}, 2)
    alpha, beta = delayed.posterior(stats)
    np.testing.assert_allclose(alpha, [[4.0, 2.0]])
    np.testing.assert_allclose(beta, [[4.5, 1.0]])  # 1 + Ñ − S, never below 1 (Ñ = 0.5 < S = 1)
    resolved = ArmStats(stats.pulls, stats.conversions, stats.pulls, stats.t)
    np.testing.assert_array_equal(delayed.posterior(resolved), naive.posterior(resolved))


def test_delayed_thompson_beats_thompson_under_long_delays() -> None:
    """K = 2, T = 100, δ = 20 with prior draws: the delay-naive posterior reads every pending pull as a
    failure and over-explores; paired over 600 runs the corrected one has lower regret by > 3 SE."""
    sc = scenario_from_mapping(
        {"horizon": 100, "runs": 600, "seed": 5, "arms": [0.5, 0.5], "prior": {"a": 1, "b": 1},
         "delay": {"family": "fixed", "value": 20},
         "policies": [{"name": "delayed-thompson", "params": {"propensity_samples": 1}},
                      {"name": "thompson", "params": {"propensity_samples": 1}}]}
    )  # fmt: skip
    delayed, naive = (run_policy(sc, spec).final for spec in sc.policies)
    difference = delayed - naive
    assert difference.mean() + 3 * difference.std(ddof=1) / np.sqrt(difference.size) < 0
