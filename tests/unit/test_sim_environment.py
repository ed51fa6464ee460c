"""The simulated world: delays against their models (DKW bound), exact censoring and reveal timing, the
anonymous and composite views against the attributed one, bounded rewards, the calendar's spill path,
and the per-run worlds (a run alone sees what it sees in a batch)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from latebandit.delays.models import delay_from_spec
from latebandit.sim import environment
from latebandit.sim.environment import Calendar, Environment, Pull
from latebandit.sim.scenario import scenario_from_mapping

CRITEO_LIKE = {
    "family": "mixture",
    "weights": [0.33, 0.18, 0.49],
    "components": [{"family": "exponential", "mean": m} for m in (0.75, 78.0, 1008.0)],
}
FAMILIES = [
    {"family": "geometric", "p": 0.05},
    {"family": "exponential", "mean": 7.5},
    {"family": "pareto", "alpha": 1.1, "scale": 2.0},  # heavy tail: infinite variance
    {"family": "uniform", "low": 2.0, "high": 30.0},
    {"family": "fixed", "value": 4.0},
    {"family": "empirical", "quantiles": [[0, 0.2], [3, 0.5], [10, 0.9]]},  # 10 % never observed
    CRITEO_LIKE,
]


def scenario(delay: Any, **overrides: Any) -> Any:
    data = {
        "horizon": 400,
        "runs": 50,
        "seed": 3,
        "arms": [1.0, 1.0, 1.0],
        "delay": delay,
        "policies": [{"name": "uniform"}],
    } | overrides
    return scenario_from_mapping(data)


def play(env: Environment, rounds: int, seed: int = 0) -> tuple[list[Pull], list[np.ndarray]]:
    """Random arms for ``rounds`` rounds; the pulls and the per-arm arrivals of every round."""
    rng = np.random.default_rng(seed)
    pulls, arrivals = [], []
    for _ in range(rounds):
        pulls.append(env.pull(rng.integers(0, env.scenario.n_arms, env.runs)))
        arrivals.append(env.end_round())
    return pulls, arrivals


def expected_arrivals(pulls: list[Pull], n_arms: int, window: float, spread: int | list[float] = 1) -> np.ndarray:
    """(T, R, K) brute force: each counted pull pays X·w_j (w_j = 1/spread for an integer spread) at the end
    of round s + ⌈D⌉ + j, for the parts with D + j <= window, within the horizon."""
    fractions = [1.0 / spread] * spread if isinstance(spread, int) else spread
    horizon, runs = len(pulls), pulls[0].arms.size
    out = np.zeros((horizon, runs, n_arms))
    for s, pull in enumerate(pulls):
        for r in range(runs):
            value, delay = pull.values[r], pull.delays[r]
            for part, fraction in enumerate(fractions):
                due = s + math.ceil(delay) + part if math.isfinite(delay) else horizon
                if value > 0 and delay + part <= window and due < horizon:
                    out[due, r, pull.arms[r]] += value * fraction
    return out


@pytest.mark.parametrize("spec", FAMILIES, ids=lambda spec: spec["family"] + str(len(spec)))
def test_reveal_lags_follow_the_delay_cdf(spec: dict[str, Any]) -> None:
    """P(revealed within a rounds) = τ(a) at integer ages: the convention the accounting assumes."""
    env = Environment(scenario(spec, runs=200, horizon=300))
    pulls, _ = play(env, 300)
    lags = np.concatenate([np.where(p.counted, p.lags, np.iinfo(np.int64).max) for p in pulls]).astype(float)
    ages = np.arange(0, 200)
    empirical = (lags[:, None] <= ages[None, :]).mean(axis=0)
    bound = math.sqrt(math.log(2 / 1e-6) / (2 * lags.size))  # DKW, fails with probability 1e-6
    assert np.abs(empirical - delay_from_spec(spec).cdf(ages)).max() <= bound


def test_delay_per_arm_uses_each_arms_model() -> None:
    specs = [FAMILIES[0], FAMILIES[2], FAMILIES[6]]
    env = Environment(scenario(specs, runs=300, horizon=200))
    pulls, _ = play(env, 200)
    arms = np.concatenate([p.arms for p in pulls])
    lags = np.concatenate([p.lags for p in pulls]).astype(float)
    for k, spec in enumerate(specs):
        mine = lags[arms == k]
        ages = np.arange(100)
        empirical = (mine[:, None] <= ages).mean(axis=0)
        assert np.abs(empirical - delay_from_spec(spec).cdf(ages)).max() <= math.sqrt(math.log(2e6) / (2 * mine.size))


@pytest.mark.parametrize("window", [0, 5, 40])
def test_censoring_is_exact_and_arrivals_come_at_the_reveal_round(window: int) -> None:
    """A delay of exactly m counts, m + 1 does not; every counted conversion arrives at s + ⌈D⌉, once."""
    specs = [{"family": "fixed", "value": window}, {"family": "fixed", "value": window + 1}, FAMILIES[2]]
    env = Environment(scenario(specs, window=window, arms=[1.0, 0.7, 0.4], horizon=150))
    pulls, arrivals = play(env, 150)
    for pull in pulls:
        assert np.array_equal(pull.counted, (pull.values > 0) & (pull.delays <= window))
        assert not pull.counted[pull.arms == 1].any() and pull.counted[(pull.arms == 0) & (pull.values > 0)].all()
    np.testing.assert_allclose(np.stack(arrivals), expected_arrivals(pulls, 3, window), atol=1e-12)


def test_uncensored_arrivals_match_the_brute_force() -> None:
    env = Environment(scenario(CRITEO_LIKE, arms=[0.5, 0.3, 0.2], horizon=250))
    pulls, arrivals = play(env, 250)
    np.testing.assert_allclose(np.stack(arrivals), expected_arrivals(pulls, 3, math.inf), atol=1e-12)


@pytest.mark.parametrize(
    ("feedback", "spread"),
    [("anonymous", 1), ("composite", 1), ("composite", 7), ("composite", [0.4, 0.0, 0.3, 0.2, 0.1])],
)
def test_anonymous_and_composite_views_sum_the_attributed_rewards(feedback: str, spread: int | list[float]) -> None:
    """The same world under each view: anonymous = attributed summed over arms, round by round;
    composite spreads each reward over ``spread`` rounds (spread 1 = anonymous), and a part later than
    the window is lost."""
    base = {"arms": [0.6, 0.3, 0.1], "window": 25, "horizon": 300}
    extra = {"spread": spread} if feedback == "composite" else {}
    attributed = Environment(scenario(FAMILIES[1], **base))
    other = Environment(scenario(FAMILIES[1], feedback=feedback, **base, **extra))
    rng = np.random.default_rng(5)
    pulls = []
    for _ in range(300):
        arms = rng.integers(0, 3, attributed.runs)
        pulls.append(attributed.pull(arms))
        other.pull(arms)
        per_arm, seen = attributed.end_round(), other.observe(other.end_round())
        assert seen.shape == (attributed.runs,)
        if spread == 1:
            np.testing.assert_allclose(seen, per_arm.sum(axis=1), atol=1e-12)
    brute = expected_arrivals(pulls, 3, 25, spread).sum(axis=2)
    replay = Environment(scenario(FAMILIES[1], feedback=feedback, **base, **extra))
    for s, pull in enumerate(pulls):
        replay.pull(pull.arms)
        np.testing.assert_allclose(replay.observe(replay.end_round()), brute[s], atol=1e-12)


@pytest.mark.parametrize(
    ("delay", "extra"),
    [(FAMILIES[1], {"window": 25}), (CRITEO_LIKE, {}), (FAMILIES[1], {"feedback": "composite", "spread": [0.7, 0.3]})],
)
def test_blocks_of_rounds_give_the_arrivals_of_single_rounds(delay: Any, extra: dict[str, Any]) -> None:
    """``pull_block`` is ``pull`` repeated with the same arms: the same world, the same arrivals round by
    round (the spill of long delays included: a small ring forces it)."""
    data = {"arms": [0.6, 0.3, 0.1], "horizon": 3000} | extra
    single, blocked = Environment(scenario(delay, **data)), Environment(scenario(delay, **data))
    blocked._calendar = Calendar(blocked.runs, 3, 40)  # a ring far shorter than the delays
    single._calendar = Calendar(single.runs, 3, 40)
    rng = np.random.default_rng(9)
    while blocked.round <= 3000:
        rounds = int(min(rng.integers(1, 200), blocked.longest_block(), 3001 - blocked.round))
        arms = rng.integers(0, 3, blocked.runs)
        blocked.pull_block(arms, rounds)
        got = blocked.end_block(rounds)
        for row in range(rounds):
            single.pull(arms)
            np.testing.assert_allclose(got[row], single.end_round(), rtol=1e-12, atol=1e-12)


def test_bounded_rewards_have_the_arm_means() -> None:
    env = Environment(scenario(FAMILIES[0], reward="bounded", arms=[0.0, 0.35, 1.0], runs=400, horizon=300))
    pulls, _ = play(env, 300)
    arms = np.concatenate([p.arms for p in pulls])
    values = np.concatenate([p.values for p in pulls])
    assert values.min() >= 0.0 and values.max() <= 1.0
    assert np.all(values[arms == 0] == 0.0) and np.all(values[arms == 2] == 1.0)
    inner = values[arms == 1]
    assert abs(inner.mean() - 0.35) < 5 * math.sqrt(0.35 * 0.65 / 3 / inner.size)  # Beta(0.7, 1.3) variance
    assert 0.0 < inner.min() < inner.max() < 1.0  # not Bernoulli


def test_calendar_spill_gives_the_same_arrivals(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dues beyond a tiny ring wait in the spill list and still arrive in their round."""
    spec = scenario(FAMILIES[2], arms=[0.5, 0.4, 0.3], horizon=300)
    _, roomy = play(Environment(spec), 300)
    monkeypatch.setattr(environment, "RING_ELEMENTS", 3 * 50 * 7)  # a ring of 7 rounds
    tight = Environment(spec)
    assert tight._calendar.span == 7
    _, arrivals = play(tight, 300)
    np.testing.assert_allclose(np.stack(arrivals), np.stack(roomy), atol=1e-12)


def test_a_run_sees_the_same_world_alone_or_in_a_batch_and_at_any_horizon() -> None:
    batch = Environment(scenario(CRITEO_LIKE, arms=[0.5, 0.3, 0.2], runs=6, horizon=1500))
    alone = Environment(scenario(CRITEO_LIKE, arms=[0.5, 0.3, 0.2], runs=6, horizon=1200), runs=1, first_run=4)
    rng = np.random.default_rng(9)
    for _ in range(1200):  # crosses a CHUNK boundary
        arms = rng.integers(0, 3, 6)
        together, single = batch.pull(arms), alone.pull(arms[4:5])
        assert together.values[4] == single.values[0] and together.delays[4] == single.delays[0]
        batch.end_round()
        alone.end_round()
