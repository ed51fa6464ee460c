"""guha-bayes at realistic rates: the campaign's declared decision rate counts the delay in decisions, the
service's window and the plan's steps grow with the delay and the rate so that a plan is solvable and
serves long enough, and a plan on steps (blockstream_steps.py) is used: every arm early, then the best."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from latebandit.campaign import Campaign, CampaignSpec
from latebandit.policies import ArmStats, make_policy
from latebandit.policies.blockstream import ArmShape, BlockStreamArm
from latebandit.policies.blockstream_steps import SteppedArm, StepShape
from latebandit.policies.guha import MAX_DELAY_STEPS, PLAN_SECONDS, STEP_SECONDS, GuhaBayes
from latebandit.sim.runner import run_policy
from latebandit.sim.scenario import scenario_from_mapping

W1 = {"id": "w1", "arms": ["a", "b", "c", "d"], "policy": {"name": "guha-bayes"},
      "delay": {"family": "pareto", "alpha": 1.5, "scale": 60}}  # fmt: skip


def guha(body: dict) -> GuhaBayes:
    """The policy of a campaign created with ``body``, as the service builds it."""
    impl = Campaign(**CampaignSpec.model_validate(body).model_dump()).policy_impl
    assert isinstance(impl, GuhaBayes)
    return impl


def test_the_campaigns_declared_rate_counts_the_delay_in_decisions() -> None:
    """W1 at 20 decisions/s: the 95 % delay (442.1 s) is 8,842 decisions, not the 443 of 1/s; params still win."""
    declared = guha({**W1, "decisions_per_second": 20}).params()
    assert declared["decisions_per_second"] == 20 and declared["delay"] == 8842
    assert guha(W1).params()["delay"] == 443  # none declared: 1/s, as the resolved params say
    own = {**W1, "decisions_per_second": 20, "policy": {"name": "guha-bayes", "params": {"decisions_per_second": 5}}}
    assert guha(own).params()["delay"] == 2211


def test_the_service_window_outlives_the_solve_and_opens_every_arm_within_minutes() -> None:
    """At 20, 100 and 1,000 decisions a second the rolling window is at least PLAN_SECONDS of traffic (a plan
    re-rooted at half of it serves 5 minutes, its solve takes seconds), in at most 64 steps of about a
    minute of traffic (every arm's first block), with δ counted in at most MAX_DELAY_STEPS steps."""
    for rate in (20, 100, 1000):
        policy = guha({**W1, "decisions_per_second": rate})
        horizon, unit = policy.params()["horizon"], policy.params()["unit"]
        steps, delay = policy.steps()
        assert horizon >= PLAN_SECONDS * rate and steps <= 64 and delay <= MAX_DELAY_STEPS
        assert unit <= 1.5 * STEP_SECONDS * rate


def test_steps_of_one_decision_approximate_the_exact_dp() -> None:
    """With unit 1 the DP on steps is the exact one with the posterior on a grid of means: its V, R and N
    stay within 12 % of blockstream.py's (spec T4 settings and a longer horizon)."""
    for horizon, delay, lam in [(10, 2, 0.5), (30, 2, 0.6), (30, 5, 0.7)]:
        exact = BlockStreamArm(ArmShape(1, 1, horizon, delay, horizon)).solve(lam)
        steps = SteppedArm(StepShape(1.0, 1.0, horizon, delay, 1)).solve(lam)
        assert steps.value == pytest.approx(steps.reward - lam * steps.plays, abs=1e-9)
        assert steps.reward == pytest.approx(exact.reward, rel=0.12)
        assert steps.plays == pytest.approx(exact.plays, rel=0.12)


def test_plays_do_not_grow_with_the_multiplier_on_steps() -> None:
    arm = SteppedArm(StepShape(1.0, 1.0, 40, 3, 500))
    plays = [arm.solve(lam).plays for lam in (0.2, 0.4, 0.6, 0.8)]
    assert all(a >= b - 1e-9 for a, b in itertools.pairwise(plays))


def test_a_plan_on_steps_plays_every_arm_early_then_mostly_the_best() -> None:
    """Rates of a few percent, a fixed delay of 600 decisions, 12,000 decisions: the exact DP could not be
    solved (the scenario was refused); on steps the plan opens every arm within the first tenth and ends
    with less than half of uniform's regret."""
    scenario = scenario_from_mapping(
        {"horizon": 12_000, "runs": 6, "seed": 3, "arms": [0.05, 0.04, 0.03, 0.02],
         "delay": {"family": "fixed", "value": 600}, "policies": [{"name": "guha-bayes"}, {"name": "uniform"}]}
    )  # fmt: skip
    policy = make_policy("guha-bayes", {}, 4, scenario.setting)
    assert policy.params()["unit"] > 1
    fresh = ArmStats(np.zeros((1, 4)), np.zeros((1, 4)), np.zeros((1, 4)), np.ones(1))
    assert policy.prepare(fresh).wants(fresh).any()  # the plan, not the fallback, opens
    opened: list[np.ndarray] = []

    def observe(n: int, choice: object, pull: object) -> None:
        if n <= scenario.horizon // 10:
            opened.append(np.asarray(choice.arm))  # type: ignore[attr-defined]

    planned = run_policy(scenario, scenario.policies[0], observe=observe)
    uniform = run_policy(scenario, scenario.policies[1])
    early = np.stack(opened)
    assert all(set(early[:, r].tolist()) == {0, 1, 2, 3} for r in range(scenario.runs))
    assert planned.final.mean() < 0.5 * uniform.final.mean()


def test_a_plan_whose_arms_all_quit_is_solved_again_after_a_delay() -> None:
    """Every arm failed its first plays: the plan wants none, so once a delay (δ + 1 steps) has passed since it
    started, a new one is due, re-rooted at the posteriors (an empty active set, docs/design-notes.md); not before."""
    fresh = ArmStats(np.zeros((1, 2)), np.zeros((1, 2)), np.zeros((1, 2)), np.ones(1))
    planned = make_policy("guha-bayes", {"horizon": 40, "delay": 2}, 2).prepare(fresh)
    failed = [[6.0, 6.0]]

    def at(t: int) -> ArmStats:
        return ArmStats(np.array(failed), np.zeros((1, 2)), np.array(failed), np.array([t]))

    assert not planned.wants(at(13)).any()
    assert not planned.replan_due(at(3)) and planned.replan_due(at(4))


def test_a_decision_walks_the_plan_once_and_a_change_of_statistics_walks_it_again(monkeypatch) -> None:
    """``replan_due`` and ``choose`` of the same statistics share one walk of the plan's tables (most of a
    decision's cost); statistics that changed, even in the same arrays, are walked afresh."""
    fresh = ArmStats(np.zeros((1, 3)), np.zeros((1, 3)), np.zeros((1, 3)), np.ones(1))
    planned = make_policy("guha-bayes", {"horizon": 30, "delay": 2}, 3).prepare(fresh)
    walks: list[int] = []
    walk = planned._walk_plan
    monkeypatch.setattr(planned, "_walk_plan", lambda plan, stats: walks.append(1) or walk(plan, stats))
    stats = ArmStats(np.array([[3, 0, 0]]), np.zeros((1, 3)), np.zeros((1, 3)), np.array([4]))  # arm 0's block waits
    assert not planned.replan_due(stats) and planned.choose(stats, np.random.default_rng(0)).arm.tolist() == [1]
    assert len(walks) == 1
    stats.pulls[0, 1] = 3  # arm 1's block goes out too, in the same array
    assert planned.wants(stats).tolist() == [[False, False, True]] and len(walks) == 2
    assert planned.choose(stats, np.random.default_rng(0)).arm.tolist() == [2]
    assert not planned.wants(stats).flags.writeable  # shared by the calls: nobody may change it
