"""The exploration floor on real Redis, the app in process on a clock the test moves and the real CLI on
its audit log: a deterministic policy with a floor logs the exact mixture propensities, its exported log
is evaluable off-policy, and the same policy without a floor writes a log that `replay --policy` refuses."""

from __future__ import annotations

import math

import orjson
import pytest

from latebandit.config import Settings
from latebandit.timeutil import format_time
from tests.e2e.server import SECRET, cli, service_env
from tests.inprocess import ManualClock, served

ARMS = ["a", "b", "c", "d"]
FLOOR = 0.05
DECISIONS = 300


def campaign(campaign_id: str, floor: float) -> dict:
    return {"id": campaign_id, "arms": ARMS, "policy": {"name": "fixed", "params": {"arm": "a"}},
            "window": 2, "exploration_floor": floor}  # fmt: skip


async def test_floor_propensities_export_and_off_policy_evaluation(tmp_path, redis_url, redis_prefix) -> None:
    env = service_env(tmp_path, redis_url=redis_url, redis_prefix=redis_prefix)
    settings = Settings(_env_file=None, redis_url=redis_url, redis_prefix=redis_prefix, secret=SECRET,
                        database_url=env["LATEBANDIT_DATABASE_URL"])  # fmt: skip
    clock = ManualClock()
    async with served(settings, clock) as http:
        assert (await http.post("/campaigns", json=campaign("floored", FLOOR))).status_code == 201
        assert (await http.post("/campaigns", json=campaign("plain", 0.0))).status_code == 201
        assert (await http.post("/campaigns", json=campaign("too-much", 0.26))).status_code == 422
        floored = []
        for _ in range(DECISIONS):
            floored.append(((await http.post("/choose", json={"campaign": "floored"})).json(), format_time(clock())))
        plain = []
        for _ in range(50):
            plain.append(((await http.post("/choose", json={"campaign": "plain"})).json(), format_time(clock())))
        # Only arm b converts, at once: every estimate below is then exact (see the last assertions).
        events = [
            {"type": "conversion", "decision_id": decision["decision_id"], "occurred_at": at}
            for decision, at in floored + plain
            if decision["arm"] == "b"
        ]
        assert (await http.post("/feedback", json={"events": events})).json()["rejected"] == []
        clock.advance(2.5)  # every window closes before the log's last line
        await http.post("/choose", json={"campaign": "floored"})
        await http.post("/choose", json={"campaign": "plain"})

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
