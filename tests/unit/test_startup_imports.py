"""What an API worker imports at start: SciPy's stats module (about 0.6 s) only where guha-bayes plans."""

from __future__ import annotations

import subprocess
import sys


def test_the_api_does_not_import_scipy_stats() -> None:
    probe = "import sys, latebandit.api.app, latebandit.cli; print('scipy.stats' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_python_dash_m_latebandit_is_the_command() -> None:
    result = subprocess.run([sys.executable, "-m", "latebandit", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "serve" in result.stdout and "audit-writer" in result.stdout
