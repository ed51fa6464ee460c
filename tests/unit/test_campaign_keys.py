"""Keys per campaign (issue 30): a key entry ``scope@glob:key`` serves only the campaigns its glob matches, on
/choose (403 ``forbidden_campaign``), on /feedback (each event of another campaign rejected on its own), and,
for an admin key, on every route that names a campaign. The application is driven in process
(tests/inprocess.py) on the embedded store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from latebandit.api.app import create_app
from latebandit.api.auth import CampaignGlob
from latebandit.config import Settings
from latebandit.timeutil import format_time, wall_clock
from tests.inprocess import served

ADMIN = "admin-1b7e0c5d9a2f4e83"
SUMMER_DECIDE = "summer-decide-5c0a9e1f"
SUMMER_ADMIN = "summer-admin-8d2f6b3a"
KEYS = f"admin:{ADMIN},decide@summer-*:{SUMMER_DECIDE},admin@summer-*:{SUMMER_ADMIN}"
CAMPAIGNS = ("summer-sale", "summer-2027", "winter-sale")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def campaign(name: str) -> dict[str, object]:
    return {"id": name, "arms": ["a", "b"], "policy": {"name": "ucb1"}, "delay": {"family": "unknown"},
            "window": 3600, "default_arm": "a"}  # fmt: skip


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    database_url = f"sqlite:///{tmp_path / 'audit.db'}"
    settings = Settings(_env_file=None, database_url=database_url, api_keys=KEYS, metrics_access="key")
    async with served(settings) as client:
        for name in CAMPAIGNS:
            assert (await client.post("/campaigns", json=campaign(name), headers=bearer(ADMIN))).status_code == 201
        yield client


async def test_a_restricted_key_chooses_only_for_its_campaigns(http: httpx.AsyncClient) -> None:
    for key in (SUMMER_DECIDE, SUMMER_ADMIN):
        for name in ("summer-sale", "summer-2027"):
            assert (await http.post("/choose", json={"campaign": name}, headers=bearer(key))).status_code == 200
        for name in ("winter-sale", "no-such-campaign", "Summer-sale"):  # unknown ones too: nothing is revealed
            refused = await http.post("/choose", json={"campaign": name}, headers=bearer(key))
            assert refused.status_code == 403, (key, name)
            assert refused.json() == {
                "error": "forbidden_campaign",
                "detail": f"this key does not serve campaign {name!r}",
            }
    state = (await http.get("/campaigns/winter-sale/state", headers=bearer(ADMIN))).json()
    assert state["decisions"] == 0  # the refusals changed nothing


async def test_a_restricted_key_has_its_feedback_for_other_campaigns_rejected_one_by_one(
    http: httpx.AsyncClient,
) -> None:
    decisions = {}
    for name in CAMPAIGNS:
        decisions[name] = (await http.post("/choose", json={"campaign": name}, headers=bearer(ADMIN))).json()
    now = format_time(wall_clock())
    events = [{"type": "conversion", "event_id": f"e-{name}", "decision_id": decisions[name]["decision_id"],
               "occurred_at": now} for name in ("summer-sale", "winter-sale", "summer-2027")]  # fmt: skip
    events.append({"type": "aggregate", "campaign": "winter-sale", "start": now, "end": now, "value": 1.0})
    answer = (await http.post("/feedback", json={"events": events}, headers=bearer(SUMMER_DECIDE))).json()
    assert answer["accepted"] == 2
    assert [(item["index"], item["reason"]) for item in answer["rejected"]] == [
        (1, "forbidden_campaign"), (3, "forbidden_campaign")
    ]  # fmt: skip
    counted = {}
    for name in CAMPAIGNS:
        state = (await http.get(f"/campaigns/{name}/state", headers=bearer(ADMIN))).json()
        counted[name] = sum(arm["conversions"] for arm in state["arms"].values())
    assert counted == {"summer-sale": 1, "summer-2027": 1, "winter-sale": 0}


async def test_a_restricted_admin_key_acts_only_on_its_campaigns(http: httpx.AsyncClient) -> None:
    admin = bearer(SUMMER_ADMIN)
    assert (await http.get("/campaigns", headers=admin)).json() == {"campaigns": ["summer-2027", "summer-sale"]}
    assert len((await http.get("/campaigns", headers=bearer(ADMIN))).json()["campaigns"]) == 3
    change = {"policy": {"name": "klucb"}}
    for method, path, body in [
        ("GET", "/campaigns/{}", None),
        ("GET", "/campaigns/{}/state", None),
        ("POST", "/campaigns/{}/pause", None),
        ("POST", "/campaigns/{}/resume", None),
        ("POST", "/campaigns/{}/policy", change),
    ]:
        allowed = await http.request(method, path.format("summer-sale"), json=body, headers=admin)
        assert allowed.status_code == 200, (method, path)
        refused = await http.request(method, path.format("winter-sale"), json=body, headers=admin)
        assert (refused.status_code, refused.json()["error"]) == (403, "forbidden_campaign"), (method, path)
    winter = (await http.get("/campaigns/winter-sale", headers=bearer(ADMIN))).json()
    assert (winter["status"], winter["policy"]["name"]) == ("active", "ucb1")  # untouched
    created = await http.post("/campaigns", json=campaign("summer-new"), headers=admin)
    assert created.status_code == 201
    refused = await http.post("/campaigns", json=campaign("autumn-sale"), headers=admin)
    assert (refused.status_code, refused.json()["error"]) == (403, "forbidden_campaign")
    assert "autumn-sale" not in (await http.get("/campaigns", headers=bearer(ADMIN))).json()["campaigns"]
    refused = await http.get("/metrics", headers=admin)  # /metrics shows every campaign's estimates
    assert refused.status_code == 403 and (await http.get("/metrics", headers=bearer(ADMIN))).status_code == 200


def test_the_glob_is_fnmatch_on_whole_ids_and_case_sensitive() -> None:
    summer = CampaignGlob("summer-*")
    assert [summer(name) for name in ("summer-", "summer-sale", "Summer-sale", "a-summer-sale")] == [
        True, True, False, False
    ]  # fmt: skip
    assert [CampaignGlob("shop-[ab]?")(name) for name in ("shop-a1", "shop-c1", "shop-a12")] == [True, False, False]
    assert summer("summer-sale") and not summer("winter")  # asked again: the memo answers the same


def test_a_glob_needs_a_pattern_and_a_known_scope() -> None:
    for entries in ("decide@:" + SUMMER_DECIDE, "deciders@summer-*:" + SUMMER_DECIDE):
        with pytest.raises(ValueError, match="scope@campaign-glob:key"):
            create_app(Settings(_env_file=None, api_keys=entries))
