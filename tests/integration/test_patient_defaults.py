"""patient-bandits created as a new user would (arms, policy name, the delay model), served on real Redis
on a clock the test moves: the campaign's default window and the policy's alpha and scale follow the
declared delay, so the bias term reads pulls by their age. With a fixed 30-day window (11.25-hour histogram
cells) and a one-hour scale, every arm's bias read 1.0 however old its pulls were."""

from __future__ import annotations

import pytest

from latebandit.config import Settings
from tests.e2e.server import SECRET
from tests.inprocess import ManualClock, served

PARETO = {"family": "pareto", "alpha": 1.5, "scale": 60}  # P(D > a) = (a/60)^−1.5: 99.9 % by 6,000 s
SECONDS, EVERY = 3600, 4.0  # an hour of one decision every four seconds


async def test_defaults_follow_the_declared_delay(tmp_path, redis_url, redis_prefix) -> None:
    settings = Settings(_env_file=None, redis_url=redis_url, redis_prefix=redis_prefix, secret=SECRET,
                        database_url=f"sqlite:///{tmp_path / 'audit.db'}")  # fmt: skip
    clock = ManualClock()
    campaign = {"id": "w1", "arms": ["a", "b", "c", "d"], "policy": {"name": "patient-bandits"}, "delay": PARETO}
    async with served(settings, clock) as http:
        created = (await http.post("/campaigns", json=campaign)).json()
        for _ in range(round(SECONDS / EVERY)):
            assert (await http.post("/choose", json={"campaign": "w1"})).status_code == 200
            clock.advance(EVERY)
        state = (await http.get("/campaigns/w1/state")).json()

    assert created["window"] == 6000.0  # cells of 94 s instead of 11.25 h
    resolved = created["policy"]["resolved_params"]
    assert resolved["alpha"] == 1.5 and resolved["scale"] == pytest.approx(60.0, rel=0.005)
    assert all(state["arms"][arm]["pulls"] > 0 for arm in campaign["arms"])
    # Pulls spread over an hour: at most ψ's area over the window (3·60 s) plus the newest cell (94 s) per
    # pull-second of the window, 274/3600 at a steady rate; an arm pulled in bursts reads a little more.
    assert max(state["policy_state"]["bias"]) < 0.2
