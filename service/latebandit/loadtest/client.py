"""A small closed-loop HTTP/1.1 load generator (asyncio streams, keep-alive, pre-built requests).

A general-purpose client (httpx, under latebandit.client) spends more CPU per request than a FastAPI
endpoint does, so on a 2-core machine it would measure itself; this one keeps the client far cheaper than
the server. So the load test sends with this transport and takes the rest from latebandit.client: the
bodies, the events and their ids, the reading of answers and which failures are retried (traffic.py).

Each connection runs one ``Session``: the session says what to send next and sees every answer, so a
traffic mix can keep per-client state (decisions awaiting their conversions, retries of failed calls).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

CONNECTION_LOST = 0  # the status a session sees when the connection broke before an answer


class Session(Protocol):
    def next_request(self) -> tuple[str, bytes]:
        """(kind, raw HTTP request): the kind labels the latency and status tallies."""
        ...

    def on_response(self, status: int, body: bytes) -> None:
        """The answer to the last request (``CONNECTION_LOST`` if there was none)."""
        ...


@dataclass
class Repeat:
    """The simplest session: the same request, or the next of an iterator, again and again."""

    source: Callable[[], bytes]
    kind: str = "request"

    def next_request(self) -> tuple[str, bytes]:
        return self.kind, self.source()

    def on_response(self, status: int, body: bytes) -> None:
        return None


@dataclass
class LoadResult:
    seconds: float
    latencies: dict[str, np.ndarray] = field(repr=False)  # per kind, seconds
    statuses: dict[str, dict[int, int]] = field(default_factory=dict)  # per kind: status -> count

    @property
    def requests(self) -> int:
        return sum(len(values) for values in self.latencies.values())

    @property
    def errors(self) -> int:
        """Answers of 400 or above and lost connections."""
        return sum(n for by_status in self.statuses.values() for s, n in by_status.items() if s >= 400 or s == 0)

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds

    def percentile(self, q: float, kind: str | None = None) -> float:
        values = np.concatenate(list(self.latencies.values())) if kind is None else self.latencies.get(kind)
        return float(np.percentile(values, q)) if values is not None and len(values) else float("nan")


def post(path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"{extra}Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("connection closed")
    status = int(status_line.split()[1])
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def _connection(
    host: str, port: int, session: Session, deadline: float,
    latencies: dict[str, list[float]], statuses: dict[str, dict[int, int]],
) -> None:  # fmt: skip
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < deadline:
            kind, request = session.next_request()
            started = time.perf_counter()
            writer.write(request)
            try:
                status, body = await _read_response(reader)
            except (ConnectionError, asyncio.IncompleteReadError):
                status, body = CONNECTION_LOST, b""
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
            else:
                latencies[kind].append(time.perf_counter() - started)
            statuses[kind][status] = statuses[kind].get(status, 0) + 1
            session.on_response(status, body)
    finally:
        writer.close()


async def run_load(
    host: str, port: int, sessions: Callable[[], Session], duration: float, concurrency: int
) -> LoadResult:
    """``concurrency`` keep-alive connections, each running a fresh session until ``duration`` is over."""
    latencies: dict[str, list[float]] = defaultdict(list)
    statuses: dict[str, dict[int, int]] = defaultdict(dict)
    started = time.perf_counter()
    deadline = started + duration
    await asyncio.gather(
        *(_connection(host, port, sessions(), deadline, latencies, statuses) for _ in range(concurrency))
    )
    seconds = time.perf_counter() - started
    return LoadResult(seconds, {kind: np.array(values) for kind, values in latencies.items()}, dict(statuses))
