"""POST /campaigns/{id}/arms and DELETE /campaigns/{id}/arms/{arm} as a client sees them (the app in process,
embedded store and SQLite audit log): the answers, the refusals and what GET /state shows, now and before."""

from __future__ import annotations

from latebandit.config import Settings
from latebandit.timeutil import format_time
from tests.inprocess import ManualClock, served

CAMPAIGN = {"id": "ads", "arms": ["a", "b", "c"], "policy": {"name": "klucb"}, "window": 3600}


def embedded(tmp_path) -> Settings:
    return Settings(_env_file=None, secret="arms-api-test-secret-0123456789abcdef",
                    database_url=f"sqlite:///{tmp_path / 'audit.db'}")  # fmt: skip


async def test_arms_are_added_and_retired_over_http(tmp_path) -> None:
    clock = ManualClock()
    async with served(embedded(tmp_path), clock) as http:
        assert (await http.post("/campaigns", json=CAMPAIGN)).status_code == 201
        for _ in range(6):
            clock.advance(1)
            await http.post("/choose", json={"campaign": "ads"})
        before = clock.now
        clock.advance(1)

        added = await http.post("/campaigns/ads/arms", json={"arm": "d"})
        assert added.status_code == 201, added.text
        assert (added.json()["arms"], added.json()["retired"]) == (["a", "b", "c", "d"], [])
        clock.advance(1)
        first = (await http.post("/choose", json={"campaign": "ads"})).json()
        assert (first["arm"], first["propensity"]) == ("d", 1.0)  # KL-UCB opens the new arm

        retired = await http.delete("/campaigns/ads/arms/b")
        assert retired.status_code == 200 and retired.json()["retired"] == ["b"], retired.text
        arms = set()
        for _ in range(20):
            clock.advance(1)
            arms.add((await http.post("/choose", json={"campaign": "ads"})).json()["arm"])
        assert "b" not in arms

        refusals = [
            (await http.post("/campaigns/ads/arms", json={"arm": "b"}), 409, "arm_exists"),
            (await http.delete("/campaigns/ads/arms/a"), 409, "arm_required"),
            (await http.delete("/campaigns/ads/arms/b"), 409, "arm_retired"),
            (await http.delete("/campaigns/ads/arms/zz"), 404, "unknown_arm"),
            (await http.delete("/campaigns/nope/arms/a"), 404, "unknown_campaign"),
            (await http.post("/campaigns/ads/arms", json={"arm": "bad id!"}), 422, "invalid_request"),
            (await http.post("/campaigns/ads/arms", json={"arms": ["e"]}), 422, "invalid_request"),
        ]
        for answer, status, code in refusals:
            assert (answer.status_code, answer.json()["error"]) == (status, code), answer.text

        state = (await http.get("/campaigns/ads/state")).json()
        assert state["arms"]["b"]["retired"] is True and state["arms"]["b"]["pulls"] >= 1
        assert state["arms"]["d"]["pulls"] >= 1
        past = await http.get("/campaigns/ads/state", params={"at": format_time(before)})
        assert past.status_code == 200, past.text
        assert list(past.json()["arms"]) == ["a", "b", "c"] and past.json()["decisions"] == 6


async def test_a_schedule_policy_takes_new_arms_only_with_a_restart(tmp_path) -> None:
    body = {"id": "ob", "arms": ["a", "b", "c"], "policy": {"name": "odaaf-b"},
            "delay": {"family": "uniform", "low": 0, "high": 200}, "decisions_per_second": 1}  # fmt: skip
    clock = ManualClock()
    async with served(embedded(tmp_path), clock) as http:
        assert (await http.post("/campaigns", json=body)).status_code == 201
        await http.post("/choose", json={"campaign": "ob"})
        refused = await http.delete("/campaigns/ob/arms/b")
        assert refused.status_code == 409 and refused.json()["error"] == "policy_cannot_change_arms"
        assert "restart=true" in refused.json()["detail"]
        assert (await http.get("/campaigns/ob")).json()["retired"] == []

        restarted = await http.delete("/campaigns/ob/arms/b", params={"restart": "true"})
        assert restarted.status_code == 200, restarted.text
        assert (restarted.json()["version"], restarted.json()["retired"]) == (2, ["b"])
        clock.advance(1)
        decision = (await http.post("/choose", json={"campaign": "ob"})).json()
        assert decision["arm"] == "a" and decision["fallback"] is False  # the first block, on the first arm
        state = (await http.get("/campaigns/ob/state")).json()
        assert state["decisions"] == 1 and state["arms"]["b"]["retired"] is True
        planned = state["policy_state"]["plan"]  # the plan names arms by the campaign's indices: never b's
        assert {segment["arm"] for segment in [*planned["segments"], planned["hold"]]} == {0, 2}


async def test_a_context_campaign_changes_arms_and_an_actions_one_has_none(tmp_path) -> None:
    linear = {"policy": {"name": "linucb"}, "features": 2, "window": 600}
    clock = ManualClock()
    async with served(embedded(tmp_path), clock) as http:
        assert (await http.post("/campaigns", json={"id": "ctx", "arms": ["a", "b"], **linear})).status_code == 201
        assert (await http.post("/campaigns", json={"id": "feed", **linear})).status_code == 201
        for _ in range(4):
            clock.advance(1)
            await http.post("/choose", json={"campaign": "ctx", "context": [0.6, 0.8]})
        assert (await http.post("/campaigns/ctx/arms", json={"arm": "c"})).status_code == 201
        clock.advance(1)
        opened = (await http.post("/choose", json={"campaign": "ctx", "context": [0.6, 0.8]})).json()
        assert opened["arm"] == "c"  # nothing decided on its block: the widest interval
        assert (await http.delete("/campaigns/ctx/arms/b")).status_code == 200
        state = (await http.get("/campaigns/ctx/state")).json()
        assert list(state["model"]["arms"]) == ["a", "b", "c"] and state["model"]["decisions"] == 5
        refused = await http.post("/campaigns/feed/arms", json={"arm": "x"})
        assert refused.status_code == 409 and refused.json()["error"] == "policy_cannot_change_arms"
        assert "no arms" in refused.json()["detail"]
