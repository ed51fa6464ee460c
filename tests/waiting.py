"""Waiting on a condition, not on time: poll until it holds, and fail naming it once a deadline has passed (a
generous one: the deadline only bounds a failing test, a passing one waits no longer than its condition)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


def until(condition: Callable[[], bool], what: str, timeout: float = 30.0, every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout}s")
        time.sleep(every)


async def until_async(
    condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 30.0, every: float = 0.01
) -> None:
    """``until`` for a condition an event loop answers (it keeps running while this waits)."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout}s")
        await asyncio.sleep(every)
