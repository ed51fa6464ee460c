"""Feedback events as the service takes them, built with their ids on the client.

An event id is drawn once, when the event is made, so every retry of the event carries the same id and the
service recognises it as a duplicate: a retry can never count twice.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Protocol

from latebandit.timeutil import format_time, to_micros, wall_clock

Event = dict[str, Any]
Moment = datetime | str | None  # a zone-aware datetime, an RFC 3339 string, or None for now


class HasDecisionId(Protocol):
    @property
    def decision_id(self) -> str: ...


def new_event_id() -> str:
    """32 hex digits: random (uuid4), so two clients never draw the same id, and a valid service id."""
    return uuid.uuid4().hex


def timestamp(at: Moment) -> str:
    """The RFC 3339 form of ``at`` (UTC, microseconds); a naive datetime is refused, since its zone is a guess."""
    if at is None:
        return format_time(wall_clock())
    if isinstance(at, str):
        return at
    if at.tzinfo is None:
        raise ValueError(f"{at!r} has no time zone: pass an aware datetime (e.g. tzinfo=UTC)")
    return format_time(to_micros(at))


def conversion(
    decision: str | HasDecisionId, value: float = 1.0, at: Moment = None, *, event_id: str | None = None
) -> Event:
    """A conversion of ``decision`` (its id, or the ``Decision`` itself) that occurred ``at`` (default now)."""
    decision_id = decision if isinstance(decision, str) else decision.decision_id
    return {"type": "conversion", "event_id": event_id or new_event_id(), "decision_id": decision_id,
            "occurred_at": timestamp(at), "value": value}  # fmt: skip


def aggregate(campaign: str, start: Moment, end: Moment, value: float, *, event_id: str | None = None) -> Event:
    """The total reward observed on ``campaign`` in ``[start, end)``, attributed to no decision."""
    return {"type": "aggregate", "event_id": event_id or new_event_id(), "campaign": campaign,
            "start": timestamp(start), "end": timestamp(end), "value": value}  # fmt: skip


def watermark(campaign: str, at: Moment = None) -> Event:
    """Every aggregate of ``campaign`` up to ``at`` (default now) has been sent. Idempotent, so it needs no id."""
    return {"type": "watermark", "campaign": campaign, "at": timestamp(at)}


def with_event_id(event: Event) -> Event:
    """``event``, with a fresh id if it is an aggregate without one: an aggregate is keyed by its id alone, so
    without one its retry would count twice. A conversion without an id is keyed by its decision (a second
    one is a duplicate) and keeps that meaning; a watermark is idempotent."""
    if event.get("type") == "aggregate" and "event_id" not in event:
        return {**event, "event_id": new_event_id()}
    return event
