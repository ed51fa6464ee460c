"""The audit writer in its own process (`latebandit audit-writer`, LATEBANDIT_AUDIT_WRITER=external): API
workers only serve, the writer drains what they queued, exactly once, across a kill -9 of the writer."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import UTC, datetime

import httpx
import psycopg
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.server import LATEBANDIT, free_port, running, service_env
from tests.e2e.test_embedded import CAMPAIGN, iso
from tests.e2e.test_faults import gauge
from tests.e2e.test_redis_postgres import wait_for_audit
from tests.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres]


def start_writer(env: dict[str, str], workdir, port: int) -> subprocess.Popen[bytes]:
    log = open(workdir / f"writer-{port}.log", "ab")  # noqa: SIM115 (the child owns it)
    return subprocess.Popen([*LATEBANDIT, "audit-writer", "--metrics-port", str(port)], cwd=workdir, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def writer_metrics(port: int) -> dict[str, float]:
    deadline = time.monotonic() + 30
    while True:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2.0).text
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def audit_rows(postgres_url: str) -> tuple[int, int]:
    with psycopg.connect(postgres_url) as connection:
        decisions = connection.execute("SELECT count(*), count(DISTINCT decision_id) FROM audit_decisions").fetchone()
    assert decisions is not None
    return int(decisions[0]), int(decisions[1])


def test_external_writer_drains_exactly_once_across_a_kill(tmp_path, redis_url, redis_prefix, postgres_url) -> None:
    env = service_env(tmp_path, redis_url=redis_url, redis_prefix=redis_prefix, database_url=postgres_url,
                      audit_writer="external")  # fmt: skip
    subprocess.run([*LATEBANDIT, "migrate"], cwd=tmp_path, env=env, check=True, capture_output=True)
    stream = redis.Redis.from_url(redis_url)
    audit_key = f"{redis_prefix}:{{summer-sale}}:audit"
    with running(env, tmp_path) as server, server.client() as http:
        assert http.post("/campaigns", json=CAMPAIGN).status_code == 201
        decisions = [http.post("/choose", json={"campaign": "summer-sale"}).json() for _ in range(300)]
        # The worker's own watch of the queue (every second) finds all of it: a worker draining inline (every
        # 0.2 s) would have taken some while the 300 decisions were made. Nobody drains but the writer.
        until(lambda: gauge(http, "latebandit_audit_backlog") == 1 + 300, "the worker's backlog gauge seeing the queue")
        assert stream.xlen(audit_key) == 1 + 300  # the creation and every decision wait
        port = free_port()
        writer = start_writer(env, tmp_path, port)
        try:
            assert writer_metrics(port)["latebandit_audit_lag_seconds"] >= 0
            deadline = time.monotonic() + 30
            while audit_rows(postgres_url)[0] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            os.kill(writer.pid, signal.SIGKILL)  # mid-drain or just after: either way nothing may be lost
            writer.wait()
        now = iso(datetime.now(UTC))
        events = [{"type": "conversion", "decision_id": d["decision_id"], "occurred_at": now} for d in decisions[:50]]
        assert http.post("/feedback", json={"events": events}).json()["accepted"] == 50
        writer = start_writer(env, tmp_path, port)
        try:
            wait_for_audit(redis_url, redis_prefix)
            metrics = writer_metrics(port)
            assert metrics["latebandit_audit_backlog"] >= 0 and metrics["latebandit_audit_rows_total"] > 0
        finally:
            writer.send_signal(signal.SIGTERM)
            assert writer.wait(timeout=30) == 0
    assert audit_rows(postgres_url) == (300, 300)  # every decision once
    with psycopg.connect(postgres_url) as connection:
        conversions = connection.execute("SELECT count(*) FROM audit_feedback WHERE type = 'conversion'").fetchone()
    assert conversions is not None and conversions[0] == 50
