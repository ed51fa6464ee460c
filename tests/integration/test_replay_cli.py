"""`latebandit replay LOG --policy ...`: its --json document, the report's plot and the CLI's refusals."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from latebandit.cli import app
from latebandit.sim.logs import simulated_logs
from latebandit.sim.scenario import scenario_from_mapping


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> Path:
    world = scenario_from_mapping({
        "horizon": 1500, "runs": 1, "seed": 2, "arms": [0.4, 0.2], "delay": {"family": "exponential", "mean": 10},
        "window": 30, "policies": [{"name": "uniform"}],
    })  # fmt: skip
    path = tmp_path_factory.mktemp("log") / "log.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(line) for line in simulated_logs(world)[0]) + b"\n")
    return path


def replay(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, ["replay", *map(str, args)])


def test_one_policy_writes_the_contract_json_and_an_html_report(log: Path, tmp_path: Path) -> None:
    out, page = tmp_path / "estimate.json", tmp_path / "report.html"
    result = replay(log, "--policy", "delayed-ucb", "--json", out, "--plot", page)
    assert result.exit_code == 0, result.output
    document = orjson.loads(out.read_bytes())
    assert set(document) == {"policy", "estimator", "value", "ci95", "effective_sample_size"}
    assert document["policy"] == "delayed-ucb" and document["estimator"] == "replay"  # a uniform log
    low, high = document["ci95"]
    assert low < document["value"] < high and document["effective_sample_size"] > 100
    text = page.read_text()
    assert "<svg" in text and "delayed-ucb" in text and "uniform (logged)" in text


def test_params_pair_with_policies_and_must_be_json_objects(log: Path, tmp_path: Path) -> None:
    out = tmp_path / "estimates.json"
    result = replay(log, "--policy", "fixed", "--params", '{"arm": "arm0"}', "--policy", "fixed",
                    "--params", '{"arm": "arm1"}', "--json", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    first, second = orjson.loads(out.read_bytes())
    assert first["value"] > second["value"]  # arm0 converts twice as often
    assert replay(log, "--policy", "fixed", "--policy", "uniform", "--params", "{}").exit_code == 2
    assert replay(log, "--policy", "uniform", "--params", "[1]").exit_code == 2
    assert replay(log, "--policy", "uniform", "--params", "{").exit_code == 2


def test_json_and_plot_need_a_policy_and_unknown_estimators_are_refused(log: Path, tmp_path: Path) -> None:
    assert replay(log, "--json", tmp_path / "x.json").exit_code == 2
    refused = replay(log, "--policy", "uniform", "--estimator", "magic")
    assert refused.exit_code == 1 and "unknown estimator" in refused.output


def test_a_contextual_policy_is_refused_on_a_log_of_arms(log: Path) -> None:
    refused = replay(log, "--policy", "otf-linucb")
    said = " ".join(refused.output.split())  # rich wraps the message to the terminal's width
    assert refused.exit_code == 1 and "'otf-linucb' is contextual, and campaign 'simulated' is not" in said
