"""Tables keep every column whole when the output is piped or the terminal is 80 columns wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rich.table import Table

from latebandit.tables import show


def test_a_table_wider_than_the_console_keeps_its_name_column(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    table = Table(title="regret")
    table.add_column("policy", no_wrap=True)
    for header in ("mean", "std", "q05", "q25", "median", "q75", "q95"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_row("adapt-patient-bandits (alpha_lo 0.1)", *["123.4"] * 7)
    show(table)
    out = capsys.readouterr().out
    assert "adapt-patient-bandits (alpha_lo 0.1)" in out and out.count("123.4") == 7


def test_simulate_piped_at_80_columns_prints_every_policy_name(tmp_path) -> None:
    labels = ["uniform baseline for the anonymous case", "odaaf with its default parameters"]
    scenario = {
        "horizon": 200, "runs": 4, "seed": 1, "arms": [0.5, 0.3, 0.2], "delay": {"family": "geometric", "p": 0.05},
        "window": 40, "feedback": "anonymous", "checkpoints": [100, 200],
        "policies": [{"name": "uniform", "label": labels[0]}, {"name": "odaaf", "label": labels[1]}],
    }  # fmt: skip
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    result = subprocess.run([sys.executable, "-m", "latebandit", "simulate", str(path)], capture_output=True, text=True,
                            env=env, check=True)  # fmt: skip
    assert all(label in result.stdout for label in labels), result.stdout
