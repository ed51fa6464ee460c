"""The service's standing choice costs no regret (issue 15): in the simulator, on Vernade et al. 2017's θH
setting (delays of mean 500 rounds), policies drawing from their last distribution for up to 64 rounds (until
a conversion arrives) end where asking them every round does."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.standing_regret import final_regret, scenario
from latebandit.sim.reproductions.vernade2017 import THETA_H
from latebandit.sim.runner import mean_and_error

pytestmark = pytest.mark.slow  # simulations: seconds each

RUNS = 100


@pytest.mark.parametrize("policy", ["delayed-klucb", "delayed-thompson", "ucb1"])
def test_standing_for_64_rounds_costs_nothing_measurable(policy: str) -> None:
    world = scenario(THETA_H, RUNS)
    reference = final_regret(world, policy, 1)
    difference, error = mean_and_error(final_regret(world, policy, 64) - reference)
    assert abs(difference) <= 3 * error + 0.02 * float(np.mean(reference)), (difference, error)
