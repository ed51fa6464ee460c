"""Feedback sent in the background: the bounded buffer's rules and the report of what was delivered.

``Client`` (a thread) and ``AsyncClient`` (a task) each guard a ``Buffer`` with their own lock and wake-ups;
what to send and when, and what the service made of it, is decided here for both.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from latebandit.client.events import Event, with_event_id
from latebandit.client.protocol import MAX_EVENTS, ClientError, FeedbackResult

log = logging.getLogger("latebandit.client")


@dataclass(frozen=True)
class Batching:
    """A batch leaves when it holds ``size`` events, or ``interval`` seconds after its oldest event was
    queued, or at ``flush``/``close``. At most ``capacity`` events wait (queued and in flight); beyond
    that ``send`` blocks until a batch has gone (or raises ``BufferFull`` after its ``timeout``)."""

    size: int = 1000
    interval: float = 1.0
    capacity: int = 100_000

    def __post_init__(self) -> None:
        if not 1 <= self.size <= MAX_EVENTS or self.capacity < self.size or self.interval <= 0:
            raise ValueError(f"batching needs 1 <= size <= {MAX_EVENTS}, capacity >= size and interval > 0: {self}")


class BufferFull(ClientError):
    """``send`` waited its ``timeout`` for room in the buffer; the event was not queued."""


@dataclass
class Undelivered:
    """Events the service never acknowledged: the retries ran out, or it refused the whole request."""

    events: list[Event]
    error: Exception


class FeedbackNotDelivered(ClientError):
    """Raised by ``close`` when some queued events were never acknowledged; ``report.undelivered`` has them,
    to store or send again (their ids make a second send harmless)."""

    def __init__(self, report: DeliveryReport) -> None:
        count = sum(len(item.events) for item in report.undelivered)
        super().__init__(f"{count} queued feedback event(s) were not delivered: {report.undelivered[0].error}")
        self.report = report


@dataclass
class DeliveryReport:
    """What became of the events queued with ``send``: ``result`` sums the service's answers (its
    ``rejected`` holds each refused event, which is reported and never retried); ``undelivered`` the rest."""

    result: FeedbackResult = field(default_factory=FeedbackResult)
    undelivered: list[Undelivered] = field(default_factory=list)

    def delivered(self, result: FeedbackResult) -> None:
        self.result += result
        for rejection in result.rejected:
            log.warning("feedback event rejected (%s: %s): %s", rejection.reason, rejection.detail, rejection.event)

    def failed(self, events: list[Event], error: Exception) -> None:
        self.undelivered.append(Undelivered(events, error))
        log.error("%d feedback event(s) not delivered: %s", len(events), error)


class Buffer:
    """The queued events, each with the time it was queued. Not thread-safe: the caller holds its lock."""

    def __init__(self, batching: Batching) -> None:
        self.batching = batching
        self.queued: deque[tuple[float, Event]] = deque()  # (the client's monotonic clock when queued, event)
        self.in_flight = 0  # events taken and not yet answered: they still hold their room

    def has_room(self) -> bool:
        return len(self.queued) + self.in_flight < self.batching.capacity

    def put(self, event: Event, now: float) -> None:
        self.queued.append((now, with_event_id(event)))

    def wait(self, now: float, draining: bool) -> float | None:
        """Seconds until the next batch is due (0: now), or None while nothing is queued."""
        if not self.queued:
            return None
        if draining or len(self.queued) >= self.batching.size:
            return 0.0
        return max(0.0, self.queued[0][0] + self.batching.interval - now)

    def take(self) -> list[Event]:
        batch = [self.queued.popleft()[1] for _ in range(min(len(self.queued), self.batching.size))]
        self.in_flight += len(batch)
        return batch

    def done(self, batch: list[Event]) -> None:
        self.in_flight -= len(batch)

    def idle(self) -> bool:
        return not self.queued and not self.in_flight
