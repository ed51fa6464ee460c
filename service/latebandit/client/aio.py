"""``AsyncClient``: the asyncio client. Background batches are sent by one task, started by the first
``send``, on the loop the client is used from."""

from __future__ import annotations

import asyncio
import contextlib
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


class AsyncClient(ClientBase):
    """The asyncio twin of ``Client``: the same arguments, the same results, awaited. Use it as an async
    context manager (or await ``close``) so that the events queued with ``send`` are delivered."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._http = httpx.AsyncClient(**self._http_options)
        self._condition = asyncio.Condition()
        self._flusher: asyncio.Task[None] | None = None

    async def choose(
        self, campaign: str, request_id: str | None = None, *, actions: Sequence[Action] | None = None,
        context: Features | None = None,
    ) -> Decision:  # fmt: skip
        """As ``Client.choose``."""
        request_id, body = choose_request(campaign, request_id, actions, context)
        response, attempts = await self._post("/choose", body)
        return decision_of(response, request_id, attempts)

    async def feedback(self, events: Sequence[Event]) -> FeedbackResult:
        """As ``Client.feedback``."""
        batches = feedback_batches(events)
        return feedback_result(batches, [await self._post("/feedback", feedback_body(batch)) for batch in batches])

    async def send(self, event: Event, timeout: float | None = None) -> None:
        """As ``Client.send``: waits while the buffer is full, ``BufferFull`` after ``timeout`` seconds."""
        async with self._condition:
            self._refuse_if_closed()
            try:
                await asyncio.wait_for(self._condition.wait_for(self._buffer.has_room), timeout)
            except TimeoutError:
                raise BufferFull(f"no room in the feedback buffer within {timeout} s") from None
            self._buffer.put(event, time.monotonic())
            if self._flusher is None:
                self._flusher = asyncio.create_task(self._flush_loop(), name="latebandit-feedback")
            self._condition.notify_all()

    async def flush(self) -> DeliveryReport:
        """As ``Client.flush``."""
        async with self._condition:
            self._flushes += 1
            self._condition.notify_all()
            await self._condition.wait_for(self._buffer.idle)
            self._flushes -= 1
        return self.report

    async def close(self) -> DeliveryReport:
        """As ``Client.close``."""
        async with self._condition:
            self._closing = True
            self._condition.notify_all()
        if self._flusher is not None:
            await self._flusher
        await self._http.aclose()
        return self._final_report()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.close()

    async def _post(self, path: str, body: bytes) -> tuple[httpx.Response, int]:
        attempts = self.retry.start(time.monotonic())
        while True:
            try:
                outcome: httpx.Response | httpx.TransportError = await self._http.post(path, content=body)
            except httpx.TransportError as error:
                outcome = error
            verdict = attempts.verdict(outcome, time.monotonic())
            if isinstance(verdict, httpx.Response):
                return verdict, attempts.made
            await asyncio.sleep(verdict)

    async def _flush_loop(self) -> None:
        async with self._condition:
            while True:
                wait = self._buffer.wait(time.monotonic(), self._draining())
                if wait is None and self._closing:
                    return
                if wait != 0.0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._condition.wait(), wait)
                    continue
                batch = self._buffer.take()
                self._condition.release()
                try:
                    await self._deliver(batch)
                finally:
                    await self._condition.acquire()
                self._buffer.done(batch)
                self._condition.notify_all()

    async def _deliver(self, batch: list[Event]) -> None:
        try:
            result = await self.feedback(batch)
        except Exception as error:  # the background task reports every failure and lives on
            self.report.failed(batch, error)
        else:
            self.report.delivered(result)
