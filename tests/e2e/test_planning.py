"""Planning policies (ODAAF, ARS-*, CLW) over HTTP: real uvicorn workers on one real Redis, clients in
several processes claiming slots at once, aggregates and watermarks, the audit log in PostgreSQL."""

from __future__ import annotations

import math
import multiprocessing
from datetime import UTC, datetime, timedelta

import httpx
import orjson
import psycopg
import pytest
import redis

from latebandit.policies import make_policy
from tests.e2e.server import cli, running, service_env
from tests.e2e.test_embedded import iso
from tests.e2e.test_redis_postgres import wait_for_audit

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres]

HORIZON = 1000
PARAMS = {"mean_delay": 0, "horizon": HORIZON}
ODAAF = {"id": "summer-sale", "arms": ["a", "b", "c"], "policy": {"name": "odaaf", "params": PARAMS},
         "allowed_lateness": 3600}  # fmt: skip
CLIENTS, DECISIONS_PER_CLIENT = 4, 200


def chooser(url: str, seed: int, queue: multiprocessing.Queue) -> None:
    with httpx.Client(base_url=url, timeout=30.0) as http:
        arms = [
            http.post("/choose", json={"campaign": "summer-sale"}).json()["arm"] for _ in range(DECISIONS_PER_CLIENT)
        ]
    queue.put(arms)


def test_concurrent_clients_get_blocks_of_exactly_their_length(tmp_path, redis_url, redis_prefix, postgres_url) -> None:
    block = math.ceil(make_policy("odaaf", PARAMS, 3).n(1, HORIZON))  # ν_1 = N_1 slots per arm in phase 1
    total = CLIENTS * DECISIONS_PER_CLIENT
    assert 3 * block < total
    env = service_env(tmp_path, redis_url=redis_url, redis_prefix=redis_prefix, database_url=postgres_url)
    cli(env, tmp_path, "migrate")
    with running(env, tmp_path, workers=2) as server, server.client() as http:
        assert http.post("/campaigns", json=ODAAF).status_code == 201
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        processes = [context.Process(target=chooser, args=(server.url, seed, queue)) for seed in range(CLIENTS)]
        for process in processes:
            process.start()
        answers = [arm for _ in processes for arm in queue.get(timeout=120)]
        for process in processes:
            process.join()
        state = http.get("/campaigns/summer-sale/state").json()
        assert state["decisions"] == total
        # Phase 1's blocks, then the hold (the provisional leader, a) while phase 1's feedback is pending.
        assert {arm: row["pulls"] for arm, row in state["arms"].items()} == {
            "a": total - 2 * block, "b": block, "c": block,
        }  # fmt: skip
        assert sorted(answers) == sorted(["a"] * (total - 2 * block) + ["b"] * block + ["c"] * block)
        assert state["policy_state"]["current_segment"]["kind"] == "hold"
        wait_for_audit(redis_url, redis_prefix)
        with psycopg.connect(postgres_url) as db:
            rows = db.execute(
                "SELECT seq, arm FROM audit_decisions WHERE campaign = 'summer-sale' ORDER BY seq"
            ).fetchall()
        assert [seq for seq, _ in rows] == list(range(1, total + 1))  # one slot per decision, none twice
        expected = ["a"] * block + ["b"] * block + ["c"] * block + ["a"] * (total - 3 * block)
        assert [arm for _, arm in rows] == expected  # in slot order, each block exactly ν_1 long

        # A watermark past phase 1's blocks closes the phase; the next decision makes phase 2's plan.
        events = [{"type": "watermark", "campaign": "summer-sale", "at": iso(datetime.now(UTC))}]
        assert http.post("/feedback", json={"events": events}).json()["accepted"] == 1
        http.post("/choose", json={"campaign": "summer-sale"})  # sees the next plan due and makes it
        after = http.get("/campaigns/summer-sale/state").json()["policy_state"]
        assert after["plan_version"] == 2 and after["plan"]["state"]["m"] == 2


def test_aggregates_watermarks_and_rejections_over_http(tmp_path) -> None:
    env = service_env(tmp_path)
    campaign = {**ODAAF, "policy": {"name": "ars-ucb"}}  # short rounds: several end within the test
    with running(env, tmp_path) as server, server.client() as http:
        assert http.post("/campaigns", json=campaign).status_code == 201
        first = http.post("/choose", json={"campaign": "summer-sale"}).json()
        since = datetime.now(UTC)  # after the first decision: an aggregate from here on is credited whole
        assert first["arm"] == "a" and first["propensity"] == 1.0 and first["fallback"] is False
        for _ in range(20):
            http.post("/choose", json={"campaign": "summer-sale"})
        now = datetime.now(UTC)
        seconds = (now - since).total_seconds()
        events = [
            {"type": "aggregate", "campaign": "summer-sale", "event_id": "h1", "start": iso(since),
             "end": iso(now), "value": 7.5},
            {"type": "aggregate", "campaign": "summer-sale", "event_id": "h1", "start": iso(since),
             "end": iso(now), "value": 7.5},
            {"type": "conversion", "decision_id": first["decision_id"], "occurred_at": iso(now)},
            {"type": "aggregate", "campaign": "summer-sale", "start": iso(now), "end": iso(now - timedelta(seconds=1)),
             "value": 1},
            {"type": "aggregate", "campaign": "summer-sale", "start": iso(now), "end": iso(now), "value": -1},
            {"type": "aggregate", "campaign": "summer-sale", "start": iso(now), "end": iso(now + timedelta(days=1)),
             "value": 1},
            {"type": "aggregate", "campaign": "summer-sale", "start": "2001-01-01T00:00:00Z",
             "end": "2001-01-01T01:00:00Z", "value": 1},
            {"type": "watermark", "campaign": "summer-sale", "at": iso(now)},
            {"type": "aggregate", "campaign": "nope", "start": iso(now), "end": iso(now), "value": 1},
        ]  # fmt: skip
        body = http.post("/feedback", json={"events": events}).json()
        reasons = {item["index"]: item["reason"] for item in body["rejected"]}
        assert reasons == {3: "malformed_event", 4: "value_out_of_range", 5: "future_timestamp",
                           6: "before_decision", 8: "unknown_campaign"}  # fmt: skip
        assert (body["accepted"], body["duplicates"]) == (3, 1)
        state = http.get("/campaigns/summer-sale/state").json()
        credited = sum(row["conversions"] for row in state["arms"].values())
        assert credited == pytest.approx(8.5)  # the aggregate and the conversion, once each
        # Everything up to now is closed by the watermark: a late aggregate for it is refused, and recorded.
        late = {"type": "aggregate", "campaign": "summer-sale", "start": iso(since),
                "end": iso(since + timedelta(seconds=seconds / 2)), "value": 1}  # fmt: skip
        body = http.post("/feedback", json={"events": [late]}).json()
        assert body["rejected"][0]["reason"] == "phase_closed" and "recorded" in body["rejected"][0]["detail"]
        metrics = http.get("/metrics").text
        assert 'latebandit_feedback_rejected_total{reason="phase_closed"} 1.0' in metrics
        lines = cli(env, tmp_path, "export", "--campaign", "summer-sale").stdout.splitlines()
        assert sum('"phase_closed"' in line for line in lines) == 1
        # An attributed policy refuses aggregates, with the reason.
        http.post("/campaigns", json={"id": "attr", "arms": ["x", "y"], "policy": {"name": "ucb1"}})
        refused = http.post("/feedback", json={"events": [{**events[0], "campaign": "attr"}]}).json()
        assert refused["rejected"][0]["reason"] == "wrong_feedback_kind"


def test_planning_campaign_needs_its_delay_facts(tmp_path) -> None:
    env = service_env(tmp_path)
    with running(env, tmp_path) as server, server.client() as http:
        missing = http.post("/campaigns", json={**ODAAF, "policy": {"name": "odaaf"},
                                                "delay": {"family": "exponential", "mean": 60}})  # fmt: skip
        assert missing.status_code == 422 and "decisions_per_second" in missing.text
        unbounded = http.post("/campaigns", json={**ODAAF, "policy": {"name": "odaaf-b"}, "slot_seconds": 60,
                                                  "delay": {"family": "exponential", "mean": 60}})  # fmt: skip
        assert unbounded.status_code == 422 and "max_delay" in unbounded.text
        given = http.post("/campaigns", json={**ODAAF, "policy": {"name": "odaaf-b"}, "decisions_per_second": 5,
                                              "delay": {"family": "uniform", "low": 0, "high": 2}})  # fmt: skip
        assert given.status_code == 201, given.text
        resolved = given.json()["policy"]["resolved_params"]
        assert resolved["mean_delay"] == 5.0 and resolved["max_delay"] == 10.0  # seconds × decisions per second
        assert resolved["horizon"] == 0  # doubling epochs
        wallclock = {**ODAAF, "id": "slots", "policy": {"name": "ars-ucb"}, "slot_seconds": 60}
        assert http.post("/campaigns", json=wallclock).status_code == 201
        arms = {http.post("/choose", json={"campaign": "slots"}).json()["arm"] for _ in range(5)}
        assert arms == {"a"}  # one arm per one-minute slot


def test_export_replay_and_rebuild_restore_a_schedule(tmp_path, redis_url, redis_prefix, postgres_url) -> None:
    """Rounds of ARS-UCB with aggregates and watermarks; replaying the export gives the live state, and
    after Redis lost its data `latebandit rebuild` restores the schedule so that decisions go on as before."""
    env = service_env(tmp_path, redis_url=redis_url, redis_prefix=redis_prefix, database_url=postgres_url)
    cli(env, tmp_path, "migrate")
    campaign = {**ODAAF, "policy": {"name": "ars-ucb"}}  # segments close by watermark only
    with running(env, tmp_path) as server, server.client() as http:
        assert http.post("/campaigns", json=campaign).status_code == 201
        for round_ in range(12):
            started = datetime.now(UTC)
            arms = [http.post("/choose", json={"campaign": "summer-sale"}).json()["arm"] for _ in range(6)]
            value = {"a": 1.0, "b": 4.0, "c": 2.0}[arms[-1]]
            events = [
                {"type": "aggregate", "campaign": "summer-sale", "event_id": f"r{round_}", "start": iso(started),
                 "end": iso(datetime.now(UTC)), "value": value},
                {"type": "watermark", "campaign": "summer-sale", "at": iso(started)},
            ]  # fmt: skip
            assert http.post("/feedback", json={"events": events}).json()["accepted"] == 2
        live = http.get("/campaigns/summer-sale/state").json()
        assert live["policy_state"]["plan_version"] > 5
        wait_for_audit(redis_url, redis_prefix)
        log = tmp_path / "log.jsonl"
        log.write_text(cli(env, tmp_path, "export", "--campaign", "summer-sale").stdout)
        out = tmp_path / "state.json"
        cli(env, tmp_path, "replay", str(log), "--at", live["as_of"], "--dump-state", str(out))
        replayed = orjson.loads(out.read_bytes())
        assert replayed["arms"] == live["arms"]
        assert replayed["policy_state"] == live["policy_state"]

        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{redis_prefix}:*"):
            client.delete(key)
        assert http.post("/choose", json={"campaign": "summer-sale"}).json()["fallback"] is True
        cli(env, tmp_path, "rebuild")
        rebuilt = http.get("/campaigns/summer-sale/state").json()
        assert rebuilt["arms"] == live["arms"] and rebuilt["policy_state"] == live["policy_state"]
        decision = http.post("/choose", json={"campaign": "summer-sale"}).json()
        assert decision["fallback"] is False
        assert (
            http.get("/campaigns/summer-sale/state").json()["policy_state"]["slot"] == live["policy_state"]["slot"] + 1
        )
