"""The planning policies of Pike-Burke 2018 and Wang 2021 against the worked values of the specs
(Pike-Burke et al. 2018, Wang et al. 2021), computed by independent scripts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from latebandit.policies import POLICIES, make_policy
from latebandit.policies.pikeburke import log_term, samples_needed, tolerance
from latebandit.policies.schedule import Next, Observed, Plan, SchedulePolicy
from latebandit.policies.wang import complete_rounds, mixed_probabilities, round_sizes_total


def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def play_all(plan: Plan, mean_of_arm: list[float]) -> list[Observed]:
    """Every segment of ``plan`` as played, each slot earning its arm's mean exactly (no noise, no delay)."""
    return [Observed(s, s.slots, s.slots * mean_of_arm[s.arm]) for s in plan.segments]


def phase_ends(policy: SchedulePolicy, means: list[float], phases: int) -> list[int]:
    """The round at which each phase's last block ends (bridges included before the next phase's blocks)."""
    plan, played, ends = policy.plan(None, [], [], rng()), 0, []
    while len(ends) < phases:
        observed = play_all(plan, means)
        played += sum(item.slots for item in observed)
        ends.append(played)
        plan = policy.plan(plan.state, observed, [], rng())
    return ends


@pytest.mark.parametrize(
    ("horizon", "m", "expected"),
    [(250_000, 1, 11.0429), (250_000, 3, 8.2703), (250_000, 5, 5.4977), (100_000, 4, 5.9677)],
)
def test_log_term(horizon: int, m: int, expected: float) -> None:
    assert log_term(horizon, m) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize(
    ("name", "params", "expected"),
    [
        ("odaaf", {"mean_delay": 10, "horizon": 250_000}, [662.9, 2251.1, 7099.2, 21573.9, 63581.2, 179059.4]),
        ("odaaf", {"mean_delay": 5, "horizon": 10_000}, [429.745, 1371.923, 4073.675, 11276.690]),
        ("odaaf-b", {"mean_delay": 10, "max_delay": 20, "horizon": 250_000}, [599.0, 1721.9, 5179.7, 15911.2, 48472.7]),
        ("odaaf-b", {"mean_delay": 5, "max_delay": 8, "horizon": 10_000}, [397.001, 1101.301, 3098.737, 8432.101]),
        ("odaaf-v", {"mean_delay": 10, "delay_variance": 100, "horizon": 250_000}, [2719.1, 6240.3, 14817.5, 36381.6]),
        ("odaaf-v", {"mean_delay": 10, "delay_variance": 10, "horizon": 250_000}, [845.5, 2251.1, 6302.4]),
        ("odaaf-v", {"mean_delay": 5, "delay_variance": 4, "horizon": 10_000}, [499.292, 1319.353, 3556.746, 9378.855]),
    ],
)
def test_samples_per_phase_match_the_spec(name: str, params: dict, expected: list[float]) -> None:
    policy = make_policy(name, params, 2)
    values = [policy.n(m, params["horizon"]) for m in range(1, len(expected) + 1)]
    assert values == pytest.approx(expected, abs=0.06)


def test_odaaf_b_falls_back_to_odaaf_when_the_bound_is_huge() -> None:
    bounded = make_policy("odaaf-b", {"mean_delay": 10, "max_delay": 1e6, "horizon": 250_000}, 2)
    plain = make_policy("odaaf", {"mean_delay": 10, "horizon": 250_000}, 2)
    assert [bounded.n(m, 250_000) for m in (1, 2, 3)] == pytest.approx([plain.n(m, 250_000) for m in (1, 2, 3)])


@pytest.mark.parametrize(
    ("name", "params", "expected"),
    [
        ("odaaf", {"mean_delay": 10}, [1326, 4504, 14200, 43148, 127164]),
        ("odaaf-b", {"mean_delay": 10, "max_delay": 20}, [1797, 5166, 15540, 47736, 145419]),
        ("odaaf-v", {"mean_delay": 10, "delay_variance": 100}, [8160, 18723, 44454, 109146]),
    ],
)
def test_schedule_without_elimination(name: str, params: dict, expected: list[int]) -> None:
    """§7.7: equal means never eliminate; the phase ends (bridges counted in the phase before) are the reference's."""
    policy = make_policy(name, {**params, "horizon": 250_000}, 2)
    ends = phase_ends(policy, [0.5, 0.5], len(expected))
    if policy.bridged:  # the reference counts phase m's bridge in phase m: ours opens phase m + 1
        nus = np.diff([0] + [math.ceil(policy.n(m, 250_000)) for m in range(1, len(expected) + 1)])
        ends = [end + nu for end, nu in zip(ends, nus, strict=True)]
    assert ends == expected


def test_elimination_is_strict_at_the_tolerance() -> None:
    """§7.9: Δ̃_3 = 0.125 and X̄ = (0.60, 0.50, 0.47): a, b survive (b exactly at the boundary), c goes."""
    policy = make_policy("odaaf", {"mean_delay": 0, "horizon": 10**9}, 3)
    state = {**policy.fresh(), "m": 3, "phase_open": True, "samples": 100, "nu": 50,
             "slots": [100, 100, 100], "reward": [60.0, 47.5, 47.0]}  # fmt: skip
    plan = policy.plan(state, [], [], rng())
    assert plan.state["active"] == [0, 1]
    assert {segment.arm for segment in plan.segments} == {0, 1}
    state["reward"] = [60.0, 50.0, 47.0]
    assert policy.plan(state, [], [], rng()).state["active"] == [0, 1]


@pytest.mark.parametrize(("variance", "bias"), [(0.25, 0.0), (0.05, 0.0), (0.05, 600.0), (0.01, 60.0)])
def test_samples_needed_solves_the_bernstein_condition(variance: float, bias: float) -> None:
    """n is where Δ̃·n/2 = sqrt(8vnL) + (4/3)L + bias/2: the deviation of slot rewards of variance at most v
    (v = 1/4, the worst case in [0, 1], is the paper's sqrt(2nL)), the range term and the delay bias."""
    delta, log_t = tolerance(4), log_term(10**6, 4)
    n = samples_needed(delta, log_t, bias, variance)
    assert delta * n / 2 == pytest.approx(math.sqrt(8 * variance * n * log_t) + 4 / 3 * log_t + bias / 2)


def elimination_schedule(policy: SchedulePolicy, means: list[float]) -> tuple[list[tuple[int, int, float]], int]:
    """(m, N_m, the T of phase m) of every phase until the first elimination, and the decision it happens at
    (no noise, no delay, no horizon)."""
    plan, played, phases = policy.plan(None, [], [], rng()), 0, []
    while len(plan.state["active"]) == len(means):
        phases.append((plan.state["m"], plan.state["samples"], policy.epoch_horizon(plan.state["epoch"])))
        observed = play_all(plan, means)
        played += sum(item.slots for item in observed)
        plan = policy.plan(plan.state, observed, [], rng())
    return phases, played


def test_variance_aware_phases_are_shorter_at_low_rates() -> None:
    """Phase m >= 2 bounds the variance of a slot's reward by min(1/4, max X̄ + Δ̃_{m−1}/2), the mean bound
    that phase m − 1's guarantee |X̄ − μ| <= Δ̃_{m−1}/2 gives: at 5 % against 2 % the phases from the third on
    are shorter and the 2 % arm goes sooner than with the paper's width (``adaptive_width`` 0)."""
    means = [0.05, 0.02]
    adaptive = make_policy("odaaf", {"mean_delay": 0}, 2)
    phases, eliminated = elimination_schedule(adaptive, means)
    previous = 0
    for m, samples, horizon in phases:
        variance = 0.25 if m == 1 else min(0.25, max(means) + tolerance(m - 1) / 2)
        previous = max(math.ceil(samples_needed(tolerance(m), log_term(horizon, m), 0.0, variance)), previous)
        assert samples == previous
    _, paper_eliminated = elimination_schedule(make_policy("odaaf", {"mean_delay": 0, "adaptive_width": 0}, 2), means)
    assert eliminated < paper_eliminated / 2


@pytest.mark.parametrize("name", ["odaaf", "odaaf-b", "odaaf-v"])
def test_variance_aware_width_is_the_papers_at_rates_near_one_half(name: str) -> None:
    """With a mean of 1/2 or more among the arms the bound is the worst case 1/4: the paper's schedule."""
    params = {"mean_delay": 10, "max_delay": 20, "delay_variance": 100, "horizon": 250_000}
    params = {key: value for key, value in params.items() if key in POLICIES[name].PARAMS}
    schedules = [
        phase_ends(make_policy(name, {**params, "adaptive_width": width}, 2), [0.5, 0.6], 4) for width in (0, 1)
    ]
    assert schedules[0] == schedules[1]


def test_bridge_is_the_leader_of_the_survivors_and_discarded() -> None:
    policy = make_policy("odaaf-b", {"mean_delay": 1, "max_delay": 2, "horizon": 10**6}, 3)
    plan = policy.plan(None, [], [], rng())
    observed = play_all(plan, [0.1, 0.9, 0.8])
    plan = policy.plan(plan.state, observed, [], rng())
    bridge = plan.segments[0]
    assert (bridge.kind, bridge.arm, bridge.counted) == ("bridge", 1, False)
    assert bridge.slots == observed[0].slots  # ν_1
    assert plan.next == Next.CLOSED and not plan.hold.counted


def test_last_arm_standing_is_played_for_good() -> None:
    policy = make_policy("odaaf", {"mean_delay": 0, "horizon": 10**6}, 2)
    plan = policy.plan(None, [], [], rng())
    while plan.next != Next.NEVER:
        plan = policy.plan(plan.state, play_all(plan, [0.0, 1.0]), [], rng())
    assert plan.hold.arm == 1 and plan.state["active"] == [1]


@pytest.mark.parametrize("name", ["odaaf", "odaaf-b", "odaaf-v"])
def test_without_horizon_every_arm_gets_its_whole_block(name: str) -> None:
    """docs/anonymous-feedback.md's campaign: uniform 0–600 s delays at 20 decisions/s (E[τ] = 6,000 slots,
    d = 12,000, V = 1.2e7 in slots), no horizon. The first doubling epoch (1,024 slots) is shorter than one
    arm's block: a restart at its end cut the first block and began again on the same arm, for good. The
    T of each phase doubles until the phase fits; nothing learned is forgotten; after the first phase the
    blocks go highest estimate first."""
    facts = {"mean_delay": 6000, "max_delay": 12000, "delay_variance": 1.2e7}
    policy = make_policy(name, {k: v for k, v in facts.items() if k in POLICIES[name].PARAMS}, 3)
    plan, played, orders = policy.plan(None, [], [], rng()), 0, []
    while plan.next != Next.NEVER:
        blocks = [s for s in plan.segments if s.kind == "block"]
        assert sorted(s.arm for s in blocks) == plan.state["active"] and len({s.slots for s in blocks}) == 1
        horizon = policy.epoch_horizon(plan.state["epoch"])
        assert played + sum(s.slots for s in plan.segments) <= horizon  # the phase fits its T
        assert plan.state["samples"] == math.ceil(policy.n(plan.state["m"], horizon))
        orders.append([s.arm for s in blocks])
        observed = play_all(plan, [0.5, 0.9, 0.2])
        played += sum(item.slots for item in observed)
        plan = policy.plan(plan.state, observed, [], rng())
    assert orders[:2] == [[0, 1, 2], [1, 0]] and plan.state["active"] == [1]  # no restart


@pytest.mark.parametrize(
    ("estimate", "slots", "t", "alpha", "expected"),
    [(0.5, 10, 100, 4.0, 1.0), (0.5, 1000, 10_000, 4.0, 0.691941), (0.6, 400, 10_000, 4.5, 0.921895)],
)
def test_ars_ucb_index(estimate: float, slots: int, t: int, alpha: float, expected: float) -> None:
    policy = make_policy("ars-ucb", {"alpha": alpha}, 2)
    counts = np.array([slots, t - slots], dtype=float)
    index = policy.upper_bounds(counts, counts * estimate)
    assert index[0] == pytest.approx(expected, abs=1e-6)


def test_ars_ucb_initialisation_round_sizes_and_ties() -> None:
    """§7.1.1 and the tie rule: every index capped at 1 → the smallest N, then the smallest index; an
    arm's second round lasts f(2) = 4 slots."""
    policy = make_policy("ars-ucb", {}, 3)
    plan = policy.plan(None, [], [], rng())
    assert [(s.arm, s.slots) for s in plan.segments] == [(0, 1), (1, 1), (2, 1)]
    observed = [Observed(s, 1, r) for s, r in zip(plan.segments, [0.0, 1.0, 0.0], strict=True)]
    plan = policy.plan(plan.state, observed, [], rng())
    assert [(s.arm, s.slots) for s in plan.segments] == [(0, 4)]  # u = (1, 1, 1), N = (1, 1, 1)
    plan = policy.plan(plan.state, [Observed(plan.segments[0], 4, 4.0)], [], rng())
    assert [(s.arm, s.slots) for s in plan.segments] == [(1, 4)]  # still all capped: N = (5, 1, 1)
    assert plan.state["next_round"] == [3, 3, 2]


def test_ars_ucb_uses_late_sums_of_open_rounds() -> None:
    policy = make_policy("ars-ucb", {"alpha": 0.0}, 2)
    plan = policy.plan(None, [], [], rng())
    first, second = plan.segments
    state = policy.plan(plan.state, [Observed(first, 1, 0.2), Observed(second, 1, 0.1)], [], rng()).state
    state["next_round"] = [2, 2]
    assert policy.plan(state, [], [], rng()).segments[0].arm == 0
    assert policy.plan(state, [], [Observed(second, 1, 0.9)], rng()).segments[0].arm == 1


def test_exp3_probabilities_worked_example() -> None:
    """§7.1.3: γ = 0.1, g(K) = 10, w = (1.4, 1, 1) then w_3 = 1.101223."""
    p = mixed_probabilities(np.array([1.4, 1.0, 1.0]) / 10, 0.1)
    assert p == pytest.approx([0.341386, 0.329307, 0.329307], abs=1e-6)
    w3 = 1 + 0.1 * 1.0 / (3 * 0.329307)
    assert w3 == pytest.approx(1.101223, abs=1e-6)
    assert mixed_probabilities(np.array([1.4, 1.0, w3]) / 10, 0.1) == pytest.approx(
        [0.340359, 0.328320, 0.331321], abs=1e-6
    )
    assert mixed_probabilities(np.array([1e6, 0.0, 0.0]), 0.1).min() == pytest.approx(0.1 / 3)


def test_ars_exp3_update_follows_the_worked_example() -> None:
    policy = make_policy("ars-exp3", {"gamma": 0.1, "horizon": 10**6, "eta": 0}, 3)
    state = {**policy.fresh(0), "log_weights": [1.0, 1.0, 1.0]}
    round_one = policy.plan(state, [], [], rng()).segments[0]
    segment = type(round_one)(0, 4, True, 1 / 3, kind="round")
    state = policy.plan(state, [Observed(segment, 4, 5.2)], [], rng()).state
    assert state["log_weights"] == pytest.approx([1.4, 1.0, 1.0])


@pytest.mark.parametrize(
    ("horizon", "rounds", "total", "gamma"),
    [(10**4, 596, 10_000, 0.1376), (10**5, 2796, 99_958, 0.0638), (10**6, 13_046, 999_925, 0.0296)],
)
def test_ars_exp3_horizon_constants(horizon: int, rounds: int, total: int, gamma: float) -> None:
    assert complete_rounds(0.5, horizon) == rounds
    assert round_sizes_total(0.5, rounds) == total
    # γ of Theorem 2 with the continuous K of the table, to the table's 4 digits; ours uses the exact K
    continuous = (1.5 * horizon) ** (1 / 1.5)
    assert min(1.0, math.sqrt(9 * math.log(9) / ((math.e - 1) * continuous))) == pytest.approx(gamma, abs=1e-4)
    policy = make_policy("ars-exp3", {"horizon": horizon}, 9)
    assert policy.gamma(horizon) == pytest.approx(math.sqrt(9 * math.log(9) / ((math.e - 1) * rounds)))


def test_ars_exp3_rounds_grow_and_cover_the_horizon() -> None:
    policy = make_policy("ars-exp3", {"horizon": 10_000, "eta": 0}, 9)
    plan, sizes = policy.plan(None, [], [], rng()), []
    while sum(sizes) < 10_000:
        sizes.append(plan.segments[0].slots)
        plan = policy.plan(plan.state, [Observed(plan.segments[0], sizes[-1], 0.0)], [], rng())
    assert sizes[:5] == [1, 2, 2, 2, 3] and len(sizes) == 596 and sum(sizes) == 10_000


@pytest.mark.parametrize(("window", "mean_length"), [(10, 53.00), (20, 107.37), (9, 47.56), (11, 58.44)])
def test_clw_block_lengths(window: int, mean_length: float) -> None:
    """§7.1.5: blocks after the first last at least 2d̂ and 1/(q(1−q)^(2d̂−1)) slots on average."""
    policy = make_policy("clw", {"max_delay": window, "horizon": 10**6}, 7)
    generator = np.random.default_rng(3)
    plan = policy.plan(None, [], [], generator)
    lengths = []
    for _ in range(3000):
        plan = policy.plan(plan.state, [], [], generator)
        lengths.append(sum(segment.slots for segment in plan.segments))
        assert plan.segments[-1].counted and plan.segments[-1].slots == window
        assert all(not segment.counted for segment in plan.segments[:-1])
    assert min(lengths) >= 2 * window
    # the length is 2d̂ − 1 plus a waiting time with standard deviation below its mean
    assert np.mean(lengths) == pytest.approx(mean_length, abs=4 * mean_length / math.sqrt(len(lengths)))


@pytest.mark.parametrize(("window", "gamma"), [(10, 0.052192), (20, 0.073807)])
def test_clw_gamma(window: int, gamma: float) -> None:
    assert make_policy("clw", {"max_delay": window}, 7).gamma(10**5) == pytest.approx(gamma, abs=1e-6)


def test_clw_feeds_the_tail_sum_over_two_d() -> None:
    policy = make_policy("clw", {"max_delay": 10, "gamma": 0.1, "horizon": 10**6, "eta": 0}, 2)
    plan = policy.plan(None, [], [], rng())
    tail = plan.segments[-1]
    state = policy.plan(plan.state, [Observed(tail, 10, 5.0)], [], rng()).state
    expected = [0.0, 0.0]
    expected[tail.arm] = 0.1 * (5.0 / 20) / (2 * tail.propensity)
    assert state["log_weights"] == pytest.approx(expected)


def test_qpm_d_plays_ucb1_on_resolved_pulls() -> None:
    from latebandit.policies import ArmStats

    policy = make_policy("qpm-d", {}, 3)
    stats = ArmStats(
        pulls=np.array([[10.0, 5.0, 3.0]]), conversions=np.array([[4.0, 2.0, 0.0]]),
        effective=np.zeros((1, 3)), t=np.array([19.0]), pending=np.array([[2.0, 1.0, 3.0]]),
    )  # fmt: skip
    assert policy.choose(stats, rng()).arm.tolist() == [2]  # arm 2: nothing resolved yet
    stats = ArmStats(stats.pulls, stats.conversions, stats.effective, stats.t, pending=np.array([[2.0, 1.0, 1.0]]))
    resolved = np.array([8.0, 4.0, 2.0])
    expected = np.array([4.0, 2.0, 0.0]) / resolved + np.sqrt(2 * math.log(14) / resolved)
    assert policy.index(stats)[0] == pytest.approx(expected)
    assert policy.choose(stats, rng()).arm.tolist() == [int(np.argmax(expected))]


@pytest.mark.parametrize(("name", "params", "regret"), [("odaaf", {}, 2157.4), ("odaaf-b", {"max_delay": 20}, 1591.2)])
def test_noise_free_regret_of_the_reference_setting(name: str, params: dict, regret: float) -> None:
    """Pike-Burke et al. 2018, §5: K = 2, means 0.5 / 0.6, T = 250,000, E[τ] = 10. With exact means the 0.5
    arm is eliminated at the end of phase 4 (2^−4 < 0.1), so the regret is 0.1 × its plays: 0.1·N_4 =
    2157.4 for ODAAF; ODAAF-B's bridges play the leader, so 0.1·N_4^B = 1591.2 (an independent simulation)."""
    horizon = 250_000
    policy = make_policy(name, {"mean_delay": 10, "horizon": horizon, **params}, 2)
    plan, bad_plays, played = policy.plan(None, [], [], rng()), 0, 0
    while plan.next != Next.NEVER:
        observed = play_all(plan, [0.5, 0.6])
        bad_plays += sum(item.slots for item in observed if item.segment.arm == 0)
        played += sum(item.slots for item in observed)
        plan = policy.plan(plan.state, observed, [], rng())
    assert plan.state["active"] == [1] and plan.state["m"] == 5 and played < horizon
    assert 0.1 * bad_plays == pytest.approx(regret, abs=1e-9)


def test_clw_plans_a_block_for_a_bound_of_millions_of_slots() -> None:
    """A bound of 3.6M slots (a heavy-tailed delay at a high rate): 2d̂ dwarfs any chunk of coins, so the
    first draws may hold no coin 1 at all; the plan must still come, with its block at least 2d̂ long."""
    window = 3_600_000
    policy = make_policy("clw", {"max_delay": window}, 4)
    for seed in range(3):
        generator = np.random.default_rng(seed)
        plan = policy.plan(None, [], [], generator)
        plan = policy.plan(plan.state, [], [], generator)
        assert sum(segment.slots for segment in plan.segments) >= 2 * window
        assert plan.segments[-1].counted and plan.segments[-1].slots == window


def test_ars_ucb_width_uses_a_variance_bound_at_small_rates() -> None:
    """At 5 % the width uses v = min(1/4, ŝ + sqrt(ln t / N)) = 0.0826 instead of 1/4: u = 0.0764 where
    the paper's width (``adaptive_width`` 0) gives 0.0960; at ŝ = 0.5 both are the paper's index."""
    counts = np.array([10_000.0, 30_000.0])
    log_t = math.log(40_000)
    variance = 0.05 + math.sqrt(log_t / 10_000)
    adaptive = make_policy("ars-ucb", {"alpha": 2.0}, 2).upper_bounds(counts, counts * 0.05)
    paper = make_policy("ars-ucb", {"alpha": 2.0, "adaptive_width": 0}, 2).upper_bounds(counts, counts * 0.05)
    assert adaptive[0] == pytest.approx(0.05 + math.sqrt(4 * variance * 2.0 * log_t / 10_000), rel=1e-12)
    assert paper[0] == pytest.approx(0.05 + math.sqrt(2.0 * log_t / 10_000), rel=1e-12)
    assert (adaptive[0], paper[0]) == pytest.approx((0.0764, 0.0960), abs=1e-4)
    halves = [make_policy("ars-ucb", {"adaptive_width": w}, 2).upper_bounds(counts, counts * 0.5) for w in (0, 1)]
    assert halves[0] == pytest.approx(halves[1], rel=1e-15)


@pytest.mark.parametrize("name", ["odaaf", "odaaf-b", "odaaf-v"])
def test_a_horizon_too_short_for_a_first_phase_is_not_a_division_by_zero(name: str) -> None:
    """With T·Δ̃₁² ≤ e the plan exploits at once and the first block is empty: the refusal check must read
    that as no delay share (it divided 0 by 0, and POST /campaigns answered 500)."""
    from latebandit.campaign import CampaignSpec

    spec = CampaignSpec.model_validate({
        "id": "short", "arms": ["a", "b"], "policy": {"name": name, "params": {"horizon": 10}},
        "delay": {"family": "fixed", "value": 1}, "slot_seconds": 1,
    })  # fmt: skip
    assert spec.policy.name == name
