"""Scripts sent on connections of their own, past redis-py's per-command layers (one Redis node).

A script call through redis-py's client passes its retry wrapper, the blocking pool's condition and readiness
probe, event dispatch, observability recorders and, under ``socket_timeout``, a task per write. /choose makes
one script call per group commit, which at one connection is one per request, so this sends the packed
EVALSHA on redis-py's own connection class, built from the pool's own settings, for a fraction of the CPU
(docs/benchmarks.md), and keeps each promise the store relies on:

- a call's time is bounded: one ``timeout`` over waiting for a connection, sending and the reply, as the
  pool's wait and ``socket_timeout`` bounded each (so a hung Redis sheds a burst instead of queueing it);
- a call cut short (timeout, cancellation, a broken socket) leaves its connection disconnected: no later call
  can read the reply meant for it, and the connection reconnects on its next use;
- at most ``limit`` connections: a burst waits for a free one, as with the blocking pool;
- a script Redis no longer knows (a restart, ``SCRIPT FLUSH``) is loaded again and sent once more, as
  redis-py's own script call does: NOSCRIPT means it did not run;
- a new connection takes the pool's settings as they are then (a maintenance notice can move the host), and
  one marked for reconnection is closed when its call ends, as the pool does on release.

What this needs of redis-py beyond its public API is in store/redis_py_adapter.py, and only there. A Redis
Cluster routes each script to its node by hash tag; the store leaves that to redis-py's cluster client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError
from redis.typing import EncodableT

from latebandit.store.redis_py_adapter import close_now, evalsha, must_reconnect, reload, untimed_connection


class ScriptConnections:
    def __init__(self, client: aioredis.Redis, limit: int, timeout: float) -> None:
        self._client = client  # loads a script Redis lost
        self._pool = client.connection_pool
        self._idle: list[AbstractConnection] = []
        self._free = asyncio.Semaphore(limit)
        self._timeout = timeout
        self._closed = False

    async def run(self, script: AsyncScript, keys: Sequence[str], args: Sequence[EncodableT]) -> Any:
        """The script's reply; redis-py's ConnectionError or ResponseError, or TimeoutError, as it fails."""
        async with asyncio.timeout(self._timeout), self._free:
            connection = self._idle.pop() if self._idle else untimed_connection(self._pool)
            try:
                return await self._evalsha(connection, script, keys, args)
            finally:
                await self._release(connection)

    async def _release(self, connection: AbstractConnection) -> None:
        """Back to the idle ones (disconnected if its call failed: it reconnects when next used), unless it
        must reconnect or the store closed, where it is closed now."""
        if self._closed or must_reconnect(connection):
            await close_now(connection)
            return
        self._idle.append(connection)

    async def _evalsha(
        self, connection: AbstractConnection, script: AsyncScript, keys: Sequence[str], args: Sequence[EncodableT]
    ) -> Any:
        try:
            return await evalsha(connection, script.sha, keys, args)
        except NoScriptError:
            return await evalsha(connection, await reload(self._client, script), keys, args)

    async def disconnect(self) -> None:
        """Close the idle connections (after Redis restarted they are all dead; the next call reconnects).
        They leave the idle list first, so that no call meanwhile takes one that is closing."""
        idle, self._idle = self._idle, []
        for connection in idle:
            await close_now(connection)

    async def close(self) -> None:
        """Close every connection: the idle ones now, those of calls in flight when their call ends."""
        self._closed = True
        await self.disconnect()
