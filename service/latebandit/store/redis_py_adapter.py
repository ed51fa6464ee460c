"""The one module that reaches past redis-py's public client API: what store/script_calls.py needs to send a
script on a connection of its own and read the reply, without redis-py's per-command layers.

redis-py offers no public way to do that, so these functions lean on parts of it that are not promised
stable. Each is named here with why; tests/integration/test_redis_py_adapter.py checks each against a real
Redis, so that a redis-py upgrade fails there, and pyproject.toml pins the redis-py versions they were checked
with. Widen the pin only after that test passes on the new version.

- ``ConnectionPool.connection_kwargs`` and ``connection_class``: the pool's own settings (URL, TLS, AUTH,
  SELECT, RESP version, the hiredis parser), to build a connection exactly like the pool's, outside the pool.
- ``socket_timeout`` and ``orig_socket_timeout`` in those settings: cleared, because the caller bounds each
  call itself; ``orig_socket_timeout`` is what a maintenance notice (redis-py 7's maintenance notifications)
  restores the timeout to, and would otherwise bring the pool's timeout back.
- ``AbstractConnection.should_reconnect()``: set by a maintenance notice (the host is moving); the pool closes
  such a connection when it is released, and the caller must do the same.
- ``AbstractConnection.send_packed_command(check_health=False)`` and ``read_response()``: the bytes sent as
  they are, with no PING round trip first, and the reply read. Both disconnect the connection on any
  exception (a timeout, a cancellation, a broken socket), so no later call can read a reply meant for a call
  cut short; the connection reconnects on its next use.
- ``AsyncScript.sha`` (written) and ``AsyncScript.script``: a script Redis no longer knows is loaded again
  and its new digest kept on the script object, as redis-py's own ``AsyncScript.__call__`` does.
- hiredis's ``pack_command`` in place of redis-py's encoder: the same bytes (at redis-py's default UTF-8
  encoding) for the str, bytes, int and float arguments the store sends, for a fraction of the CPU
  (docs/benchmarks.md); what redis-py's encoder refuses (a bool, a NumPy integer) is refused as its DataError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.exceptions import DataError
from redis.typing import EncodableT


def untimed_connection(pool: aioredis.ConnectionPool) -> AbstractConnection:
    """A new, not yet connected, connection with the pool's current settings and no socket timeout."""
    settings = {**pool.connection_kwargs, "socket_timeout": None}
    if "orig_socket_timeout" in settings:
        settings["orig_socket_timeout"] = None
    return pool.connection_class(**settings)


def must_reconnect(connection: AbstractConnection) -> bool:
    """Whether a maintenance notice asked for this connection to be closed (the pool closes it on release)."""
    return connection.should_reconnect()


async def close_now(connection: AbstractConnection) -> None:
    """Closed at once, without waiting for the server; it reconnects if used again."""
    await connection.disconnect(nowait=True)


async def evalsha(connection: AbstractConnection, sha: str, keys: Sequence[str], args: Sequence[EncodableT]) -> Any:
    """The script's reply; NoScriptError if Redis does not know ``sha`` (it did not run), redis-py's
    ConnectionError or ResponseError as it fails, DataError for an argument redis-py would refuse. Cut short
    by any exception, it leaves the connection disconnected."""
    command = ("EVALSHA", sha, len(keys), *keys, *args)
    try:
        packed = hiredis.pack_command(command)  # type: ignore[arg-type]  # its stub declares a 1-tuple
    except TypeError as error:
        raise DataError(str(error)) from error
    await connection.send_packed_command(packed, check_health=False)
    return await connection.read_response()


async def reload(client: aioredis.Redis, script: AsyncScript) -> str:
    """Loads ``script`` into Redis again and keeps its digest on it (a restart or SCRIPT FLUSH lost it)."""
    script.sha = await client.script_load(script.script)
    return script.sha
