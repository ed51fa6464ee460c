"""Pike-Burke 2018's policies served at their defaults, the app in process on a clock the test moves:
they must learn where the simulator says they learn, with the service's own defaults (the 30-day window,
no horizon, delays in seconds turned into slots by the declared rate)."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from latebandit.config import Settings
from latebandit.tokens import TokenSigner
from tests.e2e.server import SECRET
from tests.e2e.test_embedded import iso
from tests.inprocess import ManualClock, served

RATES = [0.5, 0.3, 0.1]
RATE_PER_SECOND = 20


def occurs(at: int) -> str:
    return iso(datetime.fromtimestamp(at / 1e6, UTC))


async def test_qpm_d_prefers_the_best_arm_with_the_default_window(tmp_path, redis_url, redis_prefix) -> None:
    """With the default 30-day window, a pull that did not convert stays pending for 30 days: counting only
    resolved pulls, every estimate read 1.0 and the index favoured the arm with the fewest conversions."""
    settings = Settings(_env_file=None, redis_url=redis_url, redis_prefix=redis_prefix, secret=SECRET,
                        database_url=f"sqlite:///{tmp_path / 'audit.db'}")  # fmt: skip
    signer, clock, rng = TokenSigner(SECRET), ManualClock(), np.random.default_rng(3)
    campaign = {"id": "qpm", "arms": ["a", "b", "c"], "policy": {"name": "qpm-d"},
                "delay": {"family": "pareto", "alpha": 1.5, "scale": 2.0}}  # fmt: skip
    due: list[tuple[int, str]] = []  # (occurs at µs, decision id)
    pulls = np.zeros(len(RATES))
    async with served(settings, clock) as http:
        assert (await http.post("/campaigns", json=campaign)).status_code == 201
        for _ in range(75):  # seconds
            for _ in range(RATE_PER_SECOND):
                decision = (await http.post("/choose", json={"campaign": "qpm"})).json()
                token = signer.verify(decision["decision_id"])
                pulls[token.arm] += 1
                if rng.random() < RATES[token.arm]:
                    delay = 2.0 * (1.0 + rng.pareto(1.5))
                    due.append((token.decided_at + round(delay * 1e6), decision["decision_id"]))
                clock.advance(1 / RATE_PER_SECOND)
            ready = [item for item in due if item[0] <= clock.now]
            due = [item for item in due if item[0] > clock.now]
            events = [
                {"type": "conversion", "decision_id": decision_id, "occurred_at": occurs(at)}
                for at, decision_id in ready
            ]
            if events:
                assert (await http.post("/feedback", json={"events": events})).status_code == 200
        state = (await http.get("/campaigns/qpm/state")).json()
    estimates = [state["arms"][arm]["estimate"] for arm in campaign["arms"]]
    assert pulls.argmax() == 0 and pulls[0] > 0.5 * pulls.sum(), pulls
    assert estimates[0] < 0.8 and estimates[2] < 0.4, estimates
