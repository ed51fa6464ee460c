"""Secrets and exposure against the real service (issue 19): uvicorn run directly keeps the loopback rule and
refuses unsafe settings; no secret, key or password reaches the log or a process's arguments; a secret
rotated between restarts keeps the decision ids it signed valid while it is listed as previous."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from tests.e2e.server import LATEBANDIT, cli, free_port, public_address, running, service_env, started
from tests.e2e.test_embedded import CAMPAIGN, iso

pytestmark = pytest.mark.e2e

UVICORN = [sys.executable, "-m", "uvicorn", "latebandit.api.app:create_app", "--factory"]


def test_uvicorn_run_directly_serves_only_loopback_without_keys(tmp_path: Path) -> None:
    port = free_port()
    command = [*UVICORN, "--host", "0.0.0.0", "--port", str(port)]
    with started(command, service_env(tmp_path), tmp_path, port) as server:
        assert httpx.get(server.url + "/campaigns").status_code == 200
        refused = httpx.get(f"http://{public_address()}:{port}/campaigns")
        assert refused.status_code == 403 and refused.json()["error"] == "loopback_only"
    for setting, says in (
        ({"LATEBANDIT_HOST": "0.0.0.0"}, "refusing to listen on 0.0.0.0 without API keys"),
        ({"LATEBANDIT_SECRET": "change-me-in-production"}, "LATEBANDIT_SECRET is shorter than 32 bytes"),
    ):
        env = {**service_env(tmp_path), **setting}
        exited = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert exited.returncode != 0 and says in exited.stderr


def test_serve_refuses_a_placeholder_secret_and_warns_of_one_on_its_command_line(tmp_path: Path) -> None:
    placeholder = "REPLACE-ME-with-openssl-rand-hex-32"  # deploy/kubernetes/secret.yaml's
    refused = cli(service_env(tmp_path), tmp_path, "serve", "--port", "1", "--secret", placeholder, check=False)
    assert refused.returncode == 2
    assert "--secret on the command line" in refused.stderr and "LATEBANDIT_SECRET is a placeholder" in refused.stderr
    assert placeholder not in refused.stderr


def session_arguments(leader: int) -> list[str]:
    """The command lines of every process of the session ``leader`` started (what `ps` shows)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == leader:  # state, ppid, pgrp, session
                found.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, IndexError):
            continue  # the process ended meanwhile
    return found


@pytest.mark.redis
@pytest.mark.postgres
def test_no_secret_reaches_the_log_or_the_process_arguments(
    tmp_path: Path, redis_url: str, redis_prefix: str, postgres_url: str
) -> None:
    hidden = {name: f"{name}-{uuid.uuid4().hex}" for name in ("secret", "previous", "admin", "password")}
    parts = urlsplit(postgres_url)  # trust authentication: the password is sent, never asked for
    host = parts.netloc.rsplit("@", 1)[-1]
    with_password = urlunsplit(parts._replace(netloc=f"{parts.username}:{hidden['password']}@{host}"))
    env = service_env(
        tmp_path, redis_url=redis_url, redis_prefix=redis_prefix, database_url=with_password, log_level="debug",
        secret=hidden["secret"], previous_secrets=hidden["previous"], api_keys=f"admin:{hidden['admin']}",
    )  # fmt: skip
    migrated = cli(env, tmp_path, "migrate")
    with running(env, tmp_path, workers=2) as server:
        arguments = session_arguments(server.process.pid)
        with server.client(headers={"Authorization": f"Bearer {hidden['admin']}"}) as http:
            assert http.post("/campaigns", json=CAMPAIGN).status_code == 201
            assert http.post("/choose", json={"campaign": CAMPAIGN["id"]}).status_code == 200
            assert http.get("/readyz").json()["ready"] is True
    log = server.log.read_text()
    assert "Application startup complete" in log and len(arguments) >= 3  # the server and its two workers
    for value in hidden.values():
        assert value not in log and value not in migrated.stdout + migrated.stderr
        assert not any(value in line for line in arguments)


def test_a_rotated_secret_keeps_its_decision_ids_valid_while_listed(tmp_path: Path) -> None:
    old, new = f"old-secret-{uuid.uuid4().hex}", f"new-secret-{uuid.uuid4().hex}"

    def conversion(decision: dict) -> dict:
        return {"type": "conversion", "decision_id": decision["decision_id"], "occurred_at": iso(datetime.now(UTC))}

    with running(service_env(tmp_path, secret=old), tmp_path) as server, server.client() as http:
        assert http.post("/campaigns", json=CAMPAIGN).status_code == 201
        before = [http.post("/choose", json={"campaign": CAMPAIGN["id"]}).json() for _ in range(2)]
    rotated = service_env(tmp_path, secret=new, previous_secrets=old)
    with running(rotated, tmp_path) as server, server.client() as http:
        assert http.post("/feedback", json={"events": [conversion(before[0])]}).json()["accepted"] == 1
        after = http.post("/choose", json={"campaign": CAMPAIGN["id"]}).json()
    with running(service_env(tmp_path, secret=new), tmp_path) as server, server.client() as http:
        body = http.post("/feedback", json={"events": [conversion(before[1]), conversion(after)]}).json()
    assert body["accepted"] == 1
    assert [(item["index"], item["reason"]) for item in body["rejected"]] == [(0, "bad_decision_id")]


@pytest.mark.redis
def test_hosts_sharing_a_redis_refuse_to_start_without_a_secret_and_agree_with_one(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """Two hosts (their own working directories, so their own secret files) on one Redis. Without a secret
    each used to sign with one it generated, and host B rejected host A's decision ids: both refuse to start,
    saying what to set; with the secret they set, B accepts A's ids."""
    hosts = [tmp_path / "a", tmp_path / "b"]
    for workdir in hosts:
        workdir.mkdir()
        env = service_env(workdir, redis_url=redis_url, redis_prefix=redis_prefix)
        del env["LATEBANDIT_SECRET"]
        command = [*LATEBANDIT, "serve", "--port", str(free_port())]  # a start would serve until the timeout
        refused = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2
        assert "LATEBANDIT_SECRET is not set" in refused.stderr and "same value on each" in refused.stderr
        assert not (workdir / "latebandit.db.secret").exists()
    shared = {"redis_url": redis_url, "redis_prefix": redis_prefix}
    with running(service_env(hosts[0], **shared), hosts[0]) as a, a.client() as http:
        assert http.post("/campaigns", json=CAMPAIGN).status_code == 201
        decision = http.post("/choose", json={"campaign": CAMPAIGN["id"]}).json()
    with running(service_env(hosts[1], **shared), hosts[1]) as b, b.client() as http:
        event = {"type": "conversion", "decision_id": decision["decision_id"], "occurred_at": iso(datetime.now(UTC))}
        assert http.post("/feedback", json={"events": [event]}).json()["accepted"] == 1
