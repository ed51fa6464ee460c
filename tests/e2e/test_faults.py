"""Faults during traffic: an API worker killed, Redis lost, PostgreSQL unreachable. Real uvicorn workers,
real Redis and PostgreSQL, client processes that retry what was not acknowledged; afterwards GET /state and
the audit log hold exactly what the clients were acknowledged, once."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import signal
import time
from http import client as http_client
from pathlib import Path

import httpx
import orjson
import psycopg
import pytest
import redis

from latebandit.engine.feedback import MAX_EVENTS
from latebandit.store.keys import Keys
from tests.e2e.server import Server, cli, running, service_env
from tests.e2e.test_embedded import CAMPAIGN
from tests.e2e.traffic import Fleet, Gate, Plan, assert_exact, more_traffic, now_iso, wait_for_audit
from tests.faults import children, redis_server, serving_process, tcp_proxy
from tests.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres]

NAMES = ["north", "south"]
SPAWN = multiprocessing.get_context("spawn")


def create_campaigns(http: httpx.Client) -> None:
    for name in NAMES:
        assert http.post("/campaigns", json={**CAMPAIGN, "id": name}).status_code == 201


def workers(server: Server) -> list[int]:
    """uvicorn's worker processes (children of its supervisor other than multiprocessing's helpers); a child
    that ends while it is listed (a worker being replaced) is left out."""
    found = []
    for pid in children(server.process.pid):
        with contextlib.suppress(OSError):
            if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def gauge(http: httpx.Client, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", http.get("/metrics").text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def outage_answers(http: httpx.Client) -> tuple[float, float]:
    """Decisions answered with a fallback because the store was down or had lost the campaign, and /feedback
    requests answered 503 for it, so far (every worker's, from /metrics): the clients' and the test's own."""
    text = http.get("/metrics").text
    fallbacks = sum(
        float(value)
        for value in re.findall(
            r'^latebandit_decisions_total\{[^}]*outcome="fallback_store_down"[^}]*\} (\S+)$', text, re.MULTILINE
        )
    )
    refused = re.search(r'^latebandit_store_errors_total\{operation="feedback"\} (\S+)$', text, re.MULTILINE)
    return fallbacks, float(refused.group(1)) if refused else 0.0


def beyond_own(now: tuple[float, ...], seen: tuple[float, ...], own: int) -> bool:
    """Whether every count grew by more than the test's ``own`` requests since ``seen``: the clients' too."""
    return all(count > before + own for count, before in zip(now, seen, strict=True))


def kill_mid_batch(server: Server, http: httpx.Client, redis_url: str, prefix: str, postgres_url: str) -> int:
    """Send a batch of 10,000 conversions (applied in atomic chunks of 1,000), kill -9 the worker serving it
    once the first chunk is in, and retry the batch: the events applied before the kill come back as
    duplicates, the others are accepted, and the audit log has each event once. Returns the killed worker."""
    http.post("/campaigns", json={**CAMPAIGN, "id": "bulk"}).raise_for_status()
    decisions = [http.post("/choose", json={"campaign": "bulk"}).json()["decision_id"] for _ in range(100)]
    events = [{"type": "conversion", "event_id": f"big{i}", "decision_id": decisions[i % 100], "occurred_at": now_iso()}
              for i in range(MAX_EVENTS)]  # fmt: skip
    body = orjson.dumps({"events": events})
    port = int(server.url.rsplit(":", 1)[1])
    connection = http_client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.connect()
    victim = serving_process(workers(server), port, connection.sock.getsockname()[1])
    seen = redis.Redis.from_url(redis_url)
    connection.request("POST", "/feedback", body, {"content-type": "application/json"})
    freeze_after_first_chunk(seen, Keys(prefix).dedup("bulk"))
    try:
        os.kill(victim, signal.SIGKILL)
    finally:
        seen.client_unpause()
    with pytest.raises((http_client.HTTPException, OSError)):
        connection.getresponse()
    retried = post_retrying(http, "/feedback", body).json()
    assert 0 < retried["duplicates"] < MAX_EVENTS, retried  # killed in the middle
    assert retried["accepted"] + retried["duplicates"] == MAX_EVENTS and not retried["rejected"]
    state = http.get("/campaigns/bulk/state").json()
    assert sum(row["conversions"] for row in state["arms"].values()) == 100  # once per decision
    wait_for_audit(redis_url, prefix, ["bulk"])
    with psycopg.connect(postgres_url) as db:
        rows, distinct = db.execute(
            "SELECT count(*), count(DISTINCT event_id) FROM audit_feedback WHERE campaign = 'bulk'"
        ).fetchone()
    assert rows == distinct == MAX_EVENTS
    return victim


def freeze_after_first_chunk(seen: redis.Redis, dedup_key: str) -> None:
    """Pause Redis's writes as soon as the batch's first chunk is in: the whole batch takes a fraction of a
    second, shorter than a loaded machine may take to schedule this process, so polling alone could see it
    finish before the kill. CLIENT PAUSE WRITE holds the worker's next chunk (a script) for a few ms."""
    deadline = time.monotonic() + 60
    while not seen.zcard(dedup_key):
        assert time.monotonic() < deadline, "the batch was not applied within 60 s"
    seen.client_pause(10_000, all=False)


def post_retrying(http: httpx.Client, path: str, body: bytes, attempts: int = 5) -> httpx.Response:
    """POST as a client does after a crash: a keep-alive connection to the killed worker fails once
    (reset by peer), and the request is sent again on a fresh one."""
    headers = {"content-type": "application/json"}
    for _ in range(attempts - 1):
        try:
            return http.post(path, content=body, headers=headers)
        except httpx.TransportError:
            continue
    return http.post(path, content=body, headers=headers)


def test_worker_killed_mid_stream(tmp_path, redis_url, redis_prefix, postgres_url) -> None:
    """kill -9 a worker in the middle of one large feedback batch, then each worker in turn while clients
    send decisions and feedback batches: what they held is retried, nothing is lost, nothing counted twice."""
    env = service_env(tmp_path, redis_url=redis_url, redis_prefix=redis_prefix, database_url=postgres_url)
    cli(env, tmp_path, "migrate")
    with running(env, tmp_path, workers=2) as server, server.client() as http:
        create_campaigns(http)
        killed = [kill_mid_batch(server, http, redis_url, redis_prefix, postgres_url)]
        gate = Gate.make(SPAWN)
        fleet = Fleet.start(
            Plan(server.url, NAMES, decisions=100_000, batch=25, connections=4), clients=3, gate=gate, context=SPAWN
        )
        until(lambda: len(set(workers(server)) - set(killed)) == 2, "uvicorn replacing the killed worker")
        for _ in range(2):
            more_traffic(http, NAMES)
            victim = min(set(workers(server)) - set(killed))
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)
            until(lambda: len(set(workers(server)) - set(killed)) == 2, "uvicorn replacing the killed worker")
        more_traffic(http, NAMES)
        gate.finish.set()
        ledger = fleet.join()
        assert sum(ledger.retries.values()) > 0, "no request was interrupted by the kills"
        wait_for_audit(redis_url, redis_prefix, NAMES)
        assert_exact(http, ledger, NAMES, postgres_url)


@pytest.mark.parametrize("persist", [False, True], ids=["no-persistence-rebuild", "aof"])
def test_redis_lost_during_traffic(tmp_path, postgres_url, persist) -> None:
    """Redis is killed and restarted under traffic. While it is away, /choose answers flagged fallbacks and
    /feedback 503; the clients retry their feedback until it is accepted.

    Without persistence Redis comes back empty and `latebandit rebuild` restores the state from the audit
    log. The audit entries Redis held but had not yet handed to PostgreSQL (the last ~audit_interval) would
    be lost with it, so this variant pauses the clients until the queue is drained before the kill; with
    AOF (the documented production setting) the kill comes in the middle of traffic and nothing is lost."""
    with redis_server(tmp_path / "redis", persist=persist) as redis_node:
        env = service_env(tmp_path, redis_url=redis_node.url, database_url=postgres_url)
        cli(env, tmp_path, "migrate")
        with running(env, tmp_path, workers=2) as server, server.client() as http:
            create_campaigns(http)
            probe = http.post("/choose", json={"campaign": NAMES[0]}).json()
            gate = Gate.make(SPAWN)
            plan = Plan(server.url, NAMES, decisions=100_000, batch=10)
            fleet = Fleet.start(plan, clients=3, gate=gate, context=SPAWN)
            more_traffic(http, NAMES)
            if not persist:
                gate.close_and_wait(3)
                wait_for_audit(redis_node.url, "lb", NAMES)
            seen = outage_answers(http)
            redis_node.kill()
            gate.open.set()
            event = {"type": "conversion", "event_id": "probe", "decision_id": probe["decision_id"],
                     "occurred_at": now_iso()}  # fmt: skip
            for _ in range(3):
                assert http.post("/choose", json={"campaign": NAMES[0]}).json()["fallback"] is True
                assert http.post("/feedback", json={"events": [event]}).status_code == 503
            until(lambda: beyond_own(outage_answers(http), seen, 3), "the clients meeting the outage")
            redis_node.start()
            if not persist:  # back, but empty: still flagged fallbacks and 503 until the rebuild
                seen = outage_answers(http)
                assert http.post("/choose", json={"campaign": NAMES[0]}).json()["fallback"] is True
                assert http.post("/feedback", json={"events": [event]}).status_code == 503
                until(lambda: outage_answers(http)[1] > seen[1] + 1, "the clients' feedback meeting the empty Redis")
                cli(env, tmp_path, "rebuild")
            until(lambda: http.post("/feedback", json={"events": [event]}).status_code == 200, "feedback accepted")
            more_traffic(http, NAMES)
            gate.finish.set()
            ledger = fleet.join()
            ledger.decisions[probe["decision_id"]] = (NAMES[0], probe["arm"], False)
            ledger.converted.add(probe["decision_id"])
            assert ledger.fallbacks > 0 and ledger.retries["/feedback 503"] > 0, ledger.retries
            wait_for_audit(redis_node.url, "lb", NAMES)
            assert_exact(http, ledger, NAMES, postgres_url, store_died=persist)


def test_postgres_down_during_traffic(tmp_path, redis_url, redis_prefix, postgres_url) -> None:
    """The audit database goes away (every connection reset, new ones refused) under traffic: decisions and
    feedback go on, the backlog grows in /metrics, and it drains completely, without duplicate rows, when
    the database is back."""
    cli(service_env(tmp_path, database_url=postgres_url), tmp_path, "migrate")
    with tcp_proxy(postgres_url) as (proxy, proxied_url):
        env = service_env(tmp_path, redis_url=redis_url, redis_prefix=redis_prefix, database_url=proxied_url)
        with running(env, tmp_path, workers=2) as server, server.client() as http:
            create_campaigns(http)
            gate = Gate.make(SPAWN)
            fleet = Fleet.start(Plan(server.url, NAMES, decisions=100_000), clients=3, gate=gate, context=SPAWN)
            more_traffic(http, NAMES)
            proxy.cut()
            until(lambda: gauge(http, "latebandit_audit_backlog") > 0, "the backlog showing in /metrics")
            first = gauge(http, "latebandit_audit_backlog")
            until(lambda: gauge(http, "latebandit_audit_backlog") > first, "the backlog growing")
            assert http.get("/readyz").status_code == 503
            assert gauge(http, "latebandit_audit_lag_seconds") > 0
            proxy.restore()
            more_traffic(http, NAMES)
            gate.finish.set()
            ledger = fleet.join()
            assert not ledger.retries and not ledger.fallbacks, ledger.retries  # nobody noticed
            # a write caught in flight by the cut is given up only when TCP keepalive finds its connection
            # dead (audit/log.py: 30 s idle + 3 probes 10 s apart), so the drain may start a minute late
            wait_for_audit(redis_url, redis_prefix, NAMES, timeout=150.0)
            until(lambda: gauge(http, "latebandit_audit_backlog") == 0, "the backlog gauge back to 0")
            assert http.get("/readyz").status_code == 200
            assert_exact(http, ledger, NAMES, postgres_url)


def test_a_decision_is_answered_by_a_worker_that_never_saw_the_campaign(tmp_path) -> None:
    """A worker (re)started during a Redis outage has no cached campaign: it still answers /choose with the
    campaign's default arm, flagged, from the campaign's configuration in the audit log; /feedback is 503."""
    with redis_server(tmp_path / "redis") as redis_node:
        env = service_env(tmp_path, redis_url=redis_node.url)
        with running(env, tmp_path) as server, server.client() as http:
            assert http.post("/campaigns", json={**CAMPAIGN, "default_arm": "b"}).status_code == 201
            assert http.post(f"/campaigns/{CAMPAIGN['id']}/pause").status_code == 200
            assert http.post(f"/campaigns/{CAMPAIGN['id']}/resume").status_code == 200
            wait_for_audit(redis_node.url, "lb", [CAMPAIGN["id"]])
        for outage in (redis_node.kill, redis_node.restart):  # unreachable, then reachable but empty
            outage()
            with running(env, tmp_path) as server, server.client() as http:
                for _ in range(3):
                    answer = http.post("/choose", json={"campaign": CAMPAIGN["id"]})
                    assert answer.status_code == 200, answer.text
                    assert (answer.json()["arm"], answer.json()["fallback"]) == ("b", True)
                # An id neither store nor audit log knows: 404 if the store could say so, else 503 (its
                # creation may not have reached the audit log yet).
                unknown = http.post("/choose", json={"campaign": "nobody"}).status_code
                assert unknown == (503 if outage == redis_node.kill else 404)
                event = {"type": "conversion", "decision_id": answer.json()["decision_id"], "occurred_at": now_iso()}
                assert http.post("/feedback", json={"events": [event]}).status_code == 503


def test_fallback_decisions_are_audited_even_when_their_worker_is_killed(tmp_path, postgres_url) -> None:
    """Redis and PostgreSQL both away: the workers answer fallbacks, each spooled on disk before it is
    answered; then every worker is killed with kill -9, holding its spool. Once the stores are back, the
    workers uvicorn started in their place hand the spools over: every answered decision is in the audit
    log, once."""
    with redis_server(tmp_path / "redis") as redis_node, tcp_proxy(postgres_url) as (proxy, proxied):
        env = service_env(tmp_path, redis_url=redis_node.url, database_url=proxied)
        cli(env, tmp_path, "migrate")
        with running(env, tmp_path, workers=2) as server:
            with server.client() as http:
                create_campaigns(http)
            proxy.cut()
            redis_node.kill()
            answered: set[str] = set()
            deadline = time.monotonic() + 60
            while len(answered) < 20:  # a fresh connection each time, to reach both workers
                assert time.monotonic() < deadline, f"only {len(answered)} fallbacks answered"
                with server.client() as http:
                    answer = http.post("/choose", json={"campaign": NAMES[0]})
                if answer.status_code == 200:  # 503 from a worker that never cached the campaign
                    assert answer.json()["fallback"] is True
                    answered.add(answer.json()["decision_id"])
            dead = workers(server)
            for pid in dead:
                os.kill(pid, signal.SIGKILL)
            until(lambda: len(set(workers(server)) - set(dead)) == 2, "uvicorn replacing the killed workers")
            proxy.restore()
            redis_node.start()

            def audited() -> list[str]:
                with psycopg.connect(postgres_url) as db:
                    rows = db.execute("SELECT decision_id FROM audit_decisions WHERE fallback").fetchall()
                return [row[0] for row in rows]

            until(lambda: answered <= set(audited()), "the spooled decisions reaching the audit log", timeout=60)
            assert len(audited()) == len(set(audited())), "a spooled decision audited twice"
            spool = tmp_path / "latebandit-spool" / "lb"
            until(lambda: len(list(spool.glob("*.lock"))) == 2, "the killed workers' spools being removed")
