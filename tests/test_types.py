"""The package type-checks: mypy, configured in pyproject.toml ([tool.mypy]), finds no error."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import missing

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # about 40 s with no .mypy_cache (a fresh checkout, CI); under a second after
def test_mypy_passes() -> None:
    if importlib.util.find_spec("mypy") is None:
        missing("mypy is not installed: pip install -e '.[test]'")
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"mypy exited {result.returncode}:\n{result.stdout}{result.stderr}"
