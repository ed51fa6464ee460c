"""Rewards beyond 0/1 over HTTP, on both stores: a campaign's ``reward`` is validated at creation (and
``reward_cap``, its old name on anonymous policies, agrees with it or is refused); a ``sum`` campaign takes
values up to its ``max``, adds a decision's conversions up to it, never twice for one event id; the state shows
how many conversions counted, their total and the estimate in value units, while the policy ranks arms on
rewards scaled to [0, 1]."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from latebandit.campaign import MAX_ATTRIBUTED_REWARD
from latebandit.timeutil import format_time
from tests.inprocess import ManualClock
from tests.integration.test_feedback_outcomes import app, feedback  # noqa: F401  (``app`` is a fixture)

REVENUE = {"id": "shop", "arms": ["a", "b"], "policy": {"name": "klucb"}, "window": 3600,
           "reward": {"max": 250.0, "per_decision": "sum"}}  # fmt: skip
ODAAF = {"name": "odaaf", "params": {"mean_delay": 0, "horizon": 1000}}
# The sum's bookkeeping (the credited hash beside the dedup set, one script) is the store's: on each of them.
STORES = ["memory", *(pytest.param(name, marks=pytest.mark.redis) for name in ("redis", "cluster"))]
ANONYMOUS = {"id": "anon", "arms": ["a", "b"], "policy": ODAAF, "slot_seconds": 1.0}


def conversion(decision_id: str, event_id: str, value: float, clock: ManualClock) -> dict[str, Any]:
    return {"type": "conversion", "decision_id": decision_id, "event_id": event_id, "value": value,
            "occurred_at": format_time(clock.now)}  # fmt: skip


async def choose(http: httpx.AsyncClient, campaign: str = "shop") -> dict[str, Any]:
    answer = await http.post("/choose", json={"campaign": campaign})
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({**REVENUE, "reward": {"max": 0}}, "greater than 0"),
        ({**REVENUE, "reward": {"max": "nan"}}, "finite"),
        ({**REVENUE, "reward": {"max": 2 * MAX_ATTRIBUTED_REWARD}}, "at most"),
        ({**REVENUE, "reward": {"per_decision": "max"}}, "'first' or 'sum'"),
        ({**REVENUE, "reward": {"max": 2.0, "cap": 3}}, "Extra inputs"),
        ({**ANONYMOUS, "reward": {"per_decision": "sum"}}, "totals already"),
        ({**ANONYMOUS, "policy": {"name": {}}, "reward": {"max": 2.0}}, "policy.name"),  # not a name: no 500
        ({**ANONYMOUS, "policy": {**ODAAF, "params": [1]}, "reward": [2.0]}, "reward"),
        (
            {
                **ANONYMOUS,
                "policy": {**ODAAF, "params": {**ODAAF["params"], "reward_cap": 3.0}},
                "reward": {"max": 2.0},
            },
            "differ",
        ),
    ],
)
async def test_a_reward_that_cannot_hold_is_refused(app, body: dict[str, Any], message: str) -> None:  # noqa: F811
    http, _ = app
    answer = await http.post("/campaigns", json=body)
    assert answer.status_code == 422 and message in answer.text, answer.text
    assert (await http.get(f"/campaigns/{body['id']}")).status_code == 404


async def test_reward_cap_and_reward_max_are_one_setting(app) -> None:  # noqa: F811
    """Either name sets both; both given and equal is fine."""
    http, _ = app
    old = {**ANONYMOUS, "policy": {**ODAAF, "params": {**ODAAF["params"], "reward_cap": 3.0}}}
    new = {**ANONYMOUS, "id": "anon2", "reward": {"max": 3.0}}
    both = {**old, "id": "anon3", "reward": {"max": 3.0}}
    for body in (old, new, both):
        answer = await http.post("/campaigns", json=body)
        assert answer.status_code == 201, answer.text
        created = answer.json()
        assert created["reward"] == {"max": 3.0, "per_decision": "first"}
        assert created["policy"]["resolved_params"]["reward_cap"] == 3.0


@pytest.mark.parametrize("app", STORES, indirect=True)
async def test_a_sum_campaign_credits_revenue_up_to_max_once_per_event(app) -> None:  # noqa: F811
    http, clock = app
    created = await http.post("/campaigns", json=REVENUE)
    assert created.status_code == 201 and created.json()["reward"] == REVENUE["reward"], created.text
    decisions = [(await choose(http))["decision_id"] for _ in range(2)]
    first, second = decisions
    clock.advance(10.0)
    body = await feedback(
        http,
        conversion(first, "o1", 120.0, clock),
        conversion(first, "o2", 100.0, clock),  # a second purchase: adds 100
        conversion(first, "o2", 100.0, clock),  # the same order resent: a duplicate
        conversion(first, "o3", 90.0, clock),  # adds 30: the decision's reward reaches max
        conversion(second, "o4", 251.0, clock),  # beyond max: refused, changes nothing
        conversion(second, "o5", 40.0, clock),
    )
    assert [item["reason"] for item in body.pop("rejected")] == ["value_out_of_range"]
    assert body == {"accepted": 4, "duplicates": 1, "repeats": 2}
    state = (await http.get("/campaigns/shop/state")).json()
    rows = list(state["arms"].values())
    assert sum(row["conversions"] for row in rows) == 2 and sum(row["reward"] for row in rows) == 290.0
    for row in rows:
        if row["pulls"]:  # klucb: S / N, in value units; the index ranks S / max, a KL-UCB bound capped at 1
            assert row["estimate"] == pytest.approx(row["reward"] / row["pulls"])
            assert row["index"] <= 1.0
    again = await feedback(http, conversion(first, "o2", 100.0, clock), conversion(first, "o6", 10.0, clock))
    assert again == {"accepted": 1, "duplicates": 1, "repeats": 1}
    assert (await http.get("/campaigns/shop/state")).json()["arms"] == state["arms"]  # at max: nothing more


async def test_a_first_campaign_still_refuses_values_above_one(app) -> None:  # noqa: F811
    http, clock = app
    assert (await http.post("/campaigns", json={**REVENUE, "reward": {}})).status_code == 201
    decision = (await choose(http))["decision_id"]
    body = await feedback(http, conversion(decision, "o1", 1.5, clock))
    assert body["rejected"] == [{"index": 0, "reason": "value_out_of_range", "detail": "value 1.5 is outside [0, 1]"}]
