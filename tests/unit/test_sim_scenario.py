"""Scenario files: the example of docs/reference/ loads from JSON and YAML, the normalised form loads back to the
same scenario, and every kind of mistake is a ScenarioError that names the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from latebandit.sim.environment import Environment
from latebandit.sim.scenario import ScenarioError, load_scenario, scenario_from_mapping

DOCUMENTED_EXAMPLE: dict[str, Any] = {
    "horizon": 10000,
    "runs": 100,
    "seed": 1,
    "arms": [0.5, 0.4, 0.3],
    "reward": "bernoulli",
    "delay": {"family": "geometric", "p": 0.01},
    "window": 1000,
    "feedback": "attributed",
    "policies": [{"name": "delayed-klucb"}, {"name": "ucb1"}],
    "checkpoints": [1000, 5000, 10000],
}


def with_(**changes: Any) -> dict[str, Any]:
    return {key: value for key, value in (DOCUMENTED_EXAMPLE | changes).items() if value is not ...}


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
def test_the_contract_example_loads_and_round_trips(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"scenario{suffix}"
    path.write_text(json.dumps(DOCUMENTED_EXAMPLE) if suffix == ".json" else yaml.safe_dump(DOCUMENTED_EXAMPLE))
    scenario = load_scenario(path)
    assert (scenario.horizon, scenario.runs, scenario.window, scenario.n_arms) == (10000, 100, 1000, 3)
    assert [spec.label for spec in scenario.policies] == ["delayed-klucb", "ucb1"]
    assert scenario_from_mapping(scenario.to_json()) == scenario
    assert scenario.with_overrides(runs=7, seed=9).to_json() | {"runs": 100, "seed": 1} == scenario.to_json()


def test_defaults_and_per_arm_delays() -> None:
    minimal = {
        "horizon": 50,
        "arms": [0.2, 0.1],
        "policies": [{"name": "ucb1"}],
        "delay": [{"family": "fixed", "value": 3}, {"family": "pareto", "alpha": 1.5, "scale": 1}],
    }
    scenario = scenario_from_mapping(minimal)
    assert (scenario.runs, scenario.seed, scenario.reward, scenario.feedback) == (100, 0, "bernoulli", "attributed")
    assert scenario.window is None and scenario.checkpoints == (50,) and not scenario.shared_delay
    assert [model.family for model in scenario.delays] == ["fixed", "pareto"]
    assert scenario_from_mapping(scenario.to_json()) == scenario


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([1, 2], "the scenario must be an object"),
        (with_(horizon=...), "needs the 'horizon' field"),
        (with_(horizon=0), "horizon must be an integer >= 1"),
        (with_(horizon=10.5), "horizon must be an integer"),
        (with_(runs=True), "runs must be an integer"),
        (with_(arms=[0.5]), "at least two means"),
        (with_(arms=[0.5, 1.5]), "arms[1] must be a number in [0, 1]"),
        (with_(arms="0.5"), "arms must be a non-empty list"),
        (with_(reward="gaussian"), "reward must be one of bernoulli, bounded"),
        (with_(delay={"family": "weibull"}), "delay: unknown delay family"),
        (with_(delay={"family": "geometric", "p": 2}), "delay: geometric delay: p must be in (0, 1]"),
        (with_(delay={"family": "unknown"}), "needs a delay family, not 'unknown'"),
        (with_(delay=[{"family": "fixed", "value": 1}]), "one delay per arm (3), got 1"),
        (
            with_(delay=[{"family": "fixed", "value": 1}, {"family": "fixed"}, {"family": "fixed", "value": 1}]),
            "delay[1]: fixed delay: missing field 'value'",
        ),
        (with_(window=-1), "window must be an integer >= 0"),
        (with_(feedback="aggregated"), "feedback must be one of attributed, anonymous, composite"),
        (with_(spread=3), "spread is only used with feedback 'composite'"),
        (with_(feedback="composite"), "spread must be an integer >= 1"),
        (with_(feedback="composite", spread=[0.5, 0.2]), "spread: the parts' fractions must sum to 1"),
        (with_(feedback="composite", spread=[1.5, -0.5]), "spread[0] must be a number in [0, 1]"),
        (
            with_(policies=[{"name": "qpm-d", "feed": "naive"}]),
            "feed 'resolution' (pending pulls) is the feed of qpm-d",
        ),
        (with_(policies=[{"name": "ucb1", "feed": "resolution"}]), "feed 'resolution' (pending pulls) is the feed of"),
        (with_(policies=[]), "policies must be a non-empty list"),
        (with_(policies=[{"name": "nope"}]), "policies[0]: unknown policy 'nope'"),
        (with_(policies=[{"name": "ucb1", "params": {"epsilon": -1}}]), "policies[0]: policy 'ucb1': epsilon"),
        (with_(policies=[{"name": "ucb1", "colour": "red"}]), "policies[0]: unknown field 'colour'"),
        (with_(policies=[{"name": "ucb1"}, {"name": "ucb1"}]), "label 'ucb1' is used twice"),
        (with_(policies=[{"name": "ucb1", "feed": "plugin"}]), "this policy is delay-naive"),
        (with_(policies=[{"name": "delayed-ucb", "feed": "magic"}]), "feed must be one of naive, delayed"),
        (with_(window=None, policies=[{"name": "delayed-ucb", "feed": "discarding"}]), "set a window"),
        (
            with_(policies=[{"name": "delayed-ucb", "feed": {"kind": "plugin", "gamma": 0.7}}]),
            "gamma is for the uncensored plug-in",
        ),
        (
            with_(window=None, policies=[{"name": "delayed-ucb", "feed": {"kind": "plugin", "gamma": 2}}]),
            "gamma must be in [0.5, 1]",
        ),
        (
            with_(delay=[{"family": "fixed", "value": 1}] * 3, policies=[{"name": "delayed-ucb", "feed": "plugin"}]),
            "it needs one shared delay",
        ),
        (with_(checkpoints=[5000, 1000]), "checkpoints must increase strictly"),
        (with_(checkpoints=[20000]), "stay within the horizon 10000"),
        (with_(extra=1), "unknown field 'extra'"),
    ],
)
def test_mistakes_are_scenario_errors_that_name_the_field(document: Any, message: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario_from_mapping(document)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("s.json", "{", "not valid JSON"),
        ("s.yaml", "horizon: [", "not valid YAML"),
        ("s.txt", "{}", "ends in .json, .yaml or .yml"),
        ("s.yaml", "horizon: 0", "s.yaml: the scenario needs"),
    ],
)
def test_file_errors_name_the_file(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ScenarioError, match=message):
        load_scenario(path)
    with pytest.raises(ScenarioError, match="cannot read it"):
        load_scenario(tmp_path / "missing.yaml")


def test_a_prior_draws_each_runs_means_and_keeps_arms_as_the_prior_mean() -> None:
    base = {"horizon": 5, "arms": [0.25, 0.25, 0.25], "delay": {"family": "fixed", "value": 1},
            "policies": [{"name": "ucb1"}], "prior": {"a": 1, "b": 3}}  # fmt: skip
    scenario = scenario_from_mapping({**base, "runs": 4000})
    assert scenario.prior == (1.0, 3.0) and scenario.to_json()["prior"] == {"a": 1.0, "b": 3.0}
    means = Environment(scenario).means
    assert means.shape == (4000, 3) and abs(means.mean() - 0.25) < 0.01 and means.std() > 0.15
    alone = Environment(scenario_from_mapping({**base, "runs": 1}), first_run=17).means
    np.testing.assert_array_equal(alone[0], means[17])  # run r draws the same means in any batch
    with pytest.raises(ScenarioError, match=r"prior mean a/\(a \+ b\) = 0.25"):
        scenario_from_mapping({**base, "arms": [0.5, 0.25, 0.25]})
    with pytest.raises(ScenarioError, match=r"prior\.b must be"):
        scenario_from_mapping({**base, "prior": {"a": 1, "b": 0}})


def test_composite_spread_lists_round_trip_and_an_integer_is_equal_parts() -> None:
    """A reward shape (Wang et al. 2021, Figs. 2–4) is a list of fractions; an integer n is n equal parts."""
    shaped = scenario_from_mapping(with_(feedback="composite", spread=[0.5, 0.3, 0.2]))
    assert shaped.spread == (0.5, 0.3, 0.2)
    assert scenario_from_mapping(shaped.to_json()) == shaped
    equal = scenario_from_mapping(with_(feedback="composite", spread=4))
    assert equal.spread == (0.25,) * 4 and equal.to_json()["spread"] == 4
    assert scenario_from_mapping(with_()).spread == (1.0,)
