"""Wang 2021's policies at their defaults learn on realistic traffic (docs/algorithms/wang.md): four arms at
2–5 %, Pareto delays with a median of about 1,900 slots (the service's W1 world: scale 60 s at 20 decisions
a second). The paper's settings, at the same traffic, play as uniform play does (measured in the docs)."""

from __future__ import annotations

import math

import pytest

from latebandit.delays.models import Exponential, Pareto
from latebandit.policies import make_policy
from latebandit.policies.wang import Clw, declared_delay, delay_quantile
from latebandit.sim.runner import simulate
from latebandit.sim.scenario import scenario_from_mapping

ARMS = [0.02, 0.03, 0.04, 0.05]  # the best last: the first rounds play the worst arms
HORIZON = 200_000
UNIFORM = HORIZON * (max(ARMS) - sum(ARMS) / len(ARMS))  # 3,000: uniform play's expected regret


@pytest.mark.slow
def test_defaults_end_well_below_uniform_play() -> None:
    scenario = scenario_from_mapping({
        "horizon": HORIZON, "runs": 8, "seed": 5, "arms": ARMS, "feedback": "anonymous",
        "delay": {"family": "pareto", "alpha": 1.5, "scale": 1200}, "window": None,
        "policies": [{"name": "ars-ucb"}, {"name": "ars-exp3"}, {"name": "clw"}],
    })  # fmt: skip
    for result in simulate(scenario):
        assert result.final.mean() < 0.75 * UNIFORM, (result.label, result.final.mean())


def test_quantiles_of_the_declared_delay() -> None:
    assert delay_quantile(Pareto(1.5, 60.0), 0.5) == pytest.approx(60.0 * 2 ** (1 / 1.5), rel=1e-8)
    assert delay_quantile(Exponential(3600.0), 0.9) == pytest.approx(3600.0 * math.log(10.0), rel=1e-8)
    assert declared_delay((Pareto(1.5, 60.0),), 1 / 20, 0.5) == pytest.approx(20 * 60.0 * 2 ** (1 / 1.5))
    assert declared_delay((), 1 / 20, 0.5) is None and declared_delay((Pareto(1.5, 60.0),), None, 0.5) is None


def test_round_unit_and_clw_bound_come_from_the_declared_delay() -> None:
    """Rounds of the median delay; CLW's blocks (about 2e·d̂ slots) twice as long."""
    delays, per_slot = (Pareto(1.5, 60.0),), 1 / 20
    for name in ("ars-ucb", "ars-exp3"):
        params = make_policy(name, {}, 4).declared_defaults({}, delays, per_slot)
        assert params == {"round_unit": math.ceil(20 * 60.0 * 2 ** (1 / 1.5))}  # 1,905 slots
        assert make_policy(name, {}, 4).declared_defaults({"round_unit": 7}, delays, per_slot) == {"round_unit": 7}
    bound = Clw.declared_defaults({}, delays, per_slot)["max_delay"]
    assert bound == math.ceil(20 * 60.0 * 2 ** (1 / 1.5) / math.e)  # 701 slots
