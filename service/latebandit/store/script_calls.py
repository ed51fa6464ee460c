"""Scripts sent on connections of their own, past redis-py's per-command layers (one Redis node).

A script call through redis-py 8's client passes its retry wrapper, the blocking pool's condition and
readiness probe, event dispatch, observability recorders and, under ``socket_timeout``, a task per write:
a decision's record call sent this way, on one of its connections and packed by hiredis, costs about half
the CPU of redis-py's (benchmarks/script_call_bench.py measures both). /choose makes one such call per group
commit, which at one connection is one per request, so every request would pay the difference. This sends the packed
EVALSHA on redis-py's own connection class, built from the pool's own settings (URL, TLS, AUTH, SELECT,
RESP version, the hiredis parser), and keeps each promise the store relies on:

- a call's time is bounded: one ``timeout`` over waiting for a connection, sending and the reply, as the
  pool's wait and ``socket_timeout`` bounded each (so a hung Redis sheds a burst instead of queueing it);
- a call cut short (timeout, cancellation, a broken socket) leaves its connection disconnected, because
  redis-py's ``read_response`` and ``send_packed_command`` disconnect on any exception: no later call can
  read the reply meant for it, and the connection reconnects on its next use;
- at most ``limit`` connections: a burst waits for a free one, as with the blocking pool;
- a script Redis no longer knows (a restart, ``SCRIPT FLUSH``) is loaded again and sent once more, as
  redis-py's own script call does: NOSCRIPT means it did not run;
- a new connection takes the pool's settings as they are then (a maintenance notice can move the host), and
  one marked for reconnection is closed when its call ends, as the pool does on release.

A Redis Cluster routes each script to its node by hash tag; the store leaves that to redis-py's cluster client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.exceptions import DataError, NoScriptError
from redis.typing import EncodableT


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
            connection = self._idle.pop() if self._idle else self._connection()
            try:
                return await self._evalsha(connection, script, keys, args)
            finally:
                await self._release(connection)

    def _connection(self) -> AbstractConnection:
        """A new connection with the pool's current settings, its calls bounded by ``run`` instead."""
        settings = {**self._pool.connection_kwargs, "socket_timeout": None}
        if "orig_socket_timeout" in settings:  # what a maintenance notice restores the timeout to
            settings["orig_socket_timeout"] = None
        return self._pool.connection_class(**settings)

    async def _release(self, connection: AbstractConnection) -> None:
        """Back to the idle ones (disconnected if its call failed: it reconnects when next used), unless it
        must reconnect or the store closed, where it is closed now."""
        if self._closed or connection.should_reconnect():
            await connection.disconnect(nowait=True)
            return
        self._idle.append(connection)

    async def _evalsha(
        self, connection: AbstractConnection, script: AsyncScript, keys: Sequence[str], args: Sequence[EncodableT]
    ) -> Any:
        try:
            return await self._send(connection, script.sha, keys, args)
        except NoScriptError:
            script.sha = await self._client.script_load(script.script)
            return await self._send(connection, script.sha, keys, args)

    @staticmethod
    async def _send(connection: AbstractConnection, sha: str, keys: Sequence[str], args: Sequence[EncodableT]) -> Any:
        """Packed by hiredis (C): the same bytes as redis-py's ``pack_command`` (at its default UTF-8 encoding)
        for the exact str, bytes, int and float (repr) arguments the store sends, in a fraction of its time
        (benchmarks/script_call_bench.py; the figures are in docs/benchmarks.md)."""
        command = ("EVALSHA", sha, len(keys), *keys, *args)
        try:
            packed = hiredis.pack_command(command)  # type: ignore[arg-type]  # its stub declares a 1-tuple
        except TypeError as error:  # a bool, a NumPy integer: redis-py's encoder refuses them as DataError too
            raise DataError(str(error)) from error
        await connection.send_packed_command(packed, check_health=False)
        return await connection.read_response()

    async def disconnect(self) -> None:
        """Close the idle connections (after Redis restarted they are all dead; the next call reconnects).
        They leave the idle list first, so that no call meanwhile takes one that is closing."""
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.disconnect(nowait=True)

    async def close(self) -> None:
        """Close every connection: the idle ones now, those of calls in flight when their call ends."""
        self._closed = True
        await self.disconnect()
