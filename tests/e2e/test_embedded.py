"""The embedded default end to end: a real `latebandit serve` (uvicorn), in-process state, SQLite audit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest

from latebandit.timeutil import MICROS, wall_clock
from latebandit.tokens import TokenSigner
from tests.e2e.server import SECRET, cli, running, service_env
from tests.waiting import until

pytestmark = pytest.mark.e2e

CAMPAIGN = {
    "id": "summer-sale",
    "arms": ["a", "b", "c"],
    "policy": {"name": "delayed-klucb", "params": {}},
    "delay": {"family": "exponential", "mean": 60},
    "window": 600,
    "default_arm": "a",
}
ADMIN_KEY, DECIDE_KEY = "admin-key-6d0b3f8e", "decide-key-1c7a9e42"  # 16+ bytes: shorter keys are refused


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def assert_same_state(left: dict, right: dict) -> None:
    assert left.keys() == right.keys()
    assert {k: left[k] for k in ("campaign", "policy", "decisions", "as_of")} == {
        k: right[k] for k in ("campaign", "policy", "decisions", "as_of")
    }
    for arm, row in left["arms"].items():
        other = right["arms"][arm]
        for key in ("pulls", "conversions", "pending"):
            assert row[key] == other[key], (arm, key)
        for key in ("effective_pulls", "estimate", "index"):
            if row[key] is None or other[key] is None:
                assert row[key] == other[key], (arm, key)
            else:
                assert row[key] == pytest.approx(other[key], rel=1e-9, abs=1e-12), (arm, key)


def test_choose_feedback_state_restart_export_replay(tmp_path) -> None:
    env = service_env(tmp_path)
    with running(env, tmp_path) as server, server.client() as http:
        assert http.post("/campaigns", json=CAMPAIGN).status_code == 201
        assert http.post("/campaigns", json=CAMPAIGN).status_code == 409
        decisions = [http.post("/choose", json={"campaign": "summer-sale"}).json() for _ in range(30)]
        assert all(not d["fallback"] and d["arm"] in CAMPAIGN["arms"] for d in decisions)
        assert {d["policy"] for d in decisions} == {"delayed-klucb"}
        now = datetime.now(UTC)
        events = [
            {"type": "conversion", "event_id": f"e{i}", "decision_id": d["decision_id"], "occurred_at": iso(now)}
            for i, d in enumerate(decisions[::2])
        ]
        first = http.post("/feedback", json={"events": events}).json()
        assert first == {"accepted": 15, "duplicates": 0, "censored": 0, "repeats": 0, "stale": 0, "rejected": []}
        retry = http.post("/feedback", json={"events": events}).json()
        assert retry == {"accepted": 0, "duplicates": 15, "censored": 0, "repeats": 0, "stale": 0, "rejected": []}
        state = http.get("/campaigns/summer-sale/state").json()
        assert state["decisions"] == 30
        assert sum(row["pulls"] for row in state["arms"].values()) == 30
        assert sum(row["conversions"] for row in state["arms"].values()) == 15
        later = iso(now + timedelta(hours=1))
        before_restart = http.get("/campaigns/summer-sale/state", params={"at": later}).json()

    # The embedded store lives in memory; a restart rebuilds it from the SQLite audit log.
    with running(env, tmp_path) as server, server.client() as http:
        after_restart = http.get("/campaigns/summer-sale/state", params={"at": later}).json()
        assert_same_state(before_restart, after_restart)
        live = http.get("/campaigns/summer-sale/state").json()

    log = tmp_path / "log.jsonl"
    log.write_text(cli(env, tmp_path, "export").stdout)
    kinds = [orjson.loads(line)["type"] for line in log.read_text().splitlines()]
    assert kinds.count("decision") == 30 and kinds.count("conversion") == 15 and kinds[0] == "campaign"
    out = tmp_path / "state.json"
    cli(env, tmp_path, "replay", str(log), "--at", live["as_of"], "--dump-state", str(out))
    assert_same_state(live, orjson.loads(out.read_bytes()))


def test_bad_input_is_rejected_per_event_and_changes_nothing(tmp_path) -> None:
    with running(service_env(tmp_path), tmp_path) as server, server.client() as http:
        http.post("/campaigns", json=CAMPAIGN)
        decision = http.post("/choose", json={"campaign": "summer-sale"}).json()
        before = http.get("/campaigns/summer-sale/state").json()
        now = datetime.now(UTC)
        forged = decision["decision_id"][:-2] + ("AA" if not decision["decision_id"].endswith("AA") else "BB")
        events = [
            {"type": "conversion", "decision_id": forged, "occurred_at": iso(now)},
            {"type": "conversion", "decision_id": decision["decision_id"], "occurred_at": iso(now + timedelta(days=1))},
            {"type": "conversion", "decision_id": decision["decision_id"], "occurred_at": iso(now - timedelta(days=1))},
            {"type": "conversion", "decision_id": decision["decision_id"], "occurred_at": iso(now), "value": 2},
            {"type": "conversion", "decision_id": decision["decision_id"], "occurred_at": "yesterday"},
            {"type": "aggregate", "campaign": "summer-sale", "start": iso(now), "end": iso(now), "value": 3},
            {"type": "aggregate", "campaign": "nope", "start": iso(now), "end": iso(now), "value": 3},
            {"type": "mystery"},
            "not an object",
        ]
        result = http.post("/feedback", json={"events": events}).json()
        assert result["accepted"] == 0
        assert [r["reason"] for r in result["rejected"]] == [
            "bad_decision_id", "future_timestamp", "before_decision", "value_out_of_range", "malformed_event",
            "wrong_feedback_kind", "unknown_campaign", "malformed_event", "malformed_event",
        ]  # fmt: skip
        assert [r["index"] for r in result["rejected"]] == list(range(len(events)))
        assert http.post("/feedback", json={"nope": []}).status_code == 422
        assert http.post("/feedback", content=b"{").status_code == 422
        assert http.post("/feedback", json={"events": [{}] * 10_001}).status_code == 413
        assert http.post("/choose", json={"campaign": "no-such"}).status_code == 404
        assert http.post("/choose", json={"campaign": "bad id!"}).status_code == 422
        bad_campaign = {**CAMPAIGN, "id": "x", "default_arm": "zzz"}
        response = http.post("/campaigns", json=bad_campaign)
        assert response.status_code == 422 and "default_arm" in response.json()["detail"]
        after = http.get("/campaigns/summer-sale/state").json()
        assert after["decisions"] == before["decisions"]
        assert after["arms"] == {arm: {**row, "effective_pulls": after["arms"][arm]["effective_pulls"],
                                       "estimate": after["arms"][arm]["estimate"], "index": after["arms"][arm]["index"]}
                                 for arm, row in before["arms"].items()}  # fmt: skip


def test_censoring_pause_and_request_id(tmp_path) -> None:
    with running(service_env(tmp_path), tmp_path) as server, server.client() as http:
        http.post("/campaigns", json={**CAMPAIGN, "window": 1})
        decision = http.post("/choose", json={"campaign": "summer-sale", "request_id": "r1"}).json()
        again = http.post("/choose", json={"campaign": "summer-sale", "request_id": "r1"}).json()
        assert again == decision
        # A time in the future within the skew counts as received now: within the 1 s window here.
        soon = {"type": "conversion", "event_id": "soon", "decision_id": decision["decision_id"],
                "occurred_at": iso(datetime.now(UTC) + timedelta(seconds=100))}  # fmt: skip
        assert http.post("/feedback", json={"events": [soon]}).json() == {
            "accepted": 1, "duplicates": 0, "censored": 0, "repeats": 0, "stale": 0, "rejected": []}  # fmt: skip
        slow = http.post("/choose", json={"campaign": "summer-sale"}).json()
        window_end = TokenSigner(SECRET).verify(slow["decision_id"]).decided_at + 1 * MICROS
        until(lambda: wall_clock() > window_end, "the end of the decision's 1 s window")
        late = {"type": "conversion", "decision_id": slow["decision_id"], "occurred_at": iso(datetime.now(UTC))}
        assert http.post("/feedback", json={"events": [late]}).json()["censored"] == 1
        state = http.get("/campaigns/summer-sale/state").json()
        assert sum(row["conversions"] for row in state["arms"].values()) == 1
        assert http.post("/campaigns/summer-sale/pause").json()["status"] == "paused"
        paused = http.post("/choose", json={"campaign": "summer-sale", "request_id": "p1"}).json()
        assert paused["fallback"] is True and paused["arm"] == "a"
        assert http.post("/choose", json={"campaign": "summer-sale", "request_id": "p1"}).json() == paused
        other = http.post("/choose", json={"campaign": "summer-sale", "request_id": "r2"}).json()
        event = {"type": "conversion", "decision_id": other["decision_id"], "occurred_at": iso(datetime.now(UTC))}
        assert http.post("/feedback", json={"events": [event]}).json()["rejected"][0]["reason"] == "campaign_paused"
        http.post("/campaigns/summer-sale/resume")
        assert http.post("/choose", json={"campaign": "summer-sale"}).json()["fallback"] is False
        # The conversion of a fallback decision is recorded but never counted.
        result = http.post("/feedback", json={"events": [event]}).json()
        assert result["accepted"] == 1
        state = http.get("/campaigns/summer-sale/state").json()
        assert sum(row["conversions"] for row in state["arms"].values()) == 1
        assert state["decisions"] == 3
    # Fallback decisions are in the audit log too, so the export replays without orphans.
    lines = [orjson.loads(line) for line in cli(service_env(tmp_path), tmp_path, "export").stdout.splitlines()]
    fallbacks = [line for line in lines if line["type"] == "decision" and line.get("fallback")]
    assert {line["decision_id"] for line in fallbacks} == {paused["decision_id"], other["decision_id"]}
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(orjson.dumps(line).decode() for line in lines))
    assert "skipped" not in cli(service_env(tmp_path), tmp_path, "replay", str(log)).stderr


def test_api_keys_scopes_and_metrics(tmp_path) -> None:
    env = service_env(tmp_path, api_keys=f"decide:{DECIDE_KEY},admin:{ADMIN_KEY}")
    admin, decide = {"Authorization": f"Bearer {ADMIN_KEY}"}, {"Authorization": f"Bearer {DECIDE_KEY}"}
    with running(env, tmp_path) as server, server.client() as http:
        assert http.post("/campaigns", json=CAMPAIGN).status_code == 401
        assert http.post("/campaigns", json=CAMPAIGN, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert http.post("/campaigns", json=CAMPAIGN, headers=decide).status_code == 403
        assert http.post("/campaigns", json=CAMPAIGN, headers=admin).status_code == 201
        assert http.post("/choose", json={"campaign": "summer-sale"}).status_code == 401
        assert http.post("/choose", content=b"not json").status_code == 401  # the key is checked first
        assert http.post("/campaigns", content=b"not json", headers=decide).status_code == 403
        assert http.get("/openapi.json").status_code == 401
        assert http.get("/no-such-route", headers=admin).json()["error"] == "not_found"
        assert http.post("/choose", json={"campaign": "summer-sale"}, headers=decide).status_code == 200
        assert http.post("/choose", json={"campaign": "summer-sale"}, headers=admin).status_code == 200
        assert http.get("/campaigns/summer-sale/state", headers=decide).status_code == 403
        assert http.get("/campaigns/summer-sale/state", headers=admin).status_code == 200
        metrics = http.get("/metrics").text
        for name in (
            "latebandit_decisions_total",
            "latebandit_decision_seconds_bucket",
            "latebandit_arm_effective_pulls",
            "latebandit_arm_index",
            "latebandit_audit_backlog",
        ):
            assert name in metrics, name
        assert 'latebandit_decisions_total{arm="' in metrics and 'outcome="new"' in metrics
        assert http.get("/healthz").status_code == 200 and http.get("/readyz").json()["ready"] is True


def test_serve_refuses_a_public_bind_without_keys(tmp_path) -> None:
    refused = cli(service_env(tmp_path), tmp_path, "serve", "--host", "0.0.0.0", "--port", "1", check=False)
    assert refused.returncode == 2 and "API keys" in refused.stderr


def test_serve_refuses_a_placeholder_api_key_saying_what_to_set(tmp_path) -> None:
    env = service_env(tmp_path, api_keys=f"admin:{ADMIN_KEY},decide:REPLACE-ME")
    refused = cli(env, tmp_path, "serve", "--port", "1", check=False)
    said = " ".join(refused.stderr.split())  # as one line, however the console wrapped it
    assert refused.returncode == 2 and "API key 2 of LATEBANDIT_API_KEYS (decide)" in said
    assert "openssl rand -hex 16" in said and "REPLACE-ME" not in said


def test_state_at_a_past_time_replays_the_audit_log(tmp_path) -> None:
    with running(service_env(tmp_path), tmp_path) as server, server.client() as http:
        http.post("/campaigns", json=CAMPAIGN)
        for _ in range(5):
            http.post("/choose", json={"campaign": "summer-sale"})
        middle = http.get("/campaigns/summer-sale/state").json()
        for _ in range(7):
            http.post("/choose", json={"campaign": "summer-sale"})
        past = http.get("/campaigns/summer-sale/state", params={"at": middle["as_of"]}).json()
        assert_same_state(middle, past)
        assert http.get("/campaigns/summer-sale/state").json()["decisions"] == 12
        early = http.get("/campaigns/summer-sale/state", params={"at": "2000-01-01T00:00:00Z"})
        assert early.status_code == 404
