"""``Client``: the blocking client. Background batches are sent by one daemon thread, started by the first
``send``."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import httpx

from latebandit.client.base import ClientBase
from latebandit.client.batching import BufferFull, DeliveryReport
from latebandit.client.events import Event
from latebandit.client.protocol import (
    Action,
    Decision,
    Features,
    FeedbackResult,
    choose_request,
    decision_of,
    feedback_batches,
    feedback_body,
    feedback_result,
)


class Client(ClientBase):
    """A client of one latebandit service, safe to share between threads. Use it as a context manager (or
    call ``close``), so that the events queued with ``send`` are delivered before it goes."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._http = httpx.Client(**self._http_options)
        self._condition = threading.Condition()
        self._flusher: threading.Thread | None = None

    def choose(
        self, campaign: str, request_id: str | None = None, *, actions: Sequence[Action] | None = None,
        context: Features | None = None,
    ) -> Decision:  # fmt: skip
        """The campaign's decision for one impression. Retries reuse ``request_id`` (one is drawn when none is
        given), so a retry whose first attempt did reach the service returns that same decision. A contextual
        campaign takes the request's ``actions`` ((id, features) pairs or {"id", "features"} mappings: the
        decision's ``arm`` is the chosen id) or its ``context`` (one feature vector for the campaign's arms)."""
        request_id, body = choose_request(campaign, request_id, actions, context)
        response, attempts = self._post("/choose", body)
        return decision_of(response, request_id, attempts)

    def feedback(self, events: Sequence[Event]) -> FeedbackResult:
        """Send ``events`` now (in requests of at most 10,000) and return what the service made of them. If it
        raises, sending the same events again is safe: those already applied come back as ``duplicates``."""
        batches = feedback_batches(events)
        return feedback_result(batches, [self._post("/feedback", feedback_body(batch)) for batch in batches])

    def send(self, event: Event, timeout: float | None = None) -> None:
        """Queue ``event`` for a background batch. Blocks while the buffer is full; with ``timeout`` (seconds),
        raises ``BufferFull`` once it has waited that long. Never drops an event."""
        with self._condition:
            self._refuse_if_closed()
            if not self._condition.wait_for(self._buffer.has_room, timeout):
                raise BufferFull(f"no room in the feedback buffer within {timeout} s")
            self._buffer.put(event, time.monotonic())
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_loop, name="latebandit-feedback", daemon=True)
                self._flusher.start()
            self._condition.notify_all()

    def flush(self) -> DeliveryReport:
        """Send every queued event now and wait for the answers; the report so far."""
        with self._condition:
            self._flushes += 1
            self._condition.notify_all()
            self._condition.wait_for(self._buffer.idle)
            self._flushes -= 1
        return self.report

    def close(self) -> DeliveryReport:
        """Deliver what is queued, stop the background thread and the connections. Returns the report of the
        background deliveries; raises ``FeedbackNotDelivered`` (holding them) if some events never were."""
        with self._condition:
            self._closing = True
            self._condition.notify_all()
        if self._flusher is not None:
            self._flusher.join()
        self._http.close()
        return self._final_report()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def _post(self, path: str, body: bytes) -> tuple[httpx.Response, int]:
        """Send until an answer other than 503 or the retry policy gives up; (answer, attempts made)."""
        attempts = self.retry.start(time.monotonic())
        while True:
            try:
                outcome: httpx.Response | httpx.TransportError = self._http.post(path, content=body)
            except httpx.TransportError as error:
                outcome = error
            verdict = attempts.verdict(outcome, time.monotonic())
            if isinstance(verdict, httpx.Response):
                return verdict, attempts.made
            time.sleep(verdict)

    def _flush_loop(self) -> None:
        with self._condition:
            while True:
                wait = self._buffer.wait(time.monotonic(), self._draining())
                if wait is None and self._closing:
                    return
                if wait != 0.0:
                    self._condition.wait(wait)
                    continue
                batch = self._buffer.take()
                self._condition.release()
                try:
                    self._deliver(batch)
                finally:
                    self._condition.acquire()
                self._buffer.done(batch)
                self._condition.notify_all()

    def _deliver(self, batch: list[Event]) -> None:
        try:
            result = self.feedback(batch)
        except Exception as error:  # the background thread reports every failure and lives on
            self.report.failed(batch, error)
        else:
            self.report.delivered(result)
