"""The traffic of ``latebandit loadtest``: ad servers calling /choose and sending their conversions late.

Each connection plays one ad server (``AdServer``): it asks /choose with a fresh ``request_id``; a share of
the decisions converts after an exponential delay (wall time: the conversion's ``occurred_at`` is when it
happened, and it is sent at the next feedback flush after that, so late); every ``feedback_every``
decisions it flushes what has occurred as one /feedback batch, adding duplicates of events already
acknowledged, and aggregates when the campaign's policy accepts them. A 503 or a lost connection is
retried with the same body (the service must recognise it); a share of /choose calls is re-sent with
the same ``request_id`` as a client retry after a timeout, and must get the same decision back.

The bodies, the events, the reading of /feedback answers and what is retried are latebandit.client's
(its pure protocol part); only the transport is the load generator's own (loadtest/client.py says why).
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from latebandit.client.events import Event, aggregate, conversion
from latebandit.client.protocol import FeedbackResult, choose_request, feedback_body, feedback_result_from
from latebandit.client.retry import RETRYABLE_STATUSES
from latebandit.loadtest.client import CONNECTION_LOST, post
from latebandit.timeutil import MICROS, format_time, wall_clock

RETRY_STATUSES = (*RETRYABLE_STATUSES, CONNECTION_LOST)


@dataclass(frozen=True)
class Mix:
    campaign: str
    conversion_rate: float = 0.2
    mean_delay: float = 2.0  # seconds of wall time between a decision and its conversion
    feedback_every: int = 20  # decisions between two feedback flushes
    duplicate_share: float = 0.1  # chance that each fresh conversion brings along an acknowledged one again
    choose_retry_share: float = 0.02  # /choose calls re-sent with their request_id
    feedback_retry_share: float = 0.05  # acknowledged batches re-sent whole (their answer "timed out")
    aggregates: bool = False  # whether the campaign's policy takes aggregate events
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Tally:
    """What the clients did and what the service answered, summed over connections."""

    decisions: int = 0
    choose_retries: int = 0
    feedback_retries: int = 0
    choose_retry_mismatches: int = 0  # a retried request_id that got another decision: a service bug
    conversions_sent: int = 0
    aggregates_sent: int = 0
    duplicates_sent: int = 0
    retries: int = 0  # requests re-sent after a 503 or a lost connection
    accepted: int = 0
    duplicates: int = 0
    censored: int = 0
    rejected: int = 0
    rejection_reasons: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Batch:
    """A /feedback request's make-up, to tally once the service acknowledged it."""

    events: list[Event]
    fresh: list[Event]
    repeats: int
    aggregates: int


class AdServer:
    """One connection's client (a ``Session``); its random choices are reproducible per seed."""

    def __init__(self, mix: Mix, tally: Tally, name: str, seed: int) -> None:
        self.mix = mix
        self.tally = tally
        self.name = name
        self.random = random.Random(seed)
        self.serial = 0
        self.conversions = itertools.count()
        self.due: list[tuple[int, str]] = []  # (occurred_at µs, decision_id) of conversions to come
        self.acknowledged: deque[Event] = deque(maxlen=1000)  # events the service answered 200 for
        self.aggregate_from = wall_clock()
        # The request awaiting its answer, kept until answered: (kind, raw request, context). The context
        # of a /choose is the decision id it must return (a deliberate retry) or None; of a /feedback, its Batch.
        self.last: tuple[str, bytes, Any] | None = None
        self.resend = False

    # requests ---------------------------------------------------------------------------------------

    def next_request(self) -> tuple[str, bytes]:
        if self.resend and self.last is not None:
            self.resend = False
            return self.last[0], self.last[1]
        self.serial += 1
        if self.serial % self.mix.feedback_every == 0 and (self.mix.aggregates or self._ready()):
            return self._feedback()
        _, body = choose_request(self.mix.campaign, f"{self.name}-{self.serial}")
        self.last = ("choose", post("/choose", body, self.mix.headers), None)
        return "choose", self.last[1]

    def _ready(self) -> bool:
        now = wall_clock()
        return any(occurred <= now for occurred, _ in self.due)

    def _feedback(self) -> tuple[str, bytes]:
        now = wall_clock()
        fresh = [
            conversion(decision_id, at=format_time(occurred), event_id=f"{self.name}-c{next(self.conversions)}")
            for occurred, decision_id in self.due if occurred <= now
        ]  # fmt: skip
        self.due = [item for item in self.due if item[0] > now]
        wanted = sum(self.random.random() < self.mix.duplicate_share for _ in range(max(len(fresh), 1)))
        repeats = self.random.sample(list(self.acknowledged), min(len(self.acknowledged), wanted))
        aggregates = []
        if self.mix.aggregates:
            aggregates.append(aggregate(self.mix.campaign, format_time(self.aggregate_from), format_time(now),
                                        float(len(fresh)), event_id=f"{self.name}-a{self.serial}"))  # fmt: skip
            self.aggregate_from = now
        events = fresh + repeats + aggregates
        batch = Batch(events, fresh, len(repeats), len(aggregates))
        self.last = ("feedback", post("/feedback", feedback_body(events), self.mix.headers), batch)
        return "feedback", self.last[1]

    # answers ----------------------------------------------------------------------------------------

    def on_response(self, status: int, body: bytes) -> None:
        if self.last is None:
            return
        if status in RETRY_STATUSES:  # nothing was applied that a retry would double: send it again
            self.tally.retries += 1
            self.resend = True
            return
        kind, request, context = self.last
        self.last = None
        if status != 200:
            return
        if kind == "choose":
            self._chosen(orjson.loads(body)["decision_id"], request, context)
        else:
            self._acknowledged(feedback_result_from(orjson.loads(body), context.events), request, context)

    def _chosen(self, decision_id: str, request: bytes, expected: str | None) -> None:
        if expected is not None:
            self.tally.choose_retry_mismatches += decision_id != expected
            return
        self.tally.decisions += 1
        if self.random.random() < self.mix.conversion_rate:
            delay = self.random.expovariate(1.0 / self.mix.mean_delay)
            self.due.append((wall_clock() + round(delay * MICROS), decision_id))
        if self.random.random() < self.mix.choose_retry_share:  # as if the answer had timed out: ask again
            self.tally.choose_retries += 1
            self.last = ("choose", request, decision_id)
            self.resend = True

    def _acknowledged(self, answer: FeedbackResult, request: bytes, batch: Batch) -> None:
        """Tally the answer; now and then re-send the whole batch, whose events must all come back as
        duplicates (the retried batch is tallied as repeats only)."""
        tally = self.tally
        tally.conversions_sent += len(batch.fresh)
        tally.duplicates_sent += batch.repeats
        tally.aggregates_sent += batch.aggregates
        tally.accepted += answer.accepted
        tally.duplicates += answer.duplicates
        tally.censored += answer.censored
        tally.rejected += len(answer.rejected)
        for rejection in answer.rejected:
            tally.rejection_reasons[rejection.reason] = tally.rejection_reasons.get(rejection.reason, 0) + 1
        self.acknowledged.extend(batch.fresh)
        if self.random.random() < self.mix.feedback_retry_share:
            tally.feedback_retries += 1
            self.last = ("feedback", request, Batch(batch.events, [], len(batch.events), 0))
            self.resend = True
