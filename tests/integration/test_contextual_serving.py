"""Contextual campaigns served through the API, on both stores: both request forms, the model's sums against
an independent computation from the decisions' own records, conversions joined to their features, and
bad offers refused with nothing recorded."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest

from latebandit.config import Settings
from latebandit.runtime import Runtime
from latebandit.store.redis import RedisStore
from latebandit.timeutil import MICROS, format_time
from tests.inprocess import STORE_KINDS, ManualClock, client, started, store_settings
from tests.integration.test_feedback_outcomes import KEYS

SECRET = "contextual-serving-test-secret-0123456789"
ACTIONS = {"id": "feed", "policy": {"name": "otf-linucb"}, "features": 3, "window": 3600, "log_actions": True}
CONTEXT = {"id": "promo", "arms": ["a", "b", "c"], "policy": {"name": "otf-lints", "params": {"sigma0": 0.1}},
           "features": 2, "window": 3600}  # fmt: skip


@dataclass
class Service:
    http: httpx.AsyncClient
    clock: ManualClock
    runtime: Runtime
    prefix: str

    async def keys(self, campaign: str) -> list[bytes]:
        """The campaign's Redis keys (its hash tag), on every node of a cluster; [] on the embedded store."""
        store = self.runtime.store
        if not isinstance(store, RedisStore):
            return []
        return [key async for key in store.client.scan_iter(match=f"{self.prefix}:{{{campaign}}}*")]


@pytest.fixture(params=STORE_KINDS)
async def service(request, tmp_path) -> AsyncIterator[Service]:
    stores = store_settings(request)
    settings = Settings(_env_file=None, secret=SECRET, database_url=f"sqlite:///{tmp_path / 'audit.db'}", **stores)
    clock = ManualClock()
    async with started(settings, clock) as started_app, client(started_app) as http:
        for body in (ACTIONS, CONTEXT):
            created = await http.post("/campaigns", json=body)
            assert created.status_code == 201, created.text
        yield Service(http, clock, started_app.state.runtime, settings.redis_prefix)


@pytest.fixture
def app(service: Service) -> tuple[httpx.AsyncClient, ManualClock]:
    return service.http, service.clock


def offered(rng: np.random.Generator, k: int, d: int) -> list[dict[str, Any]]:
    vectors = rng.normal(size=(k, d))
    vectors /= np.maximum(1.0, np.linalg.norm(vectors, axis=1))[:, None]
    return [{"id": f"item-{i}", "features": row} for i, row in enumerate(vectors.tolist())]


async def convert(
    http: httpx.AsyncClient, decision_id: str, value: float, clock: ManualClock, occurred: int | None = None
) -> dict[str, Any]:
    occurred_at = format_time(clock.now if occurred is None else occurred)
    event = {"type": "conversion", "decision_id": decision_id, "occurred_at": occurred_at, "value": value}
    answer = await http.post("/feedback", json={"events": [event]})
    assert answer.status_code == 200, answer.text
    return {key: value for key, value in answer.json().items() if key in KEYS and value}


async def state(http: httpx.AsyncClient, campaign: str) -> dict[str, Any]:
    answer = await http.get(f"/campaigns/{campaign}/state")
    assert answer.status_code == 200, answer.text
    return answer.json()


async def test_actions_form_learns_sums_that_match_the_decisions(app) -> None:
    """θ̂ of the state equals V⁻¹b computed here from the chosen features each answer's action names."""
    http, clock = app
    rng = np.random.default_rng(7)
    gram, reward = np.eye(3), np.zeros(3)  # λ = 1
    for step in range(30):
        actions = offered(rng, 5, 3)
        answer = await http.post("/choose", json={"campaign": "feed", "actions": actions})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        chosen = np.array(next(a["features"] for a in actions if a["id"] == body["arm"]))
        assert body["fallback"] is False and 0 < body["propensity"] <= 1
        gram += np.outer(chosen, chosen)
        if step % 3 == 0:
            clock.advance(1)
            assert await convert(http, body["decision_id"], 1.0, clock) == {"accepted": 1}
            reward += chosen
    model = (await state(http, "feed"))["model"]
    assert model["d"] == 3 and model["decisions"] == 30 and model["conversions"] == 10
    np.testing.assert_allclose(model["theta"], np.linalg.solve(gram, reward), rtol=1e-9, atol=1e-12)
    assert model["pending"] == 30 and model["window_sum"] > 0 and 0 < model["correction_share"] < 1


async def test_context_form_keeps_a_block_per_arm(app) -> None:
    http, clock = app
    rng = np.random.default_rng(3)
    grams, rewards = {arm: 0.01 * np.eye(2) for arm in "abc"}, {arm: np.zeros(2) for arm in "abc"}  # σ0² = 0.01
    for _ in range(20):
        context = rng.normal(size=2)
        context = (context / max(1.0, float(np.linalg.norm(context)))).tolist()
        answer = await http.post("/choose", json={"campaign": "promo", "context": context})
        assert answer.status_code == 200, answer.text
        arm = answer.json()["arm"]
        assert arm in "abc"
        grams[arm] += np.outer(context, context)
        clock.advance(1)
        assert await convert(http, answer.json()["decision_id"], 0.5, clock) == {"accepted": 1}
        rewards[arm] += 0.5 * np.array(context)
    model = (await state(http, "promo"))["model"]
    assert model["decisions"] == 20 and model["conversions"] == 20 and model["value"] == pytest.approx(10.0)
    expected = np.concatenate([np.linalg.solve(grams[arm], rewards[arm]) for arm in "abc"])
    np.testing.assert_allclose(model["theta"], expected, rtol=1e-9, atol=1e-12)
    assert sum(row["decisions"] for row in model["arms"].values()) == 20


async def test_a_retried_request_gets_its_action_again(app) -> None:
    http, _ = app
    actions = offered(np.random.default_rng(1), 4, 3)
    first = await http.post("/choose", json={"campaign": "feed", "actions": actions, "request_id": "r-1"})
    again = await http.post("/choose", json={"campaign": "feed", "actions": actions, "request_id": "r-1"})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert (await state(http, "feed"))["model"]["decisions"] == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"campaign": "feed"}, "actions"),
        ({"campaign": "feed", "context": [0.1, 0.2, 0.3]}, "context"),
        ({"campaign": "feed", "actions": [{"id": "x", "features": [0.1, 0.2]}]}, "actions"),
        ({"campaign": "feed", "actions": [{"id": "x", "features": [0.1, 0.2, 0.3]}] * 2}, "actions"),
        ({"campaign": "feed", "actions": [{"id": "x", "features": [1.0, 1.0, 0.0]}]}, "actions[0]"),
        ('{"campaign": "feed", "actions": [{"id": "x", "features": [1e400, 0, 0]}]}', "actions"),
        ('{"campaign": "feed", "context": [NaN, 0, 0]}', "context"),
        ({"campaign": "feed", "actions": []}, "actions"),
        ({"campaign": "feed", "actions": [{"id": f"a{k}", "features": [0.1, 0, 0]} for k in range(1001)]}, "actions"),
        ({"campaign": "feed", "actions": [{"id": "x", "features": [0.0] * 257}]}, "features"),
        ({"campaign": "feed", "actions": [{"id": "x y", "features": [0.1, 0, 0]}]}, "id"),
        ({"campaign": "feed", "actions": [{"id": "x", "features": [0.1, 0, 0]}], "context": [0.1, 0, 0]}, "either"),
        ({"campaign": "promo", "context": [0.1]}, "context"),
        ({"campaign": "promo", "actions": [{"id": "x", "features": [0.1, 0.2]}]}, "actions"),
    ],
)
async def test_an_offer_that_does_not_fit_is_refused_and_records_nothing(app, body, field) -> None:
    http, _ = app
    text = body if isinstance(body, str) else json.dumps(body)  # non-finite numbers as a client could send them
    answer = await http.post("/choose", content=text, headers={"content-type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == "invalid_request" and field in answer.json()["detail"]
    for campaign in ("feed", "promo"):
        assert (await state(http, campaign))["decisions"] == 0


async def test_an_arm_campaign_refuses_an_offer(app) -> None:
    http, _ = app
    created = await http.post("/campaigns", json={"id": "plain", "arms": ["a", "b"], "policy": {"name": "ucb1"}})
    assert created.status_code == 201
    answer = await http.post("/choose", json={"campaign": "plain", "context": [0.5]})
    assert answer.status_code == 422 and "not contextual" in answer.json()["detail"]


async def test_a_paused_campaign_falls_back_to_the_first_action(app) -> None:
    http, _ = app
    assert (await http.post("/campaigns/feed/pause")).status_code == 200
    actions = offered(np.random.default_rng(2), 3, 3)
    answer = await http.post("/choose", json={"campaign": "feed", "actions": actions})
    assert answer.status_code == 200
    assert answer.json()["arm"] == "item-0" and answer.json()["fallback"] is True


async def test_an_archived_campaign_counts_late_conversions_then_leaves_no_key(service: Service) -> None:
    """Features of decisions made before the archive are kept until the campaign's feedback_until, so their
    late conversions still add to b; then the sweep removes every key, the features hashes included."""
    http, clock = service.http, service.clock
    decisions, decided_at = [], clock.now
    for seed in range(4):
        actions = offered(np.random.default_rng(seed), 3, 3)
        decisions.append(
            (await http.post("/choose", json={"campaign": "feed", "actions": actions})).json()["decision_id"]
        )
    assert await service.keys("feed") != [] or not isinstance(service.runtime.store, RedisStore)
    assert (await http.delete("/campaigns/feed")).status_code == 200
    gone = await http.post("/choose", json={"campaign": "feed", "actions": offered(np.random.default_rng(9), 3, 3)})
    assert gone.status_code == 410
    clock.advance(3600 + 3600)  # window + allowed lateness: an in-window conversion reported this late counts
    assert await convert(http, decisions[0], 1.0, clock, decided_at + 100 * MICROS) == {"accepted": 1}
    clock.advance(1)
    await service.runtime.writer.flush()
    assert await service.runtime.store.purge_archived(clock.now) == ["feed"]
    assert await service.keys("feed") == []
    past = await http.get("/campaigns/feed/state", params={"at": format_time(clock.now - MICROS)})
    assert past.status_code == 200, past.text
    assert past.json()["model"]["conversions"] == 1 and past.json()["model"]["decisions"] == 4


async def test_a_policy_change_starts_a_fresh_model(app) -> None:
    http, _ = app
    for seed in range(3):
        await http.post("/choose", json={"campaign": "feed", "actions": offered(np.random.default_rng(seed), 3, 3)})
    changed = await http.post("/campaigns/feed/policy", json={"policy": {"name": "linucb", "params": {"alpha": 0.5}}})
    assert changed.status_code == 200, changed.text
    model = (await state(http, "feed"))["model"]
    assert (model["decisions"], model["pending"], model["theta"]) == (0, 0, [0.0, 0.0, 0.0])
    answer = await http.post("/choose", json={"campaign": "feed", "actions": offered(np.random.default_rng(5), 3, 3)})
    assert answer.status_code == 200 and answer.json()["policy"] == "linucb"
    refused = await http.post("/campaigns/feed/policy", json={"policy": {"name": "ucb1"}})
    assert refused.status_code == 422 and "contextual" in refused.text


async def test_a_past_state_replays_the_model(app) -> None:
    http, clock = app
    for seed in range(5):
        clock.advance(1)
        await http.post("/choose", json={"campaign": "promo", "context": [0.3, 0.4 + 0.01 * seed]})
    moment = clock.now
    live = await state(http, "promo")
    clock.advance(1)
    await http.post("/choose", json={"campaign": "promo", "context": [0.5, 0.5]})
    past = await http.get("/campaigns/promo/state", params={"at": format_time(moment)})
    assert past.status_code == 200, past.text
    np.testing.assert_allclose(past.json()["model"]["theta"], live["model"]["theta"], rtol=1e-9, atol=1e-12)
    assert past.json()["model"]["decisions"] == live["model"]["decisions"] == 5


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"id": "c1", "policy": {"name": "otf-linucb"}}, "features"),
        ({"id": "c2", "policy": {"name": "ucb1"}, "arms": ["a"], "features": 3}, "not contextual"),
        ({"id": "c3", "policy": {"name": "otf-linucb", "params": {"correction": "exact"}}, "features": 3}, "simulator"),
        ({"id": "c4", "policy": {"name": "linucb"}, "features": 3, "reward": {"per_decision": "sum"}}, "sum"),
        ({"id": "c5", "policy": {"name": "linucb"}, "features": 3, "offers": "actions", "arms": ["a"]}, "no arms"),
        ({"id": "c6", "policy": {"name": "linucb"}, "features": 300}, "features"),
    ],
)
async def test_a_contextual_campaign_that_cannot_serve_is_refused(app, body, reason) -> None:
    http, _ = app
    answer = await http.post("/campaigns", json=body)
    assert answer.status_code == 422 and reason in answer.text, answer.text
