"""The reproduction registry without simulating: every reproduction builds valid panels at any number of
runs, its references name policies of its panels, and its checks and JSON work on synthetic results."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from latebandit.sim.reproductions import REPRODUCTIONS
from latebandit.sim.reproductions.base import Reproduction, markers, reference_checks, reproduction_json
from latebandit.sim.reproductions.vernade2017 import THETA_H, THETA_L, pseudo_regret_bound, tau
from latebandit.sim.runner import PolicyResult, recording_rounds


def synthetic(reproduction: Reproduction, runs: int = 4) -> tuple[list, dict[str, list[PolicyResult]]]:
    panels = reproduction.panels(runs)
    rng = np.random.default_rng(0)
    results = {}
    for panel in panels:
        rounds = recording_rounds(panel.scenario)
        results[panel.title] = [
            PolicyResult(spec.label, rounds, np.cumsum(rng.random((rounds.size, runs)), axis=0), np.zeros(runs), 0.0)
            for spec in panel.scenario.policies
        ]
    return panels, results


@pytest.mark.parametrize("name", list(REPRODUCTIONS))
def test_every_reproduction_builds_checks_and_serialises(name: str) -> None:
    reproduction = REPRODUCTIONS[name]
    panels, results = synthetic(reproduction)
    assert name.startswith(reproduction.paper + "-") and reproduction.runs >= 10  # the default --runs
    for panel in panels:
        panel.check_runnable()
        assert panel.scenario.runs == 4
    for panel, rows in reproduction.references.items():
        labels = {result.label for result in results[panel]}
        assert set(rows) <= labels
    checks = reproduction.checks(results) + reference_checks(reproduction, results)
    assert checks and all(isinstance(check.passed, bool) for check in checks)
    document = reproduction_json(reproduction, panels, results, checks)
    assert orjson.loads(orjson.dumps(document))["reproduction"] == name
    assert set(markers(reproduction)) == set(reproduction.references)


def test_lower_bound_constants_match_the_spec_table() -> None:
    """Vernade et al. 2017's instances: Lai–Robbins 7.40 (θH) and 4.91 (θL); Theorem 3 (τ_m-weighted) 8.24 and 4.97."""
    tau_m = tau(1000)
    assert tau_m == pytest.approx(0.8652, abs=1e-4)
    assert pseudo_regret_bound(THETA_H, 1.0) == pytest.approx(7.40, abs=0.01)
    assert pseudo_regret_bound(THETA_L, 1.0) == pytest.approx(4.91, abs=0.01)
    assert tau_m * pseudo_regret_bound(THETA_H, tau_m) == pytest.approx(8.24, abs=0.01)
    assert tau_m * pseudo_regret_bound(THETA_L, tau_m) == pytest.approx(4.97, abs=0.01)
