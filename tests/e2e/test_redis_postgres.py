"""Production wiring end to end: several uvicorn workers on one real Redis, audit in real PostgreSQL,
clients in several processes retrying and duplicating feedback; then export, replay and rebuild."""

from __future__ import annotations

import multiprocessing
import random
import time
from datetime import UTC, datetime, timedelta

import httpx
import orjson
import pytest
import redis

from tests.e2e.server import cli, running, service_env
from tests.e2e.test_embedded import CAMPAIGN, assert_same_state, iso

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres]

CLIENTS = 4
DECISIONS_PER_CLIENT = 60


def client_run(url: str, seed: int, queue: multiprocessing.Queue) -> None:
    """Choose, then send each conversion in small batches, sometimes twice (a retry after a lost answer)."""
    rng = random.Random(seed)
    converted: list[str] = []
    with httpx.Client(base_url=url, timeout=30.0) as http:
        for i in range(DECISIONS_PER_CLIENT):
            decision = http.post("/choose", json={"campaign": "summer-sale", "request_id": f"c{seed}-{i}"}).json()
            if rng.random() < 0.5:
                converted.append(decision["decision_id"])
        now = iso(datetime.now(UTC))
        events = [{"type": "conversion", "decision_id": d, "occurred_at": now} for d in converted]
        accepted = duplicates = 0
        for start in range(0, len(events), 7):
            batch = events[start : start + 7]
            for _ in range(2 if rng.random() < 0.5 else 1):
                body = http.post("/feedback", json={"events": batch}).json()
                accepted += body["accepted"]
                duplicates += body["duplicates"]
    queue.put((len(converted), accepted, duplicates))


def wait_for_audit(redis_url: str, prefix: str, timeout: float = 30.0) -> None:
    """Until the writer has drained the campaign's audit stream into PostgreSQL."""
    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.xlen(f"{prefix}:{{summer-sale}}:audit") == 0:
            return
        time.sleep(0.2)
    raise AssertionError("the audit log did not catch up")


def test_workers_clients_export_replay_rebuild(tmp_path, redis_url, redis_prefix, postgres_url) -> None:
    env = service_env(tmp_path, redis_url=redis_url, redis_prefix=redis_prefix, database_url=postgres_url)
    refused = cli(env, tmp_path, "serve", "--port", "1", check=False)
    assert refused.returncode != 0 and "migrate" in refused.stderr + refused.stdout
    cli(env, tmp_path, "migrate")
    with running(env, tmp_path, workers=2) as server, server.client() as http:
        assert http.get("/readyz").json()["ready"] is True
        assert http.post("/campaigns", json=CAMPAIGN).status_code == 201
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        clients = [context.Process(target=client_run, args=(server.url, seed, queue)) for seed in range(CLIENTS)]
        for process in clients:
            process.start()
        results = [queue.get(timeout=120) for _ in clients]
        for process in clients:
            process.join()
        converted = sum(r[0] for r in results)
        assert sum(r[1] for r in results) == converted  # every conversion accepted exactly once
        state = http.get("/campaigns/summer-sale/state").json()
        assert state["decisions"] == CLIENTS * DECISIONS_PER_CLIENT
        assert sum(row["pulls"] for row in state["arms"].values()) == CLIENTS * DECISIONS_PER_CLIENT
        assert sum(row["conversions"] for row in state["arms"].values()) == converted
        wait_for_audit(redis_url, redis_prefix)
        later = iso(datetime.now(UTC) + timedelta(hours=1))
        before = http.get("/campaigns/summer-sale/state", params={"at": later}).json()
        live = http.get("/campaigns/summer-sale/state").json()

        log = tmp_path / "log.jsonl"
        log.write_text(cli(env, tmp_path, "export", "--campaign", "summer-sale").stdout)
        lines = [orjson.loads(line) for line in log.read_text().splitlines()]
        assert sum(line["type"] == "decision" for line in lines) == CLIENTS * DECISIONS_PER_CLIENT
        assert sum(line["type"] == "conversion" for line in lines) == converted
        out = tmp_path / "state.json"
        cli(env, tmp_path, "replay", str(log), "--at", live["as_of"], "--dump-state", str(out))
        assert_same_state(live, orjson.loads(out.read_bytes()))

        # Redis loses everything: decisions fall back (flagged), feedback is refused with 503.
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{redis_prefix}:*"):
            client.delete(key)
        assert all(http.post("/choose", json={"campaign": "summer-sale"}).json()["fallback"] for _ in range(4))
        event = {"type": "conversion", "decision_id": lines[-1]["decision_id"], "occurred_at": iso(datetime.now(UTC))}
        assert http.post("/feedback", json={"events": [event]}).status_code == 503
        # The id lives on in the audit log: it cannot be taken by a new campaign.
        again = http.post("/campaigns", json={**CAMPAIGN, "arms": ["x", "y"], "default_arm": "x"})
        assert again.status_code == 409 and "rebuild" in again.json()["detail"]
        cli(env, tmp_path, "rebuild")
        after = http.get("/campaigns/summer-sale/state", params={"at": later}).json()
        assert_same_state(before, after)
        assert http.post("/choose", json={"campaign": "summer-sale"}).json()["fallback"] is False


def test_decisions_and_feedback_flow_while_postgres_is_down(tmp_path, redis_url, redis_prefix, postgres_url) -> None:
    """The audit database is unreachable: nothing stops, the audit queue holds everything; only creating a
    campaign waits (503), because its id must be checked against the audit history."""
    env = service_env(tmp_path, redis_url=redis_url, redis_prefix=redis_prefix, database_url=postgres_url)
    cli(env, tmp_path, "migrate")
    with running(env, tmp_path) as server, server.client() as http:
        assert http.post("/campaigns", json=CAMPAIGN).status_code == 201
    wait_for_audit(redis_url, redis_prefix)
    env["LATEBANDIT_DATABASE_URL"] = "postgresql://postgres@127.0.0.1:1/nowhere"
    with running(env, tmp_path) as server, server.client() as http:
        ready = http.get("/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["store"] == "ok"
        refused = http.post("/campaigns", json={**CAMPAIGN, "id": "other"})
        assert refused.status_code == 503 and "audit log is unreachable" in refused.json()["detail"]
        decisions = [http.post("/choose", json={"campaign": "summer-sale"}).json() for _ in range(10)]
        assert not any(d["fallback"] for d in decisions)
        now = iso(datetime.now(UTC))
        events = [{"type": "conversion", "decision_id": d["decision_id"], "occurred_at": now} for d in decisions[:4]]
        assert http.post("/feedback", json={"events": events}).json()["accepted"] == 4
        backlog = redis.Redis.from_url(redis_url).xlen(f"{redis_prefix}:{{summer-sale}}:audit")
        assert backlog == 10 + 1  # ten decisions and one feedback batch, all waiting
