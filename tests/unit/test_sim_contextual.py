"""Contextual scenarios: validation, and the vectorised runner against a plain one-run loop that keeps each
run's decision records (vector, outcome, delay) and chooses by the slow reference index of
test_linear_policies (recomputed from the records: which conversions are visible, which decisions are in
the window); the world's draws are the only thing shared. Plus determinism, one run alone reproducing its
row of a batch, and the CLI's --json."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from rich.console import Console

from latebandit.sim.console import run_simulation
from latebandit.sim.contextual import ContextualWorld, LinearLedger, run_contextual_policy, simulate_contextual
from latebandit.sim.contextual_scenario import ContextualScenario, contextual_from_mapping
from latebandit.sim.environment import policy_generator
from latebandit.sim.scenario import ScenarioError
from tests.unit.test_linear_policies import ref_index

UNIT = {"d": 3, "actions_per_round": 4, "theta": [0.5, 0.3, 0.1], "features": {"family": "uniform-unit"}}


def make(policies: list[dict[str, Any]], **overrides: Any) -> ContextualScenario:
    data = {
        "horizon": 40,
        "runs": 3,
        "seed": 11,
        "contextual": {
            "d": 3,
            "actions_per_round": 4,
            "theta": [0.5, 0.3, 0.1],
            "features": {"family": "uniform-unit"},
        },
        "delay": {"family": "geometric", "p": 0.3},
        "window": 5,
        "policies": policies,
        "checkpoints": [20, 40],
    } | overrides
    return contextual_from_mapping(data)


def plain_loop(scenario: ContextualScenario, name: str, form: str, alpha: float) -> np.ndarray:
    """(R,) final pseudo-regret of each run played alone by the slow reference. Ties (every unit action at
    the first decision) are broken as the spec says, uniformly: by the largest of the policy generator's
    uniforms, one per run and action each round, as the batch draws them."""
    world, rng = ContextualWorld(scenario), policy_generator(scenario.seed)
    m, regret = scenario.window, np.zeros(scenario.runs)
    records: list[list[tuple[list[float], bool, float]]] = [[] for _ in range(scenario.runs)]
    for n in range(1, scenario.horizon + 1):
        actions, rates, converts, delays = world.round(n)
        keys = rng.random(rates.shape).tolist()
        for r in range(scenario.runs):
            history = [vector for vector, _, _ in records[r]]
            visible = [
                converted and delay <= m and s + math.ceil(delay) <= n - 1
                for s, (_, converted, delay) in enumerate(records[r], start=1)
            ]
            scores = [ref_index(name, form, history, visible, m, list(a), alpha) for a in actions[r].tolist()]
            tied = [k for k, score in enumerate(scores) if score >= max(scores) - 1e-12 * abs(max(scores))]
            k = max(tied, key=keys[r].__getitem__)
            regret[r] += rates[r].max() - rates[r, k]
            records[r].append((actions[r, k].tolist(), bool(converts[r, k]), float(delays[r, k])))
    return regret


@pytest.mark.parametrize(
    ("name", "form", "alpha"),
    [("otf-linucb", "exact", 0.05), ("otf-linucb", "frozen", 0.05), ("otf-linucb", "cs", 0.02),
     ("otf-linucb", "released", 0.3), ("linucb", "paper", 0.05)],
)  # fmt: skip
def test_runner_matches_the_plain_loop(name: str, form: str, alpha: float) -> None:
    """Small α so that the estimate matters: the runs' choices depend on which conversions arrived when."""
    key = "form" if name == "linucb" else "correction"
    scenario = make([{"name": name, "params": {"alpha": alpha, key: form}}])
    result = run_contextual_policy(scenario, scenario.policies[0])
    np.testing.assert_allclose(result.final, plain_loop(scenario, name, form, alpha), rtol=1e-9)


def test_runs_are_deterministic_and_a_run_alone_reproduces_its_row() -> None:
    scenario = make([{"name": "otf-lints"}, {"name": "otf-linucb", "params": {"correction": "exact", "alpha": 0.1}}])
    for spec in scenario.policies:
        batch = run_contextual_policy(scenario, spec)
        np.testing.assert_array_equal(batch.regret, run_contextual_policy(scenario, spec).regret)
    ucb = scenario.policies[1]  # Thompson's draws are taken for all runs at once, so only UCB's rows stand alone
    alone = run_contextual_policy(scenario, ucb, runs=1, first_run=2)
    np.testing.assert_allclose(alone.regret[:, 0], run_contextual_policy(scenario, ucb).regret[:, 2])


def test_uniform_pays_the_average_gap_and_learning_pays_less() -> None:
    scenario = make(
        [{"name": "uniform"}, {"name": "linucb", "params": {"alpha": 0.05}}], horizon=600, runs=8, window=20
    )
    uniform, learner = simulate_contextual(scenario)
    world = ContextualWorld(scenario)
    average_gap = np.mean(
        [(r.max(axis=1, keepdims=True) - r).mean() for r in (world.round(n)[1] for n in range(1, 601))]
    )
    assert uniform.final.mean() == pytest.approx(600 * average_gap, rel=0.1)
    assert learner.final.mean() < 0.5 * uniform.final.mean()


def test_the_window_censors_and_delay_start_shifts() -> None:
    """With every delay beyond the window nothing converts for the policy: b stays 0, estimates stay 0."""
    scenario = make([{"name": "linucb"}], window=2, delay={"family": "fixed", "value": 3})
    assert scenario.within_window() == 0.0
    shifted = make(
        [{"name": "linucb"}], window=3, delay={"family": "fixed", "value": 2}, contextual=UNIT | {"delay_start": 1}
    )
    assert shifted.within_window() == 1.0
    ledger = LinearLedger(1, 2, 2)
    for _ in range(5):
        ledger.record(np.array([[1.0, 0.0]]), np.zeros(1), np.array([True]), np.array([2]))
    assert ledger.reward.tolist() == [[3.0, 0.0]]  # decisions 1–3 arrived by the end of round 5; 4, 5 pending


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"window": None}, "window"),
        ({"arms": [0.1, 0.2]}, "unknown field 'arms'"),
        ({"policies": [{"name": "ucb1"}]}, "contextual scenario runs contextual policies"),
        ({"policies": [{"name": "linucb", "feed": "naive"}]}, "unknown field 'feed'"),
        ({"contextual": UNIT | {"theta": [0.5, 0.3]}}, "d = 3 numbers"),
        ({"contextual": UNIT | {"theta": [0.9, 0.9, 0.1]}}, "outside \\[0, 1\\]"),
        ({"contextual": UNIT | {"theta": [-0.1, 0.3, 0.1]}}, ">= 0"),
        ({"contextual": {"d": 3, "actions_per_round": 4, "theta": {"family": "signed-dirichlet", "center": 0.05,
          "spread": 0.03}, "features": {"family": "uniform-unit"}}}, "goes with features 'signs'"),
        ({"contextual": {"d": 4, "actions_per_round": 8, "theta": {"family": "signed-dirichlet", "center": 0.02,
          "spread": 0.03}, "features": {"family": "signs"}}}, "outside \\[0, 1\\]"),
        ({"contextual": {"d": 3, "actions_per_round": 0, "theta": [0.5, 0.3, 0.1], "features": {"family": "signs"}}},
         "actions_per_round"),
    ],
)  # fmt: skip
def test_bad_scenarios_name_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        make(**({"policies": [{"name": "linucb"}]} | change))


def test_signed_dirichlet_rates_stay_in_their_band() -> None:
    scenario = make([{"name": "uniform"}], contextual={
        "d": 4, "actions_per_round": 8, "theta": {"family": "signed-dirichlet", "center": 0.05, "spread": 0.03},
        "features": {"family": "signs"}}, runs=20)  # fmt: skip
    rates = ContextualWorld(scenario).round(1)[1]
    assert rates.min() >= 0.02 - 1e-12 and rates.max() <= 0.08 + 1e-12
    assert contextual_from_mapping(scenario.to_json()) == scenario


def test_simulate_command_writes_the_contract_json(tmp_path: Path) -> None:
    path = tmp_path / "linear.json"
    path.write_bytes(orjson.dumps(make([{"name": "linucb"}, {"name": "otf-linucb"}]).to_json()))
    out = tmp_path / "out.json"
    run_simulation(path, out, None, 2, None, Console(file=open(tmp_path / "console.txt", "w")))  # noqa: SIM115
    document = orjson.loads(out.read_bytes())
    assert document["scenario"]["runs"] == 2 and "contextual" in document["scenario"]
    assert set(document["policies"]) == {"linucb", "otf-linucb"}
    assert len(document["policies"]["linucb"]["regret_mean"]) == 2
