"""Group commit: what a request is promised (its own result, at once when idle, batched under load) and
what a failure or a cancellation does to the others."""

from __future__ import annotations

import asyncio

import pytest

from latebandit.group_commit import GroupCommit


class Recorder:
    """A flush that records its batches and takes one loop turn per batch (a store round trip)."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.fail_on = fail_on
        self.release = asyncio.Event()
        self.release.set()

    async def flush(self, key: str, items: list[str]) -> list[str]:
        self.batches.append(list(items))
        await self.release.wait()
        await asyncio.sleep(0)
        if self.fail_on in items:
            raise RuntimeError(f"store refused {self.fail_on}")
        return [f"{key}:{item}" for item in items]


async def test_an_idle_lane_flushes_at_once_and_alone() -> None:
    recorder = Recorder()
    group = GroupCommit(recorder.flush, limit=8)
    assert await group.submit("c", "a") == "c:a"
    assert await group.submit("c", "b") == "c:b"
    assert recorder.batches == [["a"], ["b"]]


async def test_requests_arriving_during_a_flush_go_together_in_order_and_within_the_limit() -> None:
    recorder = Recorder()
    recorder.release.clear()
    group = GroupCommit(recorder.flush, limit=3)
    first = asyncio.ensure_future(group.submit("c", "0"))
    await asyncio.sleep(0)
    others = [asyncio.ensure_future(group.submit("c", str(i))) for i in range(1, 6)]
    await asyncio.sleep(0)
    recorder.release.set()
    results = await asyncio.gather(first, *others)
    assert results == [f"c:{i}" for i in range(6)]  # each request its own result
    assert recorder.batches == [["0"], ["1", "2", "3"], ["4", "5"]]
    assert await group.submit("c", "6") == "c:6" and recorder.batches[-1] == ["6"]  # idle again: alone


async def test_keys_are_independent() -> None:
    recorder = Recorder()
    group = GroupCommit(recorder.flush, limit=8)
    assert await asyncio.gather(group.submit("a", "x"), group.submit("b", "x")) == ["a:x", "b:x"]


async def test_a_failed_flush_fails_its_own_batch_only() -> None:
    recorder = Recorder(fail_on="2")
    recorder.release.clear()
    group = GroupCommit(recorder.flush, limit=2)
    tasks = [asyncio.ensure_future(group.submit("c", "0"))]
    await asyncio.sleep(0)  # "0" is being flushed
    tasks += [asyncio.ensure_future(group.submit("c", str(i))) for i in range(1, 5)]
    await asyncio.sleep(0)
    recorder.release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert recorder.batches == [["0"], ["1", "2"], ["3", "4"]]
    assert results[0] == "c:0" and results[3:] == ["c:3", "c:4"]
    assert all(isinstance(result, RuntimeError) and "store refused 2" in str(result) for result in results[1:3])


async def test_a_cancelled_request_does_not_strand_the_others() -> None:
    recorder = Recorder()
    recorder.release.clear()
    group = GroupCommit(recorder.flush, limit=8)
    lone = asyncio.ensure_future(group.submit("c", "lone"))
    await asyncio.sleep(0)
    waiting = [asyncio.ensure_future(group.submit("c", str(i))) for i in range(3)]
    await asyncio.sleep(0)
    lone.cancel()  # the request whose own flush is in flight goes away (a client disconnect)
    with pytest.raises(asyncio.CancelledError):
        await lone
    recorder.release.set()
    assert await asyncio.gather(*waiting) == ["c:0", "c:1", "c:2"]
    assert recorder.batches == [["lone"], ["0", "1", "2"]]
