"""PatientBandits served on real Redis, the app in process on a clock the test moves: the bias term and the
per-arm delay histogram that GET /campaigns/{id}/state and /metrics report, against values recomputed here
from the decisions' own times."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from latebandit.config import Settings
from latebandit.timeutil import parse_time
from latebandit.tokens import TokenSigner
from tests.e2e.server import SECRET
from tests.e2e.test_embedded import iso
from tests.inprocess import ManualClock, served

WINDOW, BUCKETS, ALPHA, SCALE = 64.0, 64, 0.3, 0.5  # histogram cells of one second
DELAYS = (0.3, 1.2, 2.5, 0.3)  # seconds, cycled over the converted decisions


def psi(age: float) -> float:
    return 1.0 if age <= SCALE else (age / SCALE) ** -ALPHA


def delay_bucket(delay: float) -> int:
    """Bucket 0 below 1 s, then [2^((j−1)/2), 2^(j/2)), counted by hand."""
    j = 0
    while delay >= 2 ** (j / 2):
        j += 1
    return j


def at(decided_at: int, delay: float) -> str:
    return iso(datetime.fromtimestamp((decided_at + round(delay * 1e6)) / 1e6, UTC))


async def test_state_and_metrics_report_bias_and_delays(tmp_path, redis_url, redis_prefix) -> None:
    settings = Settings(_env_file=None, redis_url=redis_url, redis_prefix=redis_prefix, secret=SECRET,
                        database_url=f"sqlite:///{tmp_path / 'audit.db'}")  # fmt: skip
    signer = TokenSigner(SECRET)
    clock = ManualClock()
    campaign = {
        "id": "patient", "arms": ["a", "b"], "window": WINDOW, "buckets": BUCKETS,
        "policy": {"name": "patient-bandits", "params": {"alpha": ALPHA, "scale": SCALE}},
    }  # fmt: skip
    async with served(settings, clock) as http:
        literal = {**campaign, "id": "literal", "policy": {"name": "adapt-patient-bandits", "params": {"estimator": 0}}}
        refused = await http.post("/campaigns", json=literal)
        assert refused.status_code == 422 and "simulator" in refused.text
        assert (await http.post("/campaigns", json=campaign)).status_code == 201
        decisions = []
        for _ in range(24):
            decisions.append((await http.post("/choose", json={"campaign": "patient"})).json())
            clock.advance(0.1)
        clock.advance(max(DELAYS) + 0.5)  # every conversion below has occurred by now
        tokens = [signer.verify(d["decision_id"]) for d in decisions]
        converted = list(zip(decisions[::2], tokens[::2], DELAYS * 3, strict=False))
        events = [
            {"type": "conversion", "decision_id": d["decision_id"], "occurred_at": at(token.decided_at, delay)}
            for d, token, delay in converted
        ]
        assert (await http.post("/feedback", json={"events": events})).json()["accepted"] == len(events)
        state = (await http.get("/campaigns/patient/state")).json()
        metrics = (await http.get("/metrics")).text

    as_of = parse_time(state["as_of"])
    width = round(WINDOW * 1e6) // BUCKETS
    for k, arm in enumerate(campaign["arms"]):
        row = state["arms"][arm]
        mine = [token for token in tokens if token.arm == k]
        assert row["pulls"] == len(mine)
        youngest = [(as_of - (token.decided_at // width + 1) * width) / 1e6 for token in mine]
        weight = sum(psi(age) for age in youngest if age < WINDOW)
        assert state["policy_state"]["bias"][k] == pytest.approx(min(1.0, weight / len(mine)), rel=1e-9)
        buckets: dict[int, int] = {}
        for _, token, delay in converted:
            if token.arm == k:
                buckets[delay_bucket(delay)] = buckets.get(delay_bucket(delay), 0) + 1
        delays = row["delays"]
        assert delays["observed"] == sum(buckets.values())
        reported = {round(2 * math.log2(high)) if low else 0: count for low, high, count in delays["buckets"]}
        assert reported == buckets
        assert {"estimate", "index", "pending", "effective_pulls", "conversions"} <= row.keys()
        observed = float(sum(buckets.values()))
        assert f'latebandit_arm_observed_delays{{arm="{arm}",campaign="patient"}} {observed}' in metrics
    assert state["policy_state"]["alpha"] == ALPHA
    assert 'latebandit_arm_delay_quantile_seconds{arm="a",campaign="patient",quantile="0.5"}' in metrics
