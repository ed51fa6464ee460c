"""Simulated event logs (docs/reference/event-log.md) of a logging policy on a known world, so that off-policy
estimates can be checked against a true value.

One round is one second: decision n is taken at ``start`` + (n − 1) s, a conversion occurs at the decision
time plus its delay in rounds (read as seconds), and the window in rounds becomes the campaign's window
in seconds. The logging policy is the scenario's first policy (with its exploration floor), played by the
simulator's own runner, so the logged propensities are the ones the service would log.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from latebandit.policies import Choice
from latebandit.sim.environment import Pull
from latebandit.sim.runner import run_policy
from latebandit.sim.scenario import Scenario, ScenarioError
from latebandit.timeutil import MICROS, format_time

START = 1_767_225_600 * MICROS  # 2026-01-01T00:00:00Z


def true_value(scenario: Scenario, probabilities: np.ndarray) -> float:
    """The value of a policy that plays arm a with fixed probability π(a): Σ_a π(a)·θ_a·F_a(m), the
    expected reward per decision that counts within the window."""
    means = np.array(scenario.arms)
    within = np.array([1.0 if scenario.window is None else float(d.cdf(scenario.window)) for d in scenario.delays])
    return float((np.asarray(probabilities) * means * within).sum())


def simulated_logs(scenario: Scenario, runs: int | None = None, start: int = START) -> list[list[dict[str, Any]]]:
    """One event log per run of the scenario's first policy (the campaign line first, then the decisions
    and the conversions in time order). Bernoulli worlds only, with every arm from the first round: a revenue
    world's logs would need its values and campaign ``reward`` field (``true_value`` counts conversions), and
    an arriving arm an arm-change event."""
    if scenario.arrivals:
        raise ScenarioError("simulated event logs have no arm-change events yet: drop the scenario's arrivals")
    if scenario.revenue is not None:
        raise ScenarioError("simulated event logs are written for Bernoulli scenarios, not revenue ones")
    spec = scenario.policies[0]
    count = scenario.runs if runs is None else runs
    arm_ids = [f"arm{k}" for k in range(scenario.n_arms)]
    rounds: list[tuple[int, Choice, Pull]] = []
    run_policy(scenario, spec, runs=count, observe=lambda n, choice, pull: rounds.append((n, choice, pull)))
    campaign = {
        "type": "campaign", "id": "simulated", "arms": arm_ids,
        "policy": {"name": spec.name, "params": dict(spec.params)},
        "delay": scenario.delays[0].to_spec(), "window": float(scenario.window or 10 * 365 * 86_400),
        "exploration_floor": spec.exploration_floor, "created_at": format_time(start),
    }  # fmt: skip
    logs: list[list[tuple[int, dict[str, Any]]]] = [[] for _ in range(count)]
    for n, choice, pull in rounds:
        at = start + (n - 1) * MICROS
        for r in range(count):
            decision_id = f"r{r}d{n}"
            arm = arm_ids[int(pull.arms[r])]
            logs[r].append((at, {"type": "decision", "campaign": "simulated", "decision_id": decision_id, "arm": arm,
                                 "at": format_time(at), "propensity": float(choice.propensity[r])}))  # fmt: skip
            if pull.values[r] > 0 and np.isfinite(pull.delays[r]):
                occurred = at + round(float(pull.delays[r]) * MICROS)
                logs[r].append((occurred, {"type": "conversion", "campaign": "simulated", "event_id": f"e{r}d{n}",
                                           "decision_id": decision_id, "occurred_at": format_time(occurred),
                                           "value": float(pull.values[r])}))  # fmt: skip
    return [[campaign, *(line for _, line in sorted(log, key=lambda item: item[0]))] for log in logs]
