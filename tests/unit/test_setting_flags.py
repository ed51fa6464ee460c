"""Every setting has its `serve` flag (issue 30: the audit and spool settings had none), and a flag given
reaches the settings the service runs with."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

import latebandit.serving
from latebandit.cli import app
from latebandit.config import Settings
from latebandit.setting_flags import flag_name, variable_name


def serve_options() -> set[str]:
    command = typer.main.get_command(app).commands["serve"]
    return {option for parameter in command.params for option in parameter.opts}


def test_every_setting_has_a_serve_flag() -> None:
    assert {flag_name(name) for name in Settings.model_fields} <= serve_options()


def test_the_flags_given_are_the_settings_served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in Settings.model_fields:  # set first, so that monkeypatch restores even an absent variable
        monkeypatch.setenv(variable_name(name), "")
        monkeypatch.delenv(variable_name(name))
    served: list[Settings] = []
    monkeypatch.setattr(latebandit.serving, "run_service", served.append)
    flags = {
        "--audit-batch": "17",
        "--audit-interval": "0.5",
        "--audit-writer": "external",
        "--spool-dir": str(tmp_path / "spool"),
        "--spool-limit": str(1 << 21),
        "--audit-metrics-port": "9202",
        "--port": "8123",
        "--database-url": f"sqlite:///{tmp_path / 'audit.db'}",
    }
    result = CliRunner().invoke(app, ["serve", *(part for pair in flags.items() for part in pair)])
    assert result.exit_code == 0, result.output
    (settings,) = served
    assert (settings.audit_batch, settings.audit_interval, settings.audit_writer) == (17, 0.5, "external")
    assert (settings.spool_dir, settings.spool_limit) == (tmp_path / "spool", 1 << 21)
    assert (settings.audit_metrics_port, settings.port) == (9202, 8123)


def test_a_flag_out_of_its_settings_bounds_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LATEBANDIT_SPOOL_LIMIT", "5")
    result = CliRunner().invoke(app, ["serve"])
    assert result.exit_code == 2
    assert "LATEBANDIT_SPOOL_LIMIT (--spool-limit)" in result.output
