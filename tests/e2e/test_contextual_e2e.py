"""A contextual campaign in the production wiring: two uvicorn workers on real Redis, the audit log in real
PostgreSQL; then the export carries the chosen and offered features, a replay of it reproduces the model,
and a rebuild after Redis lost everything restores it (conversions of earlier decisions still count)."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import orjson
import pytest
import redis

from tests.e2e.server import cli, running, service_env
from tests.e2e.test_embedded import iso
from tests.e2e.test_redis_postgres import wait_for_audit

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.postgres]

CAMPAIGN = {"id": "summer-sale", "policy": {"name": "otf-linucb"}, "features": 4, "window": 3600, "log_actions": True}


def offered(rng: np.random.Generator) -> list[dict]:
    vectors = rng.normal(size=(6, 4))
    vectors /= np.maximum(1.0, np.linalg.norm(vectors, axis=1))[:, None]
    return [{"id": f"ad-{int(rng.integers(10**6))}-{k}", "features": row} for k, row in enumerate(vectors.tolist())]


def same_model(left: dict, right: dict) -> None:
    assert {k: left[k] for k in ("decisions", "conversions", "pending")} == {
        k: right[k] for k in ("decisions", "conversions", "pending")
    }
    np.testing.assert_allclose(left["theta"], right["theta"], rtol=1e-9, atol=1e-12)


def test_contextual_campaign_served_exported_replayed_rebuilt(tmp_path, redis_url, redis_prefix, postgres_url) -> None:
    env = service_env(tmp_path, redis_url=redis_url, redis_prefix=redis_prefix, database_url=postgres_url)
    cli(env, tmp_path, "migrate")
    rng = np.random.default_rng(11)
    with running(env, tmp_path, workers=2) as server, server.client() as http:
        assert http.post("/campaigns", json=CAMPAIGN).status_code == 201
        decisions = []
        for _ in range(80):
            answer = http.post("/choose", json={"campaign": "summer-sale", "actions": offered(rng)})
            assert answer.status_code == 200, answer.text
            decisions.append(answer.json()["decision_id"])
        now = iso(datetime.now(UTC))
        events = [{"type": "conversion", "decision_id": d, "occurred_at": now} for d in decisions[::4]]
        assert http.post("/feedback", json={"events": events}).json()["accepted"] == 20
        live = http.get("/campaigns/summer-sale/state").json()
        assert live["model"]["decisions"] == 80 and live["model"]["conversions"] == 20
        wait_for_audit(redis_url, redis_prefix)

        log = tmp_path / "log.jsonl"
        log.write_text(cli(env, tmp_path, "export", "--campaign", "summer-sale").stdout)
        lines = [orjson.loads(line) for line in log.read_text().splitlines()]
        chosen = [line for line in lines if line["type"] == "decision"]
        assert len(chosen) == 80
        for line in chosen:
            assert len(line["features"]) == 4 and len(line["actions"]) == 6
            assert line["features"] == next(a["features"] for a in line["actions"] if a["id"] == line["arm"])
        out = tmp_path / "state.json"
        cli(env, tmp_path, "replay", str(log), "--at", live["as_of"], "--dump-state", str(out))
        same_model(live["model"], orjson.loads(out.read_bytes())["model"])

        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{redis_prefix}:*"):
            client.delete(key)
        cli(env, tmp_path, "rebuild")
        rebuilt = http.get("/campaigns/summer-sale/state").json()
        same_model(live["model"], rebuilt["model"])
        late = {"type": "conversion", "decision_id": decisions[1], "occurred_at": iso(datetime.now(UTC))}
        assert http.post("/feedback", json={"events": [late]}).json()["accepted"] == 1
        assert http.get("/campaigns/summer-sale/state").json()["model"]["conversions"] == 21
