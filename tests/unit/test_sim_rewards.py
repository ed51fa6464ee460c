"""Revenue scenarios (service/latebandit/sim/rewards.py): the value distributions' capped means against an
independent computation, the world the learners see (value / max), regret in value units checked by hand,
Bernoulli scenarios unchanged to the bit, and every mistake refused with the field named."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import integrate, stats

from latebandit.campaign import RewardSpec
from latebandit.sim.environment import Environment
from latebandit.sim.logs import simulated_logs
from latebandit.sim.rewards import MONTE_CARLO_DRAWS, Basket, Revenue, ValueArm
from latebandit.sim.runner import simulate
from latebandit.sim.scenario import ScenarioError, load_scenario, scenario_from_mapping

ROOT = Path(__file__).resolve().parents[2]
REVENUE: dict[str, Any] = {
    "horizon": 300,
    "runs": 2,
    "seed": 3,
    "arms": [
        {"converts": 0.5, "basket": {"family": "lognormal", "mu": 3.0, "sigma": 0.5}},
        {"converts": 0.3, "basket": {"family": "lognormal", "mu": 4.0, "sigma": 1.0}, "orders": 1.5},
        0.2,
    ],
    "reward": {"max": 100.0, "per_decision": "sum"},
    "delay": {"family": "geometric", "p": 0.2},
    "window": 50,
    "policies": [{"name": "delayed-klucb"}, {"name": "thompson"}],
}


def revenue(**changes: Any) -> dict[str, Any]:
    return {key: value for key, value in (REVENUE | changes).items() if value is not ...}


def scipy_capped_mean(mu: float, sigma: float, cap: float) -> float:
    """E[min(B, cap)] = ∫_0^cap x f(x) dx + cap·P(B > cap), by quadrature on scipy's lognormal density."""
    law = stats.lognorm(s=sigma, scale=math.exp(mu))
    bulk = [law.ppf(q) for q in (1e-9, 0.5, 1 - 1e-12) if law.ppf(q) < cap]  # where the mass is, for quad
    below, _ = integrate.quad(lambda x: x * law.pdf(x), 0.0, cap, points=bulk, limit=400)
    return float(below + cap * law.sf(cap))


@pytest.mark.parametrize(
    ("mu", "sigma", "cap"),
    [(3.0, 0.5, 250.0), (4.0, 1.0, 100.0), (3.0, 0.5, 1e6), (5.0, 0.3, 10.0), (0.0, 2.0, 3.0), (2.0, 0.0, 5.0)],
)
def test_a_lognormal_baskets_capped_mean_matches_scipy(mu: float, sigma: float, cap: float) -> None:
    expected = min(math.exp(mu), cap) if sigma == 0 else scipy_capped_mean(mu, sigma, cap)
    assert Basket("lognormal", mu=mu, sigma=sigma).capped_mean(cap) == pytest.approx(expected, rel=1e-7)


def test_a_far_cap_gives_the_lognormal_mean_and_a_near_one_the_cap() -> None:
    basket = Basket("lognormal", mu=3.0, sigma=0.5)
    assert basket.capped_mean(1e12) == pytest.approx(math.exp(3.0 + 0.125), rel=1e-12)
    assert basket.capped_mean(1e-6) == pytest.approx(1e-6, rel=1e-9)


def test_several_orders_are_summed_then_capped_monte_carlo_against_the_exact_sum() -> None:
    """Fixed baskets of 40, 1 + Poisson(1) orders, max 100: E = 40·P(N=1) + 80·P(N=2) + 100·P(N>=3)."""
    spec = RewardSpec(max=100.0, per_decision="sum")
    arm = ValueArm(1.0, Basket("fixed", value=40.0), orders=2.0)
    exact = 40 * math.exp(-1) + 80 * math.exp(-1) + 100 * (1 - 2 * math.exp(-1))
    standard_error = 100 / 2 / math.sqrt(MONTE_CARLO_DRAWS)  # a capped value in [0, 100] has std <= 50
    (estimate,) = Revenue(spec, (arm,)).conversion_values
    assert abs(estimate - exact) < 4 * standard_error


def test_the_learners_see_capped_values_over_max_and_the_draws_have_the_computed_means() -> None:
    scenario = scenario_from_mapping(revenue(horizon=9001, runs=4, window=None, delay={"family": "fixed", "value": 0}))
    env = Environment(scenario)
    assert scenario.revenue is not None
    values = scenario.revenue.conversion_values
    assert values[2] == 1.0  # a numeric arm: a Bernoulli conversion worth 1
    totals, counts = np.zeros(3), 0
    for _ in range(3000):
        for arm in range(3):
            env.pull(np.full(env.runs, arm))
            arrived = env.end_round()[:, arm]
            assert ((arrived >= 0) & (arrived <= 1.0)).all()
            assert arm < 2 or set(arrived.tolist()) <= {0.0, 0.01}  # the Bernoulli arm: 1 / max
            totals[arm] += arrived.sum() * 100.0  # back in value units
        counts += env.runs
    means = np.array(scenario.arms) * values
    assert totals / counts == pytest.approx(means, rel=0.08)


def test_a_basket_above_max_counts_as_max() -> None:
    document = revenue(
        arms=[{"converts": 1.0, "basket": {"family": "fixed", "value": 250.0}}, 0.5],
        delay={"family": "fixed", "value": 0},
        window=None,
    )
    env = Environment(scenario_from_mapping(document))
    env.pull(np.zeros(env.runs, dtype=np.int64))
    assert env.end_round()[:, 0].tolist() == [1.0, 1.0]  # 250 capped at 100, learned as 100 / 100


def test_value_unit_regret_by_hand() -> None:
    """Arm 0 converts half the time for 10; arm 1 a fifth of the time for 150, capped at 100: 5 and 20 per
    decision. Always playing arm 0 costs 15 per decision; always arm 1, nothing."""
    document = revenue(
        horizon=40,
        arms=[
            {"converts": 0.5, "basket": {"family": "fixed", "value": 10.0}},
            {"converts": 0.2, "basket": {"family": "fixed", "value": 150.0}},
        ],
        policies=[{"name": "fixed", "params": {"arm": 0}, "label": "a0"}, {"name": "fixed", "params": {"arm": 1}}],
    )
    scenario = scenario_from_mapping(document)
    assert Environment(scenario).gaps.tolist() == [[15.0, 0.0], [15.0, 0.0]]
    worse, best = simulate(scenario)
    assert worse.final.tolist() == [600.0, 600.0] and best.final.tolist() == [0.0, 0.0]


# Final regret and L(T) per run of the scenario below, recorded on main before revenue scenarios existed.
BEFORE = {
    "bernoulli": {
        "delayed-klucb": ([27.39999999999997, 17.499999999999982, 34.00000000000019],
                          [27.086508177200873, 17.40157120171182, 33.03824436345287]),
        "ucb1": ([40.200000000000195, 44.30000000000017, 35.30000000000015],
                 [38.56612633270842, 43.24738898750963, 34.06625611608315]),
        "thompson": ([26.000000000000043, 22.800000000000022, 30.80000000000007],
                     [25.568689057552067, 22.60540647477906, 29.916381821781272]),
    },
    "bounded": {
        "delayed-klucb": ([29.90000000000002, 26.300000000000054, 20.600000000000016],
                          [29.35438457949665, 26.08242850254893, 19.95273812103124]),
        "ucb1": ([36.90000000000013, 36.20000000000013, 34.90000000000008],
                 [36.30024564595433, 35.19031495427614, 34.014026838489016]),
        "thompson": ([30.100000000000104, 18.899999999999977, 26.400000000000087],
                     [29.713399187200316, 18.71287203503879, 25.844504348116956]),
    },
}  # fmt: skip
BERNOULLI: dict[str, Any] = {
    "horizon": 600,
    "runs": 3,
    "seed": 7,
    "arms": [0.5, 0.4, 0.3],
    "delay": {"family": "geometric", "p": 0.05},
    "window": 100,
    "policies": [{"name": "delayed-klucb"}, {"name": "ucb1"}, {"name": "thompson"}],
}


@pytest.mark.parametrize("reward", ["bernoulli", "bounded"])
def test_bernoulli_and_bounded_scenarios_give_the_numbers_they_gave_before(reward: str) -> None:
    results = simulate(scenario_from_mapping(BERNOULLI | {"reward": reward}))
    assert {r.label: (r.final.tolist(), r.weighted.tolist()) for r in results} == BEFORE[reward]


def test_the_campaign_field_at_max_1_is_the_bernoulli_world_to_the_bit() -> None:
    results = simulate(scenario_from_mapping(BERNOULLI | {"reward": {"max": 1.0, "per_decision": "first"}}))
    assert {r.label: (r.final.tolist(), r.weighted.tolist()) for r in results} == BEFORE["bernoulli"]


def test_a_revenue_scenario_round_trips_and_the_example_loads() -> None:
    scenario = scenario_from_mapping(REVENUE)
    assert scenario.to_json()["arms"][2] == 0.2 and scenario.to_json()["reward"] == REVENUE["reward"]
    assert scenario_from_mapping(scenario.to_json()) == scenario
    example = load_scenario(ROOT / "examples" / "revenue.yaml")
    assert example.revenue is not None
    expected = np.array(example.arms) * example.revenue.conversion_values
    assert np.argmax(example.arms) != np.argmax(expected)  # the best converter is not the best earner


LOGNORMAL = {"family": "lognormal", "mu": 3.0, "sigma": 0.5}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"reward": "bernoulli"}, r"arms\[0\] is a value distribution: the scenario needs the campaign field reward"),
        ({"reward": {"per_decision": "sum"}}, r"reward needs the 'max' field"),
        ({"reward": {"max": 0}}, r"reward.max must be a number in \(0, "),
        ({"reward": {"max": -5}}, r"reward.max must be a number in \(0, "),
        ({"reward": {"max": float("inf")}}, r"reward.max must be a number"),
        ({"reward": {"max": 10, "per_decision": "last"}}, r"reward.per_decision must be one of first, sum"),
        ({"reward": {"max": 10, "cap": 3}}, r"reward: unknown field 'cap'"),
        ({"arms": [{"converts": 1.2, "basket": LOGNORMAL}, 0.1]}, r"arms\[0\].converts must be a number in \[0, 1\]"),
        ({"arms": [{"converts": -0.1, "basket": LOGNORMAL}, 0.1]}, r"arms\[0\].converts must be a number in \[0, 1\]"),
        ({"arms": [{"basket": LOGNORMAL}, 0.1]}, r"arms\[0\] needs the 'converts' field"),
        ({"arms": [{"converts": 0.1}, 0.1]}, r"arms\[0\] needs the 'basket' field"),
        ({"arms": [0.1, 1.5]}, r"arms\[1\] must be a number in \[0, 1\]"),
        (
            {"arms": [{"converts": 0.1, "basket": {"family": "lognormal", "mu": 3, "sigma": -1}}, 0.1]},
            r"arms\[0\].basket.sigma must be a number in \[0, ",
        ),
        (
            {"arms": [{"converts": 0.1, "basket": {"family": "lognormal", "mu": 3}}, 0.1]},
            r"arms\[0\].basket needs the 'sigma' field",
        ),
        (
            {"arms": [{"converts": 0.1, "basket": {"family": "gamma", "shape": 2}}, 0.1]},
            r"arms\[0\].basket needs a family, one of lognormal, fixed",
        ),
        (
            {"arms": [{"converts": 0.1, "basket": {"family": "fixed", "value": 0}}, 0.1]},
            r"arms\[0\].basket.value must be a number in \(0, ",
        ),
        ({"arms": [{"converts": 0.1, "basket": LOGNORMAL, "orders": 0.5}, 0.1]}, r"arms\[0\].orders must be"),
        (
            {"arms": [{"converts": 0.1, "basket": LOGNORMAL, "orders": 2}, 0.1], "reward": {"max": 9}},
            r"arms\[0\].orders: with reward.per_decision 'first' only the first order counts",
        ),
        ({"arms": [{"converts": 0.1, "basket": LOGNORMAL, "items": 2}, 0.1]}, r"arms\[0\]: unknown field 'items'"),
    ],
)
def test_mistakes_are_refused_with_the_field_named(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        scenario_from_mapping(revenue(**changes))


def test_simulated_event_logs_refuse_a_revenue_world_rather_than_log_scaled_values() -> None:
    with pytest.raises(ScenarioError, match="Bernoulli scenarios, not revenue ones"):
        simulated_logs(scenario_from_mapping(REVENUE), runs=1)
