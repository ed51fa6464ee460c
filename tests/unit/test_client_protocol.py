"""The client library's pure parts (latebandit.client): the events and ids it builds, the requests it
sends, how it reads answers, when it retries and when a background batch is due. The same code serves
``Client`` and ``AsyncClient``; the exchanges with a real service are in tests/e2e/test_client.py."""

from __future__ import annotations

import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone

import httpx
import numpy as np
import orjson
import pytest

from latebandit.client import MAX_EVENTS, Batching, ClientError, Decision, RetryPolicy, ServiceError, Unreachable
from latebandit.client.batching import Buffer
from latebandit.client.events import aggregate, conversion, timestamp, watermark, with_event_id
from latebandit.client.protocol import choose_request, decision_of, feedback_batches, feedback_result, service_error
from latebandit.engine.feedback import MAX_EVENTS as SERVICE_MAX_EVENTS
from latebandit.ids import is_identifier

DECISION = {"decision_id": "d1", "campaign": "c", "arm": "b", "policy": "ucb1", "propensity": 0.5, "fallback": False}


def answer(status: int, body: object = None, **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


def test_the_client_splits_batches_where_the_service_refuses_them() -> None:
    assert MAX_EVENTS == SERVICE_MAX_EVENTS


def test_helpers_draw_a_valid_event_id_once_per_event() -> None:
    made = [conversion("d1"), conversion("d1"), aggregate("c", "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z", 3.0)]
    ids = {event["event_id"] for event in made}
    assert len(ids) == 3 and all(is_identifier(event_id) for event_id in ids)
    assert conversion("d1", event_id="mine")["event_id"] == "mine"
    assert with_event_id(made[2]) is made[2]  # an aggregate keeps the id it was made with


def test_a_conversion_names_its_decision_value_and_time() -> None:
    decision = Decision("d9", "c", "a", "ucb1", 1.0, False, "r1")
    at = datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    event = conversion(decision, value=0.5, at=at)
    assert event["decision_id"] == "d9" and event["value"] == 0.5 and event["occurred_at"] == "2026-01-01T10:00:00Z"
    assert event["type"] == "conversion"
    assert watermark("c", at="2026-01-01T00:00:00Z") == {"type": "watermark", "campaign": "c",
                                                         "at": "2026-01-01T00:00:00Z"}  # fmt: skip


def test_now_is_utc_and_a_naive_datetime_is_refused() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    stamped = datetime.fromisoformat(timestamp(None))
    assert stamped.tzinfo is not None and stamped >= before
    with pytest.raises(ValueError, match="time zone"):
        conversion("d1", at=datetime(2026, 1, 1))


def test_an_aggregate_without_an_id_gets_one_before_its_first_send_and_a_conversion_keeps_its_meaning() -> None:
    """An aggregate is recognised by its id alone: without one a retry would add it twice. A conversion
    without an id is recognised by its decision, and on a ``sum`` campaign an id would make a second
    conversion of the decision count: it is left as sent."""
    bare_aggregate = {"type": "aggregate", "campaign": "c", "start": "x", "end": "y", "value": 1.0}
    bare_conversion = {"type": "conversion", "decision_id": "d1", "occurred_at": "x"}
    [[sent_aggregate, sent_conversion]] = feedback_batches([bare_aggregate, bare_conversion])
    assert is_identifier(sent_aggregate["event_id"]) and "event_id" not in bare_aggregate
    assert sent_conversion is bare_conversion


def test_feedback_is_split_into_requests_the_service_takes() -> None:
    events = [conversion(f"d{i}") for i in range(MAX_EVENTS + 1)]
    batches = feedback_batches(events)
    assert [len(batch) for batch in batches] == [MAX_EVENTS, 1] and batches[1][0] is events[-1]
    assert [len(batch) for batch in feedback_batches(events[:5], size=2)] == [2, 2, 1]
    assert feedback_batches([]) == []
    for size in (0, MAX_EVENTS + 1):
        with pytest.raises(ValueError):
            feedback_batches(events, size=size)


def test_choose_sends_the_callers_request_id_or_draws_one() -> None:
    assert choose_request("c", "imp-1") == ("imp-1", orjson.dumps({"campaign": "c", "request_id": "imp-1"}))
    drawn, body = choose_request("c", None)
    assert orjson.loads(body) == {"campaign": "c", "request_id": drawn} and drawn != choose_request("c", None)[0]


def test_choose_sends_an_offer_as_plain_numbers() -> None:
    """Pairs and mappings alike, numpy's scalars as floats (orjson refuses them)."""
    _, body = choose_request("c", "r", actions=[("x", np.array([0.5, 0.25])), {"id": "y", "features": (0, 1)}])
    assert orjson.loads(body)["actions"] == [{"id": "x", "features": [0.5, 0.25]}, {"id": "y", "features": [0.0, 1.0]}]
    assert orjson.loads(choose_request("c", "r", context=np.float32([0.5]))[1])["context"] == [0.5]


def test_a_decision_is_typed_and_keeps_the_request_id() -> None:
    decision = decision_of(answer(200, DECISION), "r7", attempts=2)
    assert decision == Decision("d1", "c", "b", "ucb1", 0.5, False, "r7")


def test_feedback_answers_add_up_and_rejections_carry_their_event_and_overall_index() -> None:
    events = [conversion(f"d{i}") for i in range(5)]
    batches = feedback_batches(events, size=3)
    first = {"accepted": 2, "duplicates": 0, "censored": 1, "repeats": 0, "stale": 0,
             "rejected": [{"index": 1, "reason": "bad_decision_id", "detail": "forged"}]}  # fmt: skip
    second = {"accepted": 1, "duplicates": 1, "censored": 0, "repeats": 1, "stale": 1,
              "rejected": [{"index": 0, "reason": "future_timestamp", "detail": "too late"}]}  # fmt: skip
    result = feedback_result(batches, [(answer(200, first), 1), (answer(200, second), 1)])
    assert (result.accepted, result.duplicates, result.censored, result.repeats, result.stale) == (3, 1, 1, 1, 1)
    assert [(r.index, r.reason, r.event) for r in result.rejected] == [
        (1, "bad_decision_id", events[1]), (3, "future_timestamp", events[3])
    ]  # fmt: skip


def test_an_error_answer_becomes_a_service_error_with_its_code() -> None:
    error = service_error(answer(404, {"error": "unknown_campaign", "detail": "no campaign 'x'"}, **{
        "x-request-id": "abc"}), attempts=1)  # fmt: skip
    assert (error.status, error.code, error.detail, error.request_id, error.attempts) == (
        404, "unknown_campaign", "no campaign 'x'", "abc", 1)  # fmt: skip
    proxy = service_error(httpx.Response(502, text="<html>bad gateway</html>"), attempts=1)
    assert proxy.code == "http_502" and "bad gateway" in proxy.detail
    with pytest.raises(ServiceError, match="422 invalid_request"):
        decision_of(answer(422, {"error": "invalid_request", "detail": "campaign: missing"}), "r", 1)


POLICY = RetryPolicy(attempts=4, total=30.0, first_wait=0.1, max_wait=1.0)


def test_waits_grow_exponentially_with_jitter_up_to_the_cap() -> None:
    rng = random.Random(3)
    for retry, bound in ((1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (30, 1.0)):
        waits = [POLICY.wait(retry, rng) for _ in range(200)]
        assert all(bound / 2 <= wait <= bound for wait in waits) and len(set(waits)) > 1


@pytest.mark.parametrize("status", [200, 400, 401, 403, 404, 409, 413, 422, 500, 502, 504])
def test_only_a_503_is_retried_among_answers(status: int) -> None:
    response = answer(status, {})
    assert POLICY.start(0.0).verdict(response, 0.0) is response


def test_a_503_is_retried_no_sooner_than_its_retry_after_until_the_attempts_run_out() -> None:
    attempts = POLICY.start(0.0)
    unavailable = answer(503, {"error": "store_unavailable", "detail": "down"}, **{"retry-after": "1"})
    assert attempts.verdict(unavailable, 0.0) == 1.0  # Retry-After, within max_wait
    assert attempts.verdict(unavailable, 1.0) == 1.0
    assert attempts.verdict(unavailable, 2.0) == 1.0
    with pytest.raises(ServiceError) as gave_up:
        attempts.verdict(unavailable, 3.0)
    assert gave_up.value.status == 503 and gave_up.value.code == "store_unavailable" and gave_up.value.attempts == 4


def test_a_connection_error_is_retried_within_the_total_time() -> None:
    lost = httpx.ConnectError("refused")
    attempts = RetryPolicy(attempts=100, total=10.0, first_wait=0.5, max_wait=2.0).start(100.0)
    assert 0.25 <= attempts.verdict(lost, 100.0) <= 0.5
    assert attempts.verdict(httpx.ReadTimeout("slow"), 105.0) <= 1.0
    with pytest.raises(Unreachable) as gave_up:
        attempts.verdict(lost, 109.9)  # the next attempt would start after 10 s
    assert gave_up.value.attempts == 3 and gave_up.value.__cause__ is lost
    assert isinstance(gave_up.value, ClientError)


def test_a_retry_policy_is_checked() -> None:
    for wrong in ({"attempts": 0}, {"total": -1.0}, {"first_wait": 0.0}, {"first_wait": 2.0, "max_wait": 1.0}):
        with pytest.raises(ValueError):
            RetryPolicy(**wrong)  # type: ignore[arg-type]


def test_a_batch_leaves_when_full_or_its_oldest_event_is_interval_old_or_on_flush() -> None:
    buffer = Buffer(Batching(size=3, interval=2.0, capacity=4))
    assert buffer.wait(0.0, draining=False) is None and buffer.idle()
    buffer.put(conversion("d1"), 10.0)
    buffer.put(conversion("d2"), 11.0)
    assert buffer.wait(10.5, draining=False) == 1.5  # two seconds after the oldest
    assert buffer.wait(12.5, draining=False) == 0.0
    assert buffer.wait(10.5, draining=True) == 0.0
    buffer.put(conversion("d3"), 11.0)
    assert buffer.wait(10.5, draining=False) == 0.0  # full
    buffer.put(conversion("d4"), 11.5)
    assert not buffer.has_room()
    batch = buffer.take()
    assert [event["decision_id"] for event in batch] == ["d1", "d2", "d3"]
    assert not buffer.has_room()  # in flight, the batch still holds its room
    assert buffer.wait(12.0, draining=False) == 1.5  # the clock of the event left behind
    buffer.done(batch)
    assert buffer.has_room() and not buffer.idle()


def test_batching_is_checked() -> None:
    for wrong in ({"size": 0}, {"size": MAX_EVENTS + 1}, {"size": 10, "capacity": 5}, {"interval": 0.0}):
        with pytest.raises(ValueError):
            Batching(**wrong)  # type: ignore[arg-type]


def test_the_client_imports_none_of_the_service() -> None:
    """An ad server imports the client alone: httpx and orjson, not the service's web, store or numeric stack."""
    heavy = ["fastapi", "numpy", "redis", "sqlalchemy", "scipy", "latebandit.engine", "latebandit.api"]
    probe = f"import sys, latebandit.client; print([name for name in {heavy!r} if name in sys.modules])"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
