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
    settings = settings_for(tmp_path, redis_url, redis_prefix)
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


def settings_for(tmp_path, redis_url: str, redis_prefix: str) -> Settings:
    return Settings(_env_file=None, redis_url=redis_url, redis_prefix=redis_prefix, secret=SECRET,
                    database_url=f"sqlite:///{tmp_path / 'audit.db'}")  # fmt: skip


async def test_odaaf_b_without_horizon_plays_every_arm_in_its_first_phase(tmp_path, redis_url, redis_prefix) -> None:
    """Uniform 0–200 s delays at one decision a second: E[τ] = 100 slots, d = 200, N_1 = 1,432 slots per arm,
    more than the first doubling epoch (1,024). The epoch's end cut the first block and restarted on the
    first arm behind a bridge of 10·E[τ] slots on it, so the third arm waited thousands of decisions."""
    campaign = {"id": "ob", "arms": ["a", "b", "c"], "policy": {"name": "odaaf-b"},
                "delay": {"family": "uniform", "low": 0, "high": 200}, "decisions_per_second": 1}  # fmt: skip
    clock = ManualClock()
    async with served(settings_for(tmp_path, redis_url, redis_prefix), clock) as http:
        created = await http.post("/campaigns", json=campaign)
        assert created.status_code == 201, created.text
        block = 1432
        arms = []
        for _ in range(3 * block):
            arms.append((await http.post("/choose", json={"campaign": "ob"})).json()["arm"])
            clock.advance(1.0)
    assert arms == ["a"] * block + ["b"] * block + ["c"] * block


async def test_campaigns_where_the_delay_swamps_the_blocks_are_refused(tmp_path, redis_url, redis_prefix) -> None:
    """The reference world (Pareto α 1.5, scale 60 s: mean 180 s, at 20 decisions/s: 3,600 slots) and the
    anonymous-feedback page's campaign (uniform 0–600 s at 20/s): each arm's first block would be 99 % delay."""
    pareto = {"family": "pareto", "alpha": 1.5, "scale": 60}
    uniform = {"family": "uniform", "low": 0, "high": 600}
    async with served(settings_for(tmp_path, redis_url, redis_prefix), ManualClock()) as http:
        for name, delay, says in [
            ("odaaf", pareto, "cannot learn at this delay"),
            ("odaaf-b", uniform, "cannot learn at this delay"),
            ("odaaf-v", pareto, "delay_variance"),
        ]:
            body = {"id": name, "arms": ["a", "b", "c", "d"], "policy": {"name": name}, "delay": delay,
                    "decisions_per_second": 20}  # fmt: skip
            refused = await http.post("/campaigns", json=body)
            assert refused.status_code == 422 and says in refused.text, refused.text
            assert "slot_seconds" in refused.text or name == "odaaf-v"
            assert (await http.get(f"/campaigns/{name}")).status_code == 404
        slower = {"id": "slow", "arms": ["a", "b"], "policy": {"name": "odaaf-b"}, "delay": uniform,
                  "decisions_per_second": 0.5}  # fmt: skip
        assert (await http.post("/campaigns", json=slower)).status_code == 201
