"""A small closed-loop HTTP/1.1 load generator (asyncio streams, keep-alive, pre-built requests).

A general-purpose client (httpx) spends more CPU per request than a FastAPI endpoint does, so on a
2-core machine it would measure itself; this one keeps the client far cheaper than the server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class LoadResult:
    requests: int
    errors: int
    seconds: float
    latencies: np.ndarray = field(repr=False)
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if len(self.latencies) else float("nan")


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
    host: str, port: int, next_request: Callable[[], bytes], deadline: float,
    latencies: list[float], statuses: dict[int, int], on_body: Callable[[bytes], None] | None,
) -> int:  # fmt: skip
    errors = 0
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < deadline:
            request = next_request()
            started = time.perf_counter()
            writer.write(request)
            try:
                status, body = await _read_response(reader)
            except (ConnectionError, asyncio.IncompleteReadError):
                errors += 1
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
                continue
            latencies.append(time.perf_counter() - started)
            statuses[status] = statuses.get(status, 0) + 1
            errors += status >= 400
            if on_body is not None:
                on_body(body)
    finally:
        writer.close()
    return errors


async def run_load(
    host: str, port: int, next_request: Callable[[], bytes], duration: float, concurrency: int,
    on_body: Callable[[bytes], None] | None = None,
) -> LoadResult:  # fmt: skip
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    started = time.perf_counter()
    deadline = started + duration
    errors = await asyncio.gather(
        *(_connection(host, port, next_request, deadline, latencies, statuses, on_body) for _ in range(concurrency))
    )
    seconds = time.perf_counter() - started
    return LoadResult(len(latencies), sum(errors), seconds, np.array(latencies), statuses)
