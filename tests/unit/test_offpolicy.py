"""Off-policy evaluation (``replay --policy``) on simulated logs whose true value is known.

The true value of a policy that plays a fixed distribution π is Σ_a π(a)·θ_a·F(m) (``true_value``); for
an adaptive policy it is measured here by an independent, plain-Python play of the policy on the same
kind of world. Coverage is checked over many independent logs: the 95 % interval must contain the truth
at least 88 % of the time (the count of covering intervals is Binomial(n, 0.95); 88 % is more than 3
standard deviations below 95 % for n = 100), and its width must match the estimates' spread across logs.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import pytest

from latebandit.policies import POLICIES, ArmStats, Choice, Policy, make_policy
from latebandit.replay.evaluate import evaluate, target_campaign
from latebandit.replay.logged import NotEvaluable, read_campaign_log
from latebandit.replay.reenact import reenact
from latebandit.sim.logs import simulated_logs, true_value
from latebandit.sim.scenario import scenario_from_mapping
from latebandit.timeutil import MICROS, format_time

ARMS = [0.5, 0.3, 0.2]
LOGS = 100
MIN_COVERAGE = 0.88


def scenario(logging: dict[str, Any], horizon: int = 800, seed: int = 7) -> Any:
    return scenario_from_mapping({
        "horizon": horizon, "runs": LOGS, "seed": seed, "arms": ARMS,
        "delay": {"family": "exponential", "mean": 20}, "window": 60, "policies": [logging],
    })  # fmt: skip


def check_calibrated(estimates: list[Any], truth: float) -> None:
    """Coverage, no bias beyond 4 standard errors, and intervals as wide as the estimates' real spread."""
    values = np.array([e.value for e in estimates])
    covered = np.mean([e.ci95[0] <= truth <= e.ci95[1] for e in estimates])
    assert covered >= MIN_COVERAGE, f"coverage {covered:.3f}"
    spread = values.std(ddof=1)
    assert abs(values.mean() - truth) < 4 * spread / math.sqrt(values.size)
    half = np.mean([(e.ci95[1] - e.ci95[0]) / 2 for e in estimates])
    assert 0.7 < half / (1.96 * spread) < 1.4


LOGGING = {
    "uniform": {"name": "uniform"},
    "fixed-with-floor": {"name": "fixed", "params": {"arm": 2}, "exploration_floor": 0.1},
    "ucb1-with-floor": {"name": "ucb1", "exploration_floor": 0.05},
}
TARGETS = {"uniform": ({}, [1 / 3] * 3), "fixed": ({"arm": 0}, [1.0, 0.0, 0.0])}


@pytest.fixture(scope="module", params=list(LOGGING))
def logged(request) -> tuple[str, Any, list[Any]]:
    world = scenario(LOGGING[request.param])
    return request.param, world, [read_campaign_log(lines, None, None) for lines in simulated_logs(world)]


@pytest.mark.parametrize("target", list(TARGETS))
def test_intervals_cover_the_true_value(logged, target: str) -> None:
    _, world, logs = logged
    params, distribution = TARGETS[target]
    evaluations = [evaluate(log, target, params) for log in logs]
    for estimator in ("replay", "ips", "snips", "doubly-robust"):
        check_calibrated(
            [evaluation.estimates[estimator] for evaluation in evaluations], true_value(world, distribution)
        )


def test_default_estimator_is_replay_on_uniform_logs_and_doubly_robust_otherwise(logged) -> None:
    name, _, logs = logged
    done: list[int] = []
    evaluation = evaluate(logs[0], "uniform", {}, progress=done.append)
    assert sum(done) == len(logs[0].decisions) // 500 * 500 > 0  # the CLI's progress bar
    assert evaluation.primary.estimator == ("replay" if name == "uniform" else "doubly-robust")
    document = evaluation.contract()
    assert set(document) == {"policy", "estimator", "value", "ci95", "effective_sample_size"}
    assert document["ci95"][0] <= document["value"] <= document["ci95"][1]


def play_directly(policy_name: str, horizon: int, keep: float, seed: int) -> float:
    """The policy's own play, written here without the service's code: it decides at the integer times
    kept with probability ``keep`` (what the replay of a uniform log accepts), sees each conversion once
    its exponential delay has elapsed, and earns θ_a·F(m) in expectation per decision."""
    rng = np.random.default_rng(seed)
    policy = make_policy(policy_name, {}, len(ARMS))
    pulls, conversions = np.zeros(len(ARMS)), np.zeros(len(ARMS))
    arriving: list[tuple[float, int]] = []
    earned, steps, counted = 0.0, 0, 0
    within = 1 - math.exp(-60 / 20)
    for now in range(horizon):
        if rng.random() >= keep:
            continue
        for occurred, arm in [item for item in arriving if item[0] <= now]:
            conversions[arm] += 1
            arriving.remove((occurred, arm))
        stats = ArmStats(pulls[None].copy(), conversions[None].copy(), pulls[None].copy(), np.array([steps + 1]))
        arm = int(policy.choose(stats, rng).arm[0])
        pulls[arm] += 1
        steps += 1
        if now <= horizon - 61:  # the replay knows the reward of decisions whose window closed in the log
            earned, counted = earned + ARMS[arm] * within, counted + 1
        delay = rng.exponential(20)
        if rng.random() < ARMS[arm] and delay <= 60:
            arriving.append((now + delay, arm))
    return earned / counted


@pytest.mark.slow
def test_replay_of_an_adaptive_policy_matches_its_own_play() -> None:
    world = scenario({"name": "uniform"}, horizon=1500, seed=11)
    logs = [read_campaign_log(lines, None, None) for lines in simulated_logs(world, runs=40)]
    estimates = np.array([evaluate(log, "ucb1", {}).primary.value for log in logs])
    direct = np.array([play_directly("ucb1", 1500, 1 / 3, seed) for seed in range(100)])
    error = math.sqrt(estimates.var(ddof=1) / estimates.size + direct.var(ddof=1) / direct.size)
    assert abs(estimates.mean() - direct.mean()) < 4 * error
    assert direct.mean() > true_value(world, [1 / 3] * 3) + 0.05  # it learns: the comparison has teeth


# --- refusals ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("logging", [{"name": "fixed", "params": {"arm": 1}}, {"name": "ucb1"}])
def test_a_deterministic_log_is_refused_for_another_policy(logging: dict[str, Any]) -> None:
    world = scenario(logging, horizon=600)
    log = read_campaign_log(simulated_logs(world, runs=1)[0], None, None)
    with pytest.raises(NotEvaluable, match="deterministic"):
        evaluate(log, "uniform", {})


def test_a_deterministic_log_still_evaluates_its_own_policy() -> None:
    """On-policy, every weight is 1: every estimator returns the mean logged reward."""
    log = read_campaign_log(simulated_logs(scenario({"name": "fixed", "params": {"arm": 1}}, 600), 1)[0], None, None)
    known = [d.reward for d in log.decisions if d.reward is not None]
    for estimator in ("replay", "ips", "snips", "doubly-robust"):
        evaluation = evaluate(log, "fixed", {"arm": "arm1"}, estimator=estimator)
        assert evaluation.primary.value == pytest.approx(np.mean(known), rel=1e-12)
        assert evaluation.steps == evaluation.decisions


def campaign_line(**extra: Any) -> dict[str, Any]:
    return {"type": "campaign", "id": "c", "arms": ["a", "b"], "policy": {"name": "uniform", "params": {}},
            "delay": {"family": "exponential", "mean": 5}, "window": 30, "created_at": format_time(0),
            **extra}  # fmt: skip


def decision(n: int, arm: str, at: float, propensity: Any = 0.5) -> dict[str, Any]:
    return {"type": "decision", "campaign": "c", "decision_id": f"d{n}", "arm": arm,
            "at": format_time(round(at * MICROS)), "propensity": propensity}  # fmt: skip


def conversion(n: int, occurred: float) -> dict[str, Any]:
    return {"type": "conversion", "campaign": "c", "decision_id": f"d{n}", "event_id": f"e{n}",
            "occurred_at": format_time(round(occurred * MICROS))}  # fmt: skip


@pytest.mark.parametrize("propensity", [None, 0, 1.5, "0.5", float("nan")])
def test_a_decision_without_a_valid_propensity_is_refused(propensity: Any) -> None:
    lines = [campaign_line(), decision(1, "a", 1), decision(2, "b", 100)]
    lines[1]["propensity"] = propensity
    with pytest.raises(NotEvaluable, match="propensity"):
        read_campaign_log(lines, None, None)


def test_a_log_shorter_than_its_window_is_refused() -> None:
    log = read_campaign_log([campaign_line(), decision(1, "a", 1), decision(2, "b", 20)], None, None)
    with pytest.raises(NotEvaluable, match="window"):
        evaluate(log, "uniform", {})


def test_an_unknown_policy_or_bad_params_are_refused_by_name() -> None:
    log = read_campaign_log([campaign_line(), decision(1, "a", 1), decision(2, "b", 100)], None, None)
    with pytest.raises(NotEvaluable, match="nope"):
        evaluate(log, "nope", {})
    with pytest.raises(NotEvaluable, match="epsilon"):
        evaluate(log, "ucb1", {"epsilon": -1})


# --- delays are re-enacted -----------------------------------------------------------------------------


class Spy(Policy):
    """Uniform, and records what it was shown at every call (delay-corrected: asked at every decision)."""

    name: ClassVar[str] = "spy"
    delay_corrected: ClassVar[bool] = True
    reports_probabilities: ClassVar[bool] = True
    seen: ClassVar[list[ArmStats]] = []

    def effective_pulls(self, stats: ArmStats) -> np.ndarray:
        return stats.effective

    def choose(self, stats: ArmStats, rng: np.random.Generator) -> Choice:
        Spy.seen.append(stats)
        runs, arms = np.shape(stats.pulls)
        return Choice(np.zeros(runs, dtype=np.int64), np.full(runs, 1 / arms), np.full((runs, arms), 1 / arms))


def test_the_evaluated_policy_sees_each_conversion_at_its_time_never_earlier(monkeypatch) -> None:
    """Decisions every second, conversions 0 to 45 s later (window 30 s, so some are censored): at each
    decision the policy's counts must be exactly those of the accepted decisions whose conversion occurred
    by then within the window, and Ñ the brute-force Σ F(min(age, m)) over its own earlier pulls."""
    monkeypatch.setitem(POLICIES, "spy", Spy)
    Spy.seen = []
    rng = np.random.default_rng(5)
    lines: list[dict[str, Any]] = [campaign_line()]
    occurred: dict[int, float] = {}
    for n in range(400):
        lines.append(decision(n, "ab"[int(rng.integers(2))], n + 1.0))
        if rng.random() < 0.6:
            occurred[n] = n + 1.0 + float(rng.uniform(0, 45))
    lines += [conversion(n, at) for n, at in occurred.items()]
    log = read_campaign_log(lines, None, None)
    campaign = target_campaign(log.campaign, "spy", {})
    played = reenact(log, campaign, 100.0, np.random.default_rng(0))
    assert len(Spy.seen) == len(log.decisions)
    mean = 5.0
    delayed_at_some_point = 0
    for k, (decision_k, stats) in enumerate(zip(log.decisions, Spy.seen, strict=True)):
        now = decision_k.at / MICROS
        earlier = [j for j in range(k) if played.accepted[j]]
        counted = np.zeros(2)
        logged_by_then = 0
        for j in earlier:
            arm = log.decisions[j].arm
            at_j = log.decisions[j].at / MICROS
            if j in occurred and occurred[j] - at_j <= 30:
                logged_by_then += 1
                counted[arm] += occurred[j] <= now
        np.testing.assert_array_equal(stats.conversions[0], counted)
        np.testing.assert_array_equal(stats.pulls[0], np.bincount([log.decisions[j].arm for j in earlier], minlength=2))
        effective = np.zeros(2)
        for j in earlier:
            age = min(now - log.decisions[j].at / MICROS, 30.0)
            effective[log.decisions[j].arm] += 1 - math.exp(-age / mean)
        # exact (exponential moments) but for the bucket straddling the window's edge: at most one pull
        # here, off by at most F(m) − F(m − w) (service/latebandit/engine/exposure.py)
        np.testing.assert_allclose(stats.effective[0], effective, rtol=0, atol=math.exp(-6 + 30 / 64 / 5))
        delayed_at_some_point += logged_by_then > counted.sum()
    assert delayed_at_some_point > 100  # the log makes the timing matter at most decisions
    assert 0.4 < played.accepted.mean() < 0.6  # uniform on a uniform log: M = 2, acceptance 1/2


def test_rewards_count_within_the_window_and_stay_unknown_while_it_is_open() -> None:
    lines = [campaign_line(), decision(1, "a", 1), decision(2, "b", 2), decision(3, "a", 3), decision(4, "b", 90)]
    lines += [conversion(1, 20), conversion(2, 40), conversion(4, 95)]
    log = read_campaign_log(lines, None, None)
    assert [d.reward for d in log.decisions] == [1.0, 0.0, 0.0, None]  # d2 converted after its 30 s window
    cut = read_campaign_log(lines, None, round(25 * MICROS))
    assert [d.reward for d in cut.decisions] == [None, None, None]  # --at cuts the log: windows still open


def test_a_revenue_log_rewards_a_decision_with_its_values_in_value_units() -> None:
    """``sum``: a decision's conversions within the window add up, capped at max; ``first``: the first counts."""
    values = [(1, 10, 120.0), (1, 12, 100.0), (1, 50, 70.0), (2, 5, 200.0), (2, 6, 80.0), (3, 4, 30.0)]
    events = [{**conversion(n, occurred), "event_id": f"e{n}-{occurred}", "value": value}
              for n, occurred, value in values]  # fmt: skip
    decisions = [decision(1, "a", 1), decision(2, "b", 2), decision(3, "a", 3), decision(4, "b", 4)]
    revenue = campaign_line(reward={"max": 250.0, "per_decision": "sum"})
    log = read_campaign_log([revenue, *decisions, *events], None, None)
    assert [d.reward for d in log.decisions] == [220.0, 250.0, 30.0, 0.0]  # d1's third is after its window
    first = campaign_line(reward={"max": 250.0})
    assert [d.reward for d in read_campaign_log([first, *decisions, *events], None, None).decisions] == [
        120.0, 200.0, 30.0, 0.0
    ]  # fmt: skip
