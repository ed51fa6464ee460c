"""`latebandit loadtest` against a real uvicorn server: it runs, and its counts agree with what the
service recorded (no wall-clock assertions: the figures depend on the machine)."""

from __future__ import annotations

import orjson
import pytest

from tests.e2e.server import cli, running, service_env

pytestmark = pytest.mark.e2e

CAMPAIGN = {"id": "lt", "arms": ["a", "b", "c"], "policy": {"name": "delayed-ucb"},
            "delay": {"family": "exponential", "mean": 1.0}, "window": 600}  # fmt: skip


def test_loadtest_drives_choose_and_feedback_and_reports_sane_counts(tmp_path) -> None:
    env = service_env(tmp_path)
    with running(env, tmp_path) as server, server.client() as http:
        assert http.post("/campaigns", json=CAMPAIGN).status_code == 201
        out = tmp_path / "load.json"
        args = ["--url", server.url, "--duration", "4", "--concurrency", "4", "--campaign", "lt", "--json", str(out)]
        shown = cli(env, tmp_path, "loadtest", *args)
        report = orjson.loads(out.read_bytes())
        state = http.get("/campaigns/lt/state").json()
    counts = report["counts"]
    assert "/choose" in shown.stdout and "p99 ms" in shown.stdout
    assert report["errors"] == 0 and counts["rejected"] == 0 and counts["retries"] == 0
    assert counts["decisions"] > 20 and report["endpoints"]["feedback"]["requests"] > 0
    assert state["decisions"] == counts["decisions"]  # a retried request_id made no second decision
    assert counts["choose_retries"] > 0 and counts["choose_retry_mismatches"] == 0
    assert counts["conversions_sent"] > 0 and counts["accepted"] == counts["conversions_sent"]
    assert counts["duplicates"] == counts["duplicates_sent"]  # every re-sent event was recognised
    assert sum(arm["conversions"] for arm in state["arms"].values()) == counts["conversions_sent"]
    assert counts["aggregates_sent"] == 0 and "aggregate" in report["aggregates_skipped"]
    assert "aggregates skipped" in shown.stdout
    endpoint = report["endpoints"]["choose"]
    assert 0 < endpoint["p50_ms"] <= endpoint["p90_ms"] <= endpoint["p99_ms"]


def test_loadtest_refuses_a_bad_url_and_an_unknown_campaign(tmp_path) -> None:
    env = service_env(tmp_path)
    bad = cli(env, tmp_path, "loadtest", "--url", "https://example.invalid", "--duration", "1", check=False)
    assert bad.returncode == 2 and "plain HTTP" in bad.stderr
    with running(env, tmp_path) as server:
        unknown = cli(env, tmp_path, "loadtest", "--url", server.url, "--campaign", "nope", check=False)
    assert unknown.returncode == 2 and "campaign 'nope'" in unknown.stderr and "404" in unknown.stderr


def test_loadtest_sends_aggregates_to_a_planning_campaign(tmp_path) -> None:
    """ARS-UCB learns from sums: the load test adds aggregates, and conversions count as aggregates too."""
    env = service_env(tmp_path)
    campaign = {"id": "sums", "arms": ["a", "b", "c"], "policy": {"name": "ars-ucb"}}
    with running(env, tmp_path) as server, server.client() as http:
        assert http.post("/campaigns", json=campaign).status_code == 201
        out = tmp_path / "load.json"
        args = ["--url", server.url, "--duration", "4", "--concurrency", "4", "--campaign", "sums", "--json", str(out)]
        cli(env, tmp_path, "loadtest", *args)
        report = orjson.loads(out.read_bytes())
        state = http.get("/campaigns/sums/state").json()
    counts = report["counts"]
    assert report["errors"] == 0 and counts["aggregates_sent"] > 0 and not report["aggregates_skipped"]
    assert state["decisions"] == counts["decisions"] and state["policy_state"]["plan_version"] > 3
    assert counts["duplicates"] == counts["duplicates_sent"]
    assert sum(arm["conversions"] for arm in state["arms"].values()) > 0
