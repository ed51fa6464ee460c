"""A regular (non-editable) install, as the image makes one, migrates a database and serves: the Alembic
migrations ship inside the package (issue 18). The package is built into a wheel from this checkout and put
first on the path, so the run below imports nothing from the source tree."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # simulations or a build: seconds each

ROOT = Path(__file__).resolve().parents[2]


def test_a_wheel_install_migrates_and_knows_its_migrations(tmp_path: Path) -> None:
    wheels, site, source = tmp_path / "wheels", tmp_path / "site", tmp_path / "source"
    shutil.copytree(ROOT / "service", source / "service", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)  # built apart: the build leaves nothing in the checkout
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)], check=True,
                   cwd=tmp_path)  # fmt: skip
    (wheel,) = wheels.glob("latebandit-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, cwd=tmp_path)
    env = {**os.environ, "PYTHONPATH": str(site), "LATEBANDIT_DATABASE_URL": f"sqlite:///{tmp_path / 'audit.db'}"}
    where = subprocess.run([sys.executable, "-c", "import latebandit.audit.migrate as m; print(m.MIGRATIONS)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True)  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(site)  # the installed copy, not the checkout
    migrated = subprocess.run([sys.executable, "-m", "latebandit", "migrate"], env=env, cwd=tmp_path,
                              capture_output=True, text=True)  # fmt: skip
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    with sqlite3.connect(tmp_path / "audit.db") as database:
        tables = {row[0] for row in database.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"audit_decisions", "audit_feedback", "audit_campaign_events", "alembic_version"} <= tables
