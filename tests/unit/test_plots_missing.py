"""--plot without matplotlib (the plots extra): the install hint, whole, before anything runs (issue 30: Rich
read ``[plots]`` as markup and printed ``pip install 'latebandit'``, after the whole simulation)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

WITHOUT_MATPLOTLIB = "import sys; sys.modules['matplotlib'] = None; from latebandit.cli import main; main()"
SCENARIO = {"horizon": 200, "runs": 2, "seed": 1, "arms": [0.5, 0.4], "delay": {"family": "geometric", "p": 0.1},
            "window": 50, "policies": [{"name": "ucb1"}]}  # fmt: skip


def latebandit_without_matplotlib(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", WITHOUT_MATPLOTLIB, *args]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("command", ["simulate", "reproduce"])
def test_plot_without_matplotlib_says_how_to_install_it_before_running(tmp_path: Path, command: str) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    target = str(scenario) if command == "simulate" else "vernade2017-fig1a"
    out = tmp_path / "out.json"
    exited = latebandit_without_matplotlib(
        tmp_path, command, target, "--runs", "1", "--json", str(out), "--plot", str(tmp_path / "p.png")
    )
    assert exited.returncode != 0
    assert "pip install 'latebandit[plots]'" in " ".join(exited.stderr.split()), exited.stderr
    assert not out.exists() and "regret" not in exited.stdout  # nothing ran
