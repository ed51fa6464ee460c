"""The service's standing choice costs no regret (issue 15): in the simulator, on Vernade et al. 2017's θH
setting (delays of mean 500 rounds), DelayedKLUCB and delayed Thompson sampling drawing from their last
distribution for 64 rounds end where asking them every round does. The same measure catches the cost where
there is one: KL-UCB, whose index reads N, loses measurably when made to stand, which is why it does not
(Policy.standing)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.standing_regret import final_regret, scenario
from latebandit.policies import POLICIES
from latebandit.sim.reproductions.vernade2017 import THETA_H
from latebandit.sim.runner import mean_and_error

pytestmark = pytest.mark.slow  # simulations: seconds each

RUNS = 100


def paired(policy: str) -> tuple[float, float, float]:
    """The reference's mean final regret, and the mean and standard error of 64-round reuse's difference."""
    world = scenario(THETA_H, RUNS)
    reference = final_regret(world, policy, 1)
    difference, error = mean_and_error(final_regret(world, policy, 64) - reference)
    return float(np.mean(reference)), difference, error


@pytest.mark.parametrize("policy", ["delayed-klucb", "delayed-thompson"])
def test_standing_for_64_rounds_costs_nothing_measurable(policy: str) -> None:
    reference, difference, error = paired(policy)
    assert abs(difference) <= 3 * error + 0.02 * reference, (reference, difference, error)


def test_a_policy_reading_the_pulls_would_pay_for_standing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(POLICIES["klucb"], "reads_pulls", False)
    reference, difference, error = paired("klucb")
    assert difference > 3 * error and difference > 0.1 * reference, (reference, difference, error)
