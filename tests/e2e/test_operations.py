"""What an operator relies on, against the real service: the compose file's API command (several uvicorn
workers, Redis, PostgreSQL, API keys) serving traffic whose /metrics holds every metric the dashboard and
the alert rules name, with the values the traffic implies; JSON logs with request ids and no secret;
a policy change over HTTP; and the image's entry command and healthcheck run as the Dockerfile says."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from latebandit.logs import mask
from latebandit.timeutil import MICROS, wall_clock
from latebandit.tokens import TokenSigner
from tests.deploy.promql import PROMETHEUS_OWN, alert_rules, dashboard_expressions, metric_names
from tests.deploy.test_deploy_files import compose, dockerfile_command, interpolated
from tests.e2e.server import LATEBANDIT, cli, free_port, public_address, service_env, started
from tests.e2e.test_client import OFFER, RANKED
from tests.e2e.test_embedded import iso
from tests.waiting import until

pytestmark = [pytest.mark.e2e]

DECIDE_KEY = f"decide-{uuid.uuid4().hex}"
ADMIN_KEY = f"admin-{uuid.uuid4().hex}"
METRICS_KEY = f"metrics-{uuid.uuid4().hex}"
SECRET = f"secret-{uuid.uuid4().hex}"
WRONG_KEY = f"guess-{uuid.uuid4().hex}"
CAMPAIGN = {
    "id": "ops",
    "arms": ["a", "b", "c"],
    "policy": {"name": "delayed-klucb"},
    "delay": {"family": "exponential", "mean": 3600},
    "window": 2,  # seconds: a conversion reported 3 s after its decision is censored
}
WORKERS = 2  # compose runs 4; this machine has 2 cores


def direct(command: list[str], port: int, **replace: str) -> list[str]:
    """A container command run here: the console script from this checkout, our port, some flags changed."""
    args = [*LATEBANDIT, *command[1:]] if command[0] == "latebandit" else list(command)
    for flag, value in {"--port": str(port), **replace}.items():
        if flag in args:
            args[args.index(flag) + 1] = value
    return args


def scrape(http: httpx.Client) -> dict[str, list[tuple[dict[str, str], float]]]:
    """/metrics as sample name -> [(labels, value)], parsed by prometheus-client's own text parser."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            samples[sample.name].append((sample.labels, sample.value))
    return samples


def total(samples: dict, name: str, **labels: str) -> float:
    return sum(value for found, value in samples.get(name, []) if labels.items() <= found.items())


@pytest.mark.redis
@pytest.mark.postgres
def test_compose_api_serves_metrics_logs_and_policy_changes(tmp_path, redis_url, redis_prefix, postgres_url) -> None:
    api = compose()["services"]["api"]
    variables = {
        "LATEBANDIT_SECRET": SECRET,
        "DECIDE_KEY": DECIDE_KEY,
        "ADMIN_KEY": ADMIN_KEY,
        "METRICS_KEY": METRICS_KEY,
    }
    environment = interpolated(api["environment"], variables)  # the .env of docker-compose.yml's instructions
    settings = {key.removeprefix("LATEBANDIT_").lower(): value for key, value in environment.items()}
    settings |= {"redis_url": redis_url, "redis_prefix": redis_prefix, "database_url": postgres_url}
    env = service_env(tmp_path, **settings)
    cli(env, tmp_path, "migrate")
    port = free_port()
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with (
        started(direct(api["command"], port, **{"--workers": str(WORKERS)}), env, tmp_path, port) as server,
        server.client(headers={"Authorization": f"Bearer {DECIDE_KEY}"}) as http,
    ):
        assert http.post("/campaigns", json=CAMPAIGN, headers=admin).status_code == 201
        assert http.post("/campaigns", json=RANKED, headers=admin).status_code == 201
        assert http.post("/campaigns", json=CAMPAIGN).status_code == 403  # a decide key on an admin route
        assert httpx.post(server.url + "/choose", json={"campaign": "ops"}).status_code == 401
        unknown = {"Authorization": f"Bearer {WRONG_KEY}"}
        assert httpx.post(server.url + "/choose", json={"campaign": "ops"}, headers=unknown).status_code == 401
        before = iso(datetime.now(UTC))  # a conversion dated before its decision (within the skew) has delay 0
        traced = http.post("/choose", json={"campaign": "ops"}, headers={"X-Request-ID": "trace-42"})
        assert traced.headers["x-request-id"] == "trace-42"
        decisions = [traced.json()] + [http.post("/choose", json={"campaign": "ops"}).json() for _ in range(29)]
        generated = http.get("/healthz").headers["x-request-id"]
        assert len(generated) == 32

        conversions = [
            {"type": "conversion", "event_id": f"e{i}", "decision_id": d["decision_id"], "occurred_at": before}
            for i, d in enumerate(decisions[:5])
        ]
        bad = [{"type": "conversion", "decision_id": decisions[5]["decision_id"][:-4] + "AAAA", "occurred_at": before}]
        body = http.post("/feedback", json={"events": [*conversions, conversions[0], *bad]}).json()
        assert (body["accepted"], body["duplicates"]) == (5, 1)
        assert [item["reason"] for item in body["rejected"]] == ["bad_decision_id"]
        window_end = TokenSigner(SECRET).verify(decisions[6]["decision_id"]).decided_at + CAMPAIGN["window"] * MICROS
        until(lambda: wall_clock() > window_end, "the end of the decision's window")  # a conversion now is censored
        late = {"type": "conversion", "decision_id": decisions[6]["decision_id"], "occurred_at": iso(datetime.now(UTC))}
        assert http.post("/feedback", json={"events": [late]}).json()["censored"] == 1

        assert http.post("/campaigns/ops/pause", headers=admin).json()["status"] == "paused"
        assert http.post("/choose", json={"campaign": "ops"}).json()["fallback"] is True
        assert http.post("/campaigns/ops/resume", headers=admin).json()["status"] == "active"

        change = {"policy": {"name": "delayed-ucb", "params": {}}}
        refused = http.post("/campaigns/ops/policy", json={"policy": {"name": "no-such-policy"}}, headers=admin)
        assert refused.status_code == 422 and "unknown policy" in refused.json()["detail"]
        assert http.post("/campaigns/nope/policy", json=change, headers=admin).status_code == 404
        changed = http.post("/campaigns/ops/policy", json=change, headers=admin).json()
        assert (changed["version"], changed["policy"]["name"], changed["arms"]) == (2, "delayed-ucb", CAMPAIGN["arms"])
        after = [http.post("/choose", json={"campaign": "ops"}).json() for _ in range(4)]  # either worker
        assert {d["policy"] for d in after} == {"delayed-ucb"}
        state = http.get("/campaigns/ops/state", headers=admin).json()
        assert (state["policy"], state["decisions"]) == ("delayed-ucb", 4)
        ranked = http.post("/choose", json={"campaign": "ranked", "actions": OFFER})  # publishes its model gauges
        assert ranked.status_code == 200, ranked.text
        named = set().union(*(metric_names(rule["expr"]) for rule in alert_rules()),
                            *(metric_names(expression) for expression in dashboard_expressions()))  # fmt: skip
        probes: list[dict] = []  # decisions until one reads the histogram again (the snapshot interval is 1 s),

        def every_named_metric_exported() -> bool:  # which publishes the per-arm gauges (the pending age)
            probes.append(http.post("/choose", json={"campaign": "ops"}).json())
            return named - PROMETHEUS_OWN <= scrape(http).keys()

        until(every_named_metric_exported, "every metric the alerts and the dashboard name in /metrics")

        samples = scrape(http)  # over loopback: no key needed
        from_elsewhere = f"http://{public_address()}:{port}/metrics"  # as compose's Prometheus scrapes it
        assert httpx.get(from_elsewhere).status_code == 401
        assert httpx.get(from_elsewhere, headers={"Authorization": f"Bearer {METRICS_KEY}"}).status_code == 200
        assert named - PROMETHEUS_OWN - samples.keys() == set()
        decided = total(samples, "latebandit_decisions_total", campaign="ops")
        assert decided == 30 + 1 + 4 + len(probes)
        assert total(samples, "latebandit_decisions_total", campaign="ops", outcome="fallback_paused") == 1
        outcomes = {outcome: total(samples, "latebandit_feedback_events_total", campaign="ops", outcome=outcome)
                    for outcome in ("counted", "duplicate", "censored")}  # fmt: skip
        assert outcomes == {"counted": 5, "duplicate": 1, "censored": 1}
        assert total(samples, "latebandit_feedback_rejected_total", reason="bad_decision_id") == 1
        assert total(samples, "latebandit_conversion_delay_seconds_count", campaign="ops") == 6
        assert total(samples, "latebandit_campaign_policy_version", campaign="ops") == 2
        assert total(samples, "latebandit_campaign_window_seconds", campaign="ops") == 2
        assert total(samples, "latebandit_store_up") == 1 and total(samples, "latebandit_audit_up") == 1
        assumed = {labels["le"] for labels, _ in samples["latebandit_delay_assumed_ratio"]}
        observed = {labels["le"] for labels, _ in samples["latebandit_conversion_delay_seconds_bucket"]}
        assert assumed and assumed < observed  # the same bounds, so the dashboard can set them side by side
        ratios = {labels["le"]: value for labels, value in samples["latebandit_delay_assumed_ratio"]}
        assert ratios["60.0"] == 1.0  # every in-window delay (m = 2 s) lies under 60 s
        assert {labels["arm"] for labels, _ in samples["latebandit_arm_effective_pulls"]} == set(CAMPAIGN["arms"])
        decision_ids = [d["decision_id"] for d in decisions + after + probes]

    exported = cli(env, tmp_path, "export", "--campaign", "ops").stdout.splitlines()
    campaign_lines = [line for line in map(orjson.loads, exported) if line["type"] == "campaign"]
    assert [
        (line["version"], line["policy"]["name"], "arms" in line) for line in campaign_lines if "policy" in line
    ] == [
        (1, "delayed-klucb", True),  # the creation
        (2, "delayed-ucb", False),  # the change
    ]
    assert_json_logs(
        server.log.read_text(), secrets=[DECIDE_KEY, ADMIN_KEY, METRICS_KEY, WRONG_KEY, SECRET, *decision_ids]
    )


def assert_json_logs(text: str, secrets: list[str]) -> None:
    lines = [orjson.loads(line) for line in text.splitlines() if line.strip()]  # every line is JSON
    access = [line for line in lines if line["logger"] == "latebandit.access"]
    assert len(access) > 40
    assert all(len(line["request_id"]) >= 8 and line["status"] >= 200 for line in access)
    assert {"trace-42"} <= {line["request_id"] for line in access}
    assert {line["status"] for line in access} >= {200, 201, 401, 403, 404, 422}
    named = [line for line in access if line["path"] in ("/choose", "/feedback") and line["status"] == 200]
    assert {line["campaign"] for line in named} == {"ops", "ranked"}  # each names its campaign
    admin = [line for line in lines if line["logger"] == "latebandit.admin"]
    assert [line["message"] for line in admin][-1] == "campaign policy changed" and admin[-1]["version"] == 2
    for secret in secrets:
        assert secret not in text


def test_mask_cuts_keys_and_decision_ids() -> None:
    token = "b3BzfDF8MTc5NTQzMjQzNDg1MTQ0MHwxfGU2Mjk0YmM4YTAzMnw.bgzGM7ZZTAkaL42U_SbaAA"
    text = mask(f"Authorization: Bearer {ADMIN_KEY} sent {token} for campaign summer-sale")
    assert ADMIN_KEY not in text and token not in text
    assert text == f"Authorization: Bearer {ADMIN_KEY[:6]}… sent {token[:6]}… for campaign summer-sale"


def test_the_image_command_and_healthcheck_run_as_the_dockerfile_says(tmp_path) -> None:
    """The Dockerfile's CMD (a non-loopback bind: refused without keys) and HEALTHCHECK, run here as the image
    would run them, in a fresh working directory (the embedded default)."""
    port = free_port()
    command = direct(dockerfile_command("CMD"), port)
    healthcheck = [part.replace(":8000/", f":{port}/") for part in dockerfile_command("HEALTHCHECK")]
    healthcheck[0] = sys.executable if healthcheck[0] == "python" else healthcheck[0]
    refused = subprocess.run(
        command, cwd=tmp_path, env=service_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2 and "refusing to listen on 0.0.0.0" in refused.stderr  # no keys, no --insecure
    keys = tmp_path / "api-keys"  # keys from a file, as from a mounted secret
    keys.write_text(f"admin:{ADMIN_KEY}\ndecide:{DECIDE_KEY}\n")
    env = service_env(tmp_path, api_keys_file=str(keys))
    with started(command, env, tmp_path, port) as server:
        assert subprocess.run(healthcheck, timeout=30).returncode == 0
        assert httpx.get(server.url + "/readyz").json()["ready"] is True
        listed = httpx.get(server.url + "/campaigns", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert listed.json() == {"campaigns": []}
        forbidden = httpx.get(server.url + "/campaigns", headers={"Authorization": f"Bearer {DECIDE_KEY}"})
        assert forbidden.status_code == 403
        assert_bodies_are_limited(server.url, {"Authorization": f"Bearer {DECIDE_KEY}"})
    assert subprocess.run(healthcheck, capture_output=True, timeout=30).returncode != 0  # stopped: unhealthy
    with started([*command, "--insecure"], service_env(tmp_path), tmp_path, port) as server:  # told to: it starts
        assert httpx.post(server.url + "/campaigns", json={}).status_code == 422  # no key asked: open
    assert "listening on 0.0.0.0 with no API keys" in server.log.read_text()


def assert_bodies_are_limited(url: str, headers: dict[str, str]) -> None:
    """Over 16 MiB: a 413 by the declared length, and while streaming a body that declares none."""
    limit = 16 * 1024 * 1024
    declared = httpx.post(url + "/feedback", content=b" " * (limit + 1), headers=headers, timeout=60)
    assert declared.status_code == 413 and declared.json()["error"] == "body_too_large"

    def chunks() -> Iterator[bytes]:
        for _ in range(17):
            yield b" " * (1024 * 1024)

    streamed = httpx.post(url + "/feedback", content=chunks(), headers=headers, timeout=60)
    assert streamed.status_code == 413
    assert httpx.post(url + "/feedback", content=b'{"events": []}', headers=headers).status_code == 200
