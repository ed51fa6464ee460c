"""The exploration floor end to end on real Redis: a deterministic policy with a floor logs the exact
mixture propensities, its exported log is evaluable off-policy, and the same policy without a floor
writes a log that `replay --policy` refuses."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

import orjson
import pytest

from tests.e2e.server import cli, running, service_env

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

ARMS = ["a", "b", "c", "d"]
FLOOR = 0.05
DECISIONS = 300


def campaign(campaign_id: str, floor: float) -> dict:
    return {"id": campaign_id, "arms": ARMS, "policy": {"name": "fixed", "params": {"arm": "a"}},
            "window": 2, "exploration_floor": floor}  # fmt: skip


def now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def test_floor_propensities_export_and_off_policy_evaluation(tmp_path, redis_url, redis_prefix) -> None:
    env = service_env(tmp_path, redis_url=redis_url, redis_prefix=redis_prefix)
    with running(env, tmp_path) as server, server.client() as http:
        assert http.post("/campaigns", json=campaign("floored", FLOOR)).status_code == 201
        assert http.post("/campaigns", json=campaign("plain", 0.0)).status_code == 201
        assert http.post("/campaigns", json=campaign("too-much", 0.26)).status_code == 422
        floored = []
        for _ in range(DECISIONS):
            floored.append((http.post("/choose", json={"campaign": "floored"}).json(), now()))
        plain = [(http.post("/choose", json={"campaign": "plain"}).json(), now()) for _ in range(50)]
        # Only arm b converts, at once: every estimate below is then exact (see the last assertions).
        events = [
            {"type": "conversion", "decision_id": decision["decision_id"], "occurred_at": at}
            for decision, at in floored + plain
            if decision["arm"] == "b"
        ]
        assert http.post("/feedback", json={"events": events}).json()["rejected"] == []
        time.sleep(2.5)  # every window closes before the log's last line
        http.post("/choose", json={"campaign": "floored"})
        http.post("/choose", json={"campaign": "plain"})

    # (1 − K·floor)·π(arm) + floor, with π the fixed policy's one-hot distribution on arm a
    expected = {arm: (1 - len(ARMS) * FLOOR) * (arm == "a") + FLOOR for arm in ARMS}
    for decision, _ in floored:
        assert decision["propensity"] == pytest.approx(expected[decision["arm"]], rel=1e-12)
    share_a = sum(decision["arm"] == "a" for decision, _ in floored) / DECISIONS
    assert abs(share_a - expected["a"]) < 5 * math.sqrt(expected["a"] * (1 - expected["a"]) / DECISIONS)
    assert {(d["arm"], d["propensity"]) for d, _ in plain} == {("a", 1.0)}

    log = tmp_path / "floored.jsonl"
    log.write_text(cli(env, tmp_path, "export", "--campaign", "floored").stdout)
    logged = [orjson.loads(line) for line in log.read_text().splitlines()]
    assert logged[0]["exploration_floor"] == FLOOR
    by_id = {d["decision_id"]: d["propensity"] for d, _ in floored}
    decisions = [line for line in logged if line["type"] == "decision" and line["decision_id"] in by_id]
    assert len(decisions) == DECISIONS and all(line["propensity"] == by_id[line["decision_id"]] for line in decisions)

    out, plot = tmp_path / "estimates.json", tmp_path / "value.png"
    args = ["--policy", "uniform", "--policy", "fixed", "--params", "{}", "--params", '{"arm": "b"}']
    shown = cli(env, tmp_path, "replay", str(log), *args, "--json", str(out), "--plot", str(plot))
    assert "doubly-robust" in shown.stdout and "ESS" in shown.stdout
    uniform, fixed_b = orjson.loads(out.read_bytes())
    for document in (uniform, fixed_b):
        assert set(document) == {"policy", "estimator", "value", "ci95", "effective_sample_size"}
        assert document["estimator"] == "doubly-robust" and document["effective_sample_size"] > 0
    # Rewards are 1 exactly on arm b: the cross-fitted model is exact, so DR returns π(b) with no noise.
    assert fixed_b["value"] == pytest.approx(1.0, abs=1e-12) and uniform["value"] == pytest.approx(0.25, abs=1e-12)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    plain_log = tmp_path / "plain.jsonl"
    plain_log.write_text(cli(env, tmp_path, "export", "--campaign", "plain").stdout)
    refused = cli(env, tmp_path, "replay", str(plain_log), "--policy", "uniform", check=False)
    assert refused.returncode == 1 and "deterministic" in refused.stderr and "exploration_floor" in refused.stderr
