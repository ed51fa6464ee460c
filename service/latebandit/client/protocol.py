"""The HTTP exchanges of /choose and /feedback, without I/O: the bodies the clients send and the typed
results they make of the answers. ``Client`` and ``AsyncClient`` share all of it; only sending differs."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from latebandit.client.events import Event, with_event_id

MAX_EVENTS = 10_000  # events per /feedback request: the service answers 413 above it

Features = Iterable[float]  # a feature vector: a list, a tuple, a numpy array…
Action = tuple[str, Features] | Mapping[str, Any]  # (id, features), or {"id": …, "features": […]}


class ClientError(Exception):
    """Anything the client could not do; ``attempts`` is how many times the request was sent."""

    attempts: int = 0


class ServiceError(ClientError):
    """The service answered an error: ``code`` is the stable ``error`` field, ``detail`` says why."""

    def __init__(self, status: int, code: str, detail: str, request_id: str | None, attempts: int) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status, self.code, self.detail, self.request_id, self.attempts = status, code, detail, request_id, attempts


class Unreachable(ClientError):
    """No answer from the service (connection refused or lost, timeout) within the retry budget."""

    def __init__(self, cause: httpx.TransportError, attempts: int) -> None:
        super().__init__(f"no answer from the service after {attempts} attempt(s): {cause!r}")
        self.attempts = attempts


@dataclass(frozen=True)
class Decision:
    """The answer of /choose. ``request_id`` is the one sent (drawn by the client if the caller gave none):
    asking again with it returns this same decision."""

    decision_id: str
    campaign: str
    arm: str
    policy: str
    propensity: float
    fallback: bool
    request_id: str


@dataclass(frozen=True)
class Rejection:
    """One event the service refused, with the event itself: resending it as is would be refused again
    (except ``campaign_paused``: after the resume)."""

    index: int  # the event's position in the list given to ``feedback`` (in its batch, for ``send``)
    reason: str
    detail: str
    event: Event


@dataclass(frozen=True)
class FeedbackResult:
    """The answer of /feedback (summed over the requests a large list was split into). ``censored``,
    ``repeats`` and ``stale`` are parts of ``accepted``; ``duplicates`` (events seen before) are not."""

    accepted: int = 0
    duplicates: int = 0
    censored: int = 0
    repeats: int = 0
    stale: int = 0
    rejected: tuple[Rejection, ...] = field(default=())

    def __add__(self, other: FeedbackResult) -> FeedbackResult:
        return FeedbackResult(
            self.accepted + other.accepted, self.duplicates + other.duplicates, self.censored + other.censored,
            self.repeats + other.repeats, self.stale + other.stale, self.rejected + other.rejected,
        )  # fmt: skip


def new_request_id() -> str:
    return uuid.uuid4().hex


def choose_request(
    campaign: str, request_id: str | None, actions: Sequence[Action] | None = None, context: Features | None = None
) -> tuple[str, bytes]:
    """The request id (drawn here when the caller gave none, so that every retry carries the same) and the
    body of /choose, with a contextual campaign's ``actions`` or ``context`` as the service takes them (the
    service checks them: a misfit is its 422)."""
    request_id = request_id or new_request_id()
    body: dict[str, Any] = {"campaign": campaign, "request_id": request_id}
    if actions is not None:
        body["actions"] = [offered_action(action) for action in actions]
    if context is not None:
        body["context"] = numbers(context)
    return request_id, orjson.dumps(body)


def offered_action(action: Action) -> dict[str, Any]:
    """One action of /choose's ``actions``, from an (id, features) pair or a mapping with both."""
    label, features = (action["id"], action["features"]) if isinstance(action, Mapping) else action
    return {"id": label, "features": numbers(features)}


def numbers(features: Features) -> list[float]:
    """Plain floats, which orjson writes (a numpy array's items it refuses)."""
    return [float(value) for value in features]


def feedback_body(batch: Sequence[Event]) -> bytes:
    return orjson.dumps({"events": batch})


def feedback_batches(events: Sequence[Event], size: int = MAX_EVENTS) -> list[list[Event]]:
    """The events in requests of at most ``size``, each aggregate given an id first (``with_event_id``)."""
    if not 1 <= size <= MAX_EVENTS:
        raise ValueError(f"a batch holds 1 to {MAX_EVENTS} events (got {size})")
    ready = [with_event_id(event) for event in events]
    return [ready[start : start + size] for start in range(0, len(ready), size)]


def service_error(response: httpx.Response, attempts: int) -> ServiceError:
    """The error an answer of 400 or above stands for (a body that is not the service's own still gives one)."""
    try:
        body = response.json()
        code, detail = str(body["error"]), str(body.get("detail", ""))
    except (ValueError, KeyError, TypeError):
        code, detail = f"http_{response.status_code}", response.text[:500]
    return ServiceError(response.status_code, code, detail, response.headers.get("x-request-id"), attempts)


def answer_of(response: httpx.Response, attempts: int) -> Any:
    """The JSON of a 2xx answer; a ``ServiceError`` for any other."""
    if not response.is_success:
        raise service_error(response, attempts)
    return response.json()


def decision_of(response: httpx.Response, request_id: str, attempts: int) -> Decision:
    return decision_from(answer_of(response, attempts), request_id)


def decision_from(body: dict[str, Any], request_id: str) -> Decision:
    """The decision a /choose answer's JSON holds."""
    return Decision(body["decision_id"], body["campaign"], body["arm"], body["policy"], float(body["propensity"]),
                    bool(body["fallback"]), request_id)  # fmt: skip


def feedback_result(
    batches: Sequence[Sequence[Event]], answers: Sequence[tuple[httpx.Response, int]]
) -> FeedbackResult:
    """The answers (each with the attempts it took) to ``batches``, one result indexed as their concatenation."""
    total = FeedbackResult()
    offset = 0
    for batch, (response, attempts) in zip(batches, answers, strict=True):
        total += feedback_result_from(answer_of(response, attempts), batch, offset)
        offset += len(batch)
    return total


def feedback_result_from(body: dict[str, Any], batch: Sequence[Event], offset: int = 0) -> FeedbackResult:
    """What a /feedback answer's JSON says of ``batch``, whose first event was at ``offset`` in the caller's list."""
    rejected = tuple(
        Rejection(offset + item["index"], item["reason"], item["detail"], batch[item["index"]])
        for item in body["rejected"]
    )
    return FeedbackResult(body["accepted"], body["duplicates"], body["censored"], body["repeats"], body["stale"],
                          rejected)  # fmt: skip
