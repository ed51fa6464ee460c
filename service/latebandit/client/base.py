"""What ``Client`` and ``AsyncClient`` hold in common: their settings, the background buffer and its report.
Each subclass adds only its way of sending, sleeping and waking up."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from latebandit.client.batching import Batching, Buffer, DeliveryReport, FeedbackNotDelivered
from latebandit.client.protocol import ClientError
from latebandit.client.retry import RetryPolicy

DEFAULT_TIMEOUT = 10.0  # seconds for each attempt of a request (connect, read, write)


class ClientBase:
    """``url`` is the service's base URL (``http://127.0.0.1:8000``); ``api_key`` is sent as
    ``Authorization: Bearer <key>``; ``timeout`` bounds each attempt, in seconds; ``retry`` says when a
    request is sent again; ``batching`` how ``send`` groups events in the background; ``http_options`` go
    to the httpx client underneath (``transport``, ``limits``, ``verify``…)."""

    def __init__(
        self, url: str, *, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None, batching: Batching | None = None,
        headers: Mapping[str, str] | None = None, **http_options: Any,
    ) -> None:  # fmt: skip
        sent = {"content-type": "application/json", **(headers or {})}
        if api_key:
            sent["authorization"] = f"Bearer {api_key}"
        self._http_options: dict[str, Any] = {"base_url": url, "headers": sent, "timeout": timeout, **http_options}
        self.retry = retry or RetryPolicy()
        self.batching = batching or Batching()
        self.report = DeliveryReport()
        self._buffer = Buffer(self.batching)
        self._closing = False
        self._flushes = 0  # callers waiting in ``flush``: the buffer drains without waiting for full batches

    def _draining(self) -> bool:
        return self._closing or self._flushes > 0

    def _refuse_if_closed(self) -> None:
        if self._closing:
            raise ClientError("the client is closed")

    def _final_report(self) -> DeliveryReport:
        """The report ``close`` returns; raises if some queued events were never acknowledged."""
        if self.report.undelivered:
            raise FeedbackNotDelivered(self.report)
        return self.report
