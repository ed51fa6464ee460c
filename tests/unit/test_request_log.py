"""The request log (issue 30): a request that fails answers a JSON 500 carrying its request id, in the body
and the ``X-Request-ID`` header, and its traceback is logged under that id; every access line of a request
that names a campaign carries it. The application is driven in process (tests/inprocess.py); the log
lines are formatted as `serve` writes them, while the request is being served."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from latebandit.config import Settings
from latebandit.logs import JsonFormatter
from latebandit.policies.baselines import UCB1
from latebandit.timeutil import format_time, wall_clock
from tests.inprocess import client, started


class JsonLines(logging.Handler):
    """The service's log lines, formatted as they are written (the request id is the one current then)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(orjson.loads(self.format(record)))

    def of(self, logger: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["logger"] == logger]


@pytest.fixture
def logged() -> Iterator[JsonLines]:
    root = logging.getLogger("latebandit")
    handler, level = JsonLines(), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def campaign(name: str) -> dict[str, object]:
    return {"id": name, "arms": ["a", "b"], "policy": {"name": "ucb1"}, "delay": {"family": "unknown"},
            "window": 3600, "default_arm": "a"}  # fmt: skip


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(_env_file=None, database_url=f"sqlite:///{tmp_path / 'audit.db'}")
    async with started(settings) as app, client(app) as http:
        http.app = app  # type: ignore[attr-defined]
        for name in ("summer-sale", "winter-sale"):
            assert (await http.post("/campaigns", json=campaign(name))).status_code == 201
        yield http


def assert_failed_as_json(answer: httpx.Response, logged: JsonLines, campaign: str) -> str:
    """The 500's request id, once its body, header, traceback line and access line agree on it."""
    assert answer.status_code == 500
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert set(body) == {"error", "detail", "request_id"} and body["error"] == "internal_error"
    assert answer.headers["x-request-id"] == body["request_id"]
    (failure,) = logged.of("latebandit.errors")
    assert failure["level"] == "error" and failure["request_id"] == body["request_id"]
    assert failure["campaign"] == campaign and "policy failure for the test" in failure["exception"]
    access = [line for line in logged.of("latebandit.access") if line["request_id"] == body["request_id"]]
    assert [(line["status"], line["campaign"]) for line in access] == [(500, campaign)]
    return str(body["request_id"])


async def test_a_failing_policy_answers_json_500_with_the_request_id_of_its_traceback(
    http: httpx.AsyncClient, logged: JsonLines, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(*args: object) -> None:
        raise RuntimeError("policy failure for the test")

    monkeypatch.setattr(UCB1, "index", failing)
    monkeypatch.setattr(UCB1, "plain_index", failing)
    answer = await http.post("/choose", json={"campaign": "summer-sale"}, headers={"X-Request-ID": "trace-500"})
    assert assert_failed_as_json(answer, logged, "summer-sale") == "trace-500"  # the client's id is kept


async def test_a_failing_admin_route_answers_json_500_too(
    http: httpx.AsyncClient, logged: JsonLines, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def failing(*args: object) -> None:
        raise RuntimeError("policy failure for the test")

    monkeypatch.setattr(http.app.state.runtime.engine, "state", failing)  # type: ignore[attr-defined]
    answer = await http.get("/campaigns/winter-sale/state")
    assert len(assert_failed_as_json(answer, logged, "winter-sale")) == 32  # a generated id


async def test_every_request_naming_a_campaign_logs_it_in_its_access_line(
    http: httpx.AsyncClient, logged: JsonLines
) -> None:
    chosen = [(await http.post("/choose", json={"campaign": name})).json() for name in ("summer-sale", "winter-sale")]
    now = format_time(wall_clock())
    events = [{"type": "conversion", "decision_id": decision["decision_id"], "occurred_at": now}
              for decision in chosen]  # fmt: skip
    await http.post("/feedback", json={"events": events})
    await http.post("/feedback", json={"events": events[1:]})
    await http.get("/campaigns/summer-sale/state")
    await http.post("/campaigns/winter-sale/pause")
    await http.get("/campaigns/no-such-campaign")  # a 404 names it too
    await http.post("/campaigns", json=campaign("autumn-sale"))
    await http.get("/campaigns")
    await http.post("/choose", json={"campaign": 7})  # names none: refused before
    access = logged.of("latebandit.access")
    assert [(line["path"], line["status"], line.get("campaign"), line.get("campaigns")) for line in access] == [
        ("/choose", 200, "summer-sale", None),
        ("/choose", 200, "winter-sale", None),
        ("/feedback", 200, "summer-sale", 2),
        ("/feedback", 200, "winter-sale", None),
        ("/campaigns/summer-sale/state", 200, "summer-sale", None),
        ("/campaigns/winter-sale/pause", 200, "winter-sale", None),
        ("/campaigns/no-such-campaign", 404, "no-such-campaign", None),
        ("/campaigns", 201, "autumn-sale", None),
        ("/campaigns", 200, None, None),
        ("/choose", 422, None, None),
    ]
