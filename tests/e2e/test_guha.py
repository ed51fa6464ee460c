"""guha-bayes served end to end on real Redis and PostgreSQL: creation with ``"params": {}``, the plan
solved off the request path, choose and feedback, the plan in the state and the metrics, and the 422
for a configuration too large to plan."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from tests.e2e.server import cli, running, service_env
from tests.e2e.test_embedded import iso

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres]

BODY = {"id": "guha", "arms": ["a", "b", "c"], "policy": {"name": "guha-bayes", "params": {"horizon": 30}},
        "delay": {"family": "fixed", "value": 2}, "window": 3600}  # fmt: skip
# The served campaign: the same plan (2 decisions of delay, 30 planned, one decision a step), but at 0.1
# decisions/s, so that its pulls stay in flight for 20 s of the test's real time: the plan's first arm, pulled
# by the decision that started the solve, still wants plays when the decisions below are made however slowly
# the solve ran (at a 2 s delay a slow machine saw that pull fail first, and the plan then quit the arm).
SERVED = {**BODY, "policy": {"name": "guha-bayes", "params": {"horizon": 30, "unit": 1}},
          "delay": {"family": "fixed", "value": 20}, "decisions_per_second": 0.1}  # fmt: skip


def wait_for_plan(http, campaign: str, timeout: float = 120.0) -> dict:
    """One decision starts the solve; then only the state is read, so that the plan's window is not used up by
    decisions made while a slow machine solves (its re-plan would then replace the plan this returns)."""
    http.post("/choose", json={"campaign": campaign})  # the decision that finds no plan starts the solve
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        plan = http.get(f"/campaigns/{campaign}/state").json()["policy_state"]["plan"]
        if plan["status"] == "ready":
            return plan
        time.sleep(0.5)
    raise AssertionError("the plan was never solved")


def test_guha_campaign_end_to_end(tmp_path, redis_url, redis_prefix, postgres_url) -> None:
    env = service_env(tmp_path, redis_url=redis_url, redis_prefix=redis_prefix, database_url=postgres_url)
    cli(env, tmp_path, "migrate")
    with running(env, tmp_path) as server, server.client() as http:
        default = http.post("/campaigns", json={**BODY, "id": "guha-defaults", "policy": {"name": "guha-bayes"}})
        assert default.status_code == 201, default.text
        resolved = default.json()["policy"]["resolved_params"]
        # no rate declared: 1/s, p95 · 1/s = 2 decisions; the window is 600 s of them, on 60 steps of 10
        assert (resolved["horizon"], resolved["delay"], resolved["prior_a"], resolved["unit"]) == (600, 2, 1.0, 10)
        declared = {**BODY, "id": "guha-rate", "policy": {"name": "guha-bayes"}, "decisions_per_second": 20}
        rated = http.post("/campaigns", json=declared).json()["policy"]["resolved_params"]
        assert (rated["decisions_per_second"], rated["delay"]) == (20, 40)  # the campaign's rate: 2 s · 20/s

        too_large = {
            **BODY,
            "id": "too-large",
            "policy": {"name": "guha-bayes", "params": {"horizon": 5000, "depth": 5000}},
        }
        refused = http.post("/campaigns", json=too_large)
        assert refused.status_code == 422 and "plan would have" in refused.json()["detail"]
        no_delay = http.post("/campaigns", json={**BODY, "id": "no-delay", "delay": {"family": "unknown"}})
        assert no_delay.status_code == 422 and "delay" in no_delay.json()["detail"]
        assert http.get("/campaigns/too-large").status_code == 404

        assert http.post("/campaigns", json=SERVED).status_code == 201
        plan = wait_for_plan(http, "guha")
        assert plan["horizon"] == 30 and plan["delay_plays"] == 2 and plan["states"] > 0
        assert plan["lp_bound"] <= 30 and sorted(plan["order"]) == [0, 1, 2]
        decisions = [http.post("/choose", json={"campaign": "guha"}).json() for _ in range(12)]
        assert all(d["policy"] == "guha-bayes" and not d["fallback"] and d["propensity"] == 1.0 for d in decisions)
        assert BODY["arms"][plan["order"][0]] in {d["arm"] for d in decisions}  # the top-priority arm plays
        now = iso(datetime.now(UTC))
        events = [{"type": "conversion", "decision_id": d["decision_id"], "occurred_at": now} for d in decisions[:5]]
        assert http.post("/feedback", json={"events": events}).json()["accepted"] == 5
        state = http.get("/campaigns/guha/state").json()
        assert sum(row["conversions"] for row in state["arms"].values()) == 5
        assert state["decisions"] == sum(row["pulls"] for row in state["arms"].values()) >= 13
        metrics = http.get("/metrics").text
        for name in ("latebandit_plan_seconds", "latebandit_plan_states", "latebandit_plan_memory_bytes"):
            assert f'{name}{{campaign="guha"' in metrics
        assert 'latebandit_plans_total{campaign="guha",result="ok"}' in metrics
