"""Hostile clients against a real server (uvicorn, Redis, API keys): schemathesis fuzzing of every route
from the service's own OpenAPI document, oversized and malformed bodies, odd ids, and the auth matrix of
every route. Nothing answers 500, and nothing that was refused changed the state."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, settings

from latebandit.api.app import MAX_BODY_BYTES, ROUTERS, create_app
from latebandit.api.auth import METRICS_PATH, PUBLIC_PATHS, Scope, required_scope
from latebandit.config import Settings
from latebandit.engine.feedback import MAX_EVENTS
from tests.conftest import REDIS_URL, unavailable
from tests.e2e.server import Server, running, service_env
from tests.e2e.test_embedded import CAMPAIGN
from tests.e2e.traffic import now_iso

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

ADMIN_KEY, DECIDE_KEY = "admin-key-2f9c41d7e0", "decide-key-8a3e6b15c4"
SUMMER_ADMIN_KEY = "summer-admin-key-47d1e09b"  # an admin key serving only summer-* campaigns
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
DECIDE = {"Authorization": f"Bearer {DECIDE_KEY}"}
WRONG = {"Authorization": "Bearer not-a-key"}
AS_OF = (datetime.now(UTC) + timedelta(days=1)).isoformat()


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    """One service for the module, on its own Redis key prefix, with a campaign and one decision."""
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as error:
        unavailable(f"Redis at {REDIS_URL}", error)
    workdir = tmp_path_factory.mktemp("hostile")
    prefix = f"lbtest{uuid.uuid4().hex[:12]}"
    env = service_env(
        workdir,
        redis_url=REDIS_URL,
        redis_prefix=prefix,
        api_keys=f"admin:{ADMIN_KEY},decide:{DECIDE_KEY},admin@summer-*:{SUMMER_ADMIN_KEY}",
    )
    try:
        with running(env, workdir) as started, started.client(headers=ADMIN) as http:
            assert http.post("/campaigns", json=CAMPAIGN).status_code == 201
            yield started
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)


@pytest.fixture
def http(server: Server) -> Iterator[httpx.Client]:
    with server.client(headers=ADMIN) as client:
        yield client


def snapshot(http: httpx.Client) -> dict:
    """Everything a refused request must leave unchanged: the campaigns, and the test campaign's whole state
    as of a fixed moment (so that equal states give equal numbers)."""
    names = http.get("/campaigns").json()["campaigns"]
    state = http.get(f"/campaigns/{CAMPAIGN['id']}/state", params={"at": AS_OF}).json()
    return {"campaigns": names, "state": state}


# schemathesis -------------------------------------------------------------------------------------


# The document the service serves at /openapi.json, built from the same application object (loading it
# lazily from the running server needs schemathesis's fixture loader, which pytest 9 breaks).
schema = schemathesis.openapi.from_dict(create_app(Settings(_env_file=None, api_keys=None)).openapi())


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_route_answers_500(case, server: Server) -> None:
    """Generated requests (valid and invalid by the schema) to every operation, with an admin key: a clear
    answer below 500 every time. /choose and /campaigns may change state: that is their job."""
    response = case.call(base_url=server.url, headers=ADMIN, timeout=30)
    assert response.status_code < 500, (case.method, case.formatted_path, case.body, response.text)
    if response.status_code >= 400:
        assert set(response.json()) == {"error", "detail"}


# oversized, malformed, odd ------------------------------------------------------------------------


def test_refused_bodies_change_nothing(http: httpx.Client) -> None:
    decision = http.post("/choose", json={"campaign": CAMPAIGN["id"]}).json()
    before = snapshot(http)
    event = {"type": "conversion", "decision_id": decision["decision_id"], "occurred_at": now_iso()}
    too_many = http.post("/feedback", json={"events": [event] * (MAX_EVENTS + 1)})
    assert too_many.status_code == 413 and too_many.json()["error"] == "batch_too_large"
    huge = http.post("/feedback", content=b'{"events": [' + b" " * MAX_BODY_BYTES + b"]}")
    assert huge.status_code == 413 and huge.json()["error"] == "body_too_large"

    def chunks():  # no Content-Length: the limit holds while streaming too
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b" " * 65536

    streamed = http.post("/feedback", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    for body in (b"", b"null", b"[]", b'{"events": {}}', b'{"events": [', b"\xff\xfe", b'{"events": NaN}'):
        answer = http.post("/feedback", content=body, headers={"content-type": "application/json"})
        assert answer.status_code == 422 and answer.json()["error"] == "invalid_request", body
    odd_values = (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-0.5", b"1.0000001", b'"1"', b"true")
    for value in odd_values:
        body = b'{"events": [{"type": "conversion", "decision_id": "%s", "occurred_at": "%s", "value": %s}]}' % (
            decision["decision_id"].encode(), now_iso().encode(), value
        )  # fmt: skip
        answer = http.post("/feedback", content=body, headers={"content-type": "application/json"})
        assert answer.status_code in (200, 422), value
        if answer.status_code == 200:  # a JSON number out of range, or not a number
            assert answer.json()["accepted"] == 0, value
            assert answer.json()["rejected"][0]["reason"] in ("value_out_of_range", "malformed_event"), value
    for odd in ("", "a b", "a/b", "{x}", "é", "a" * 129, "-a", "a\nb", "a|b", "%00", "..", "*"):
        assert http.post("/choose", json={"campaign": odd}).status_code == 422, odd
        event = {"type": "conversion", "event_id": odd, "decision_id": decision["decision_id"], "occurred_at": "x"}
        assert http.post("/feedback", json={"events": [event]}).json()["rejected"][0]["reason"] == "malformed_event"
        assert http.post("/campaigns", json={**CAMPAIGN, "id": odd}).status_code == 422, odd
        assert http.post("/campaigns", json={**CAMPAIGN, "arms": ["a", odd]}).status_code == 422, odd
    for path in ("/campaigns/a%20b/state", "/campaigns/%7Bx%7D", "/campaigns/%2e%2e/pause", "/campaigns/é/resume"):
        answer = http.request("GET" if "pause" not in path and "resume" not in path else "POST", path)
        assert answer.status_code in (404, 422), path
    assert http.post("/choose", json={"campaign": CAMPAIGN["id"], "request_id": "x\u0000y"}).status_code == 422
    assert http.post("/choose", json={"campaign": CAMPAIGN["id"], "request_id": "r" * 257}).status_code == 422
    assert http.get(f"/campaigns/{CAMPAIGN['id']}/state", params={"at": "yesterday"}).status_code == 422
    assert snapshot(http) == before


# auth matrix -------------------------------------------------------------------------------------


def routes() -> list[tuple[str, str]]:
    """Every (method, path) the application serves, from the routers it includes (``app.routes`` holds the
    included routers, not their routes), so a new route is covered; checked against the app's OpenAPI
    paths, so that a route the matrix cannot see fails the collection instead of going untested."""
    app = create_app(Settings(_env_file=None, api_keys=None))
    found: list[tuple[str, str]] = []
    for route in (route for router in ROUTERS for route in router.routes):
        for method in sorted(getattr(route, "methods", None) or ()):
            if method != "HEAD":
                found.append((method, route.path))
    assert {path for _, path in found} == set(app.openapi()["paths"]), "the auth matrix misses routes"
    return [(method, path.replace("{campaign_id}", "nobody")) for method, path in found]  # admin passes: a 404


@pytest.mark.parametrize(("method", "path"), routes())
def test_auth_matrix(server: Server, method: str, path: str) -> None:
    """No key and a wrong key are 401 on every non-public route; a decide key on an admin route is 403;
    the right key passes, and an admin key that serves only other campaigns is 403 on every route naming one.
    A refused request changes nothing. /metrics is public here: the server is reached over loopback
    (tests/unit/test_access.py covers the other addresses)."""
    with server.client(headers=ADMIN) as admin:
        before = snapshot(admin)
        needed = None if path == METRICS_PATH else required_scope(path)
        cases = {"none": {}, "wrong": WRONG, "decide": DECIDE}
        for name, headers in cases.items():
            response = httpx.request(method, server.url + path, headers=headers, json={}, timeout=30)
            if needed is None:
                assert path in {*PUBLIC_PATHS, METRICS_PATH} and response.status_code < 400, name
            elif name in ("none", "wrong"):
                assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer", name
            elif needed is Scope.ADMIN:
                assert response.status_code == 403 and response.json()["error"] == "forbidden"
            else:
                assert response.status_code not in (401, 403)
        for headers in (ADMIN, {"Authorization": f"bearer {ADMIN_KEY}"}):
            assert httpx.request(method, server.url + path, headers=headers, json={}).status_code not in (401, 403)
        if path.startswith("/campaigns/nobody"):
            summer = {"Authorization": f"Bearer {SUMMER_ADMIN_KEY}"}
            refused = httpx.request(method, server.url + path, headers=summer, json={})
            assert refused.status_code == 403 and refused.json()["error"] == "forbidden_campaign"
        for headers in ({"Authorization": f"Basic {ADMIN_KEY}"}, {"Authorization": "Bearer"}, {"X-Api-Key": ADMIN_KEY}):
            assert httpx.request(method, server.url + path, headers=headers, json={}).status_code == (
                401 if needed is not None else 200
            )
        assert snapshot(admin) == before
