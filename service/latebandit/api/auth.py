"""API keys with three scopes, ``decide``, ``metrics`` and ``admin`` (admin may do everything).

Keys come from ``LATEBANDIT_API_KEYS`` (``scope:key,scope:key``); only their SHA-256 digests are kept in
memory and a presented key is compared against every digest in constant time.

With no keys configured the API is open, but only to connections that arrived over loopback (or a Unix
socket) unless told ``insecure``: checked per connection, so an app served by uvicorn directly on a public
address is as closed as one behind ``serve``, which also refuses to start on such a host. ``/metrics`` needs
a ``metrics`` (or admin) key as LATEBANDIT_METRICS_ACCESS says: not over loopback (the default), always
(``key``), or never (``open``).
"""

from __future__ import annotations

import hashlib
import hmac
from enum import StrEnum

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as AsgiScope

from latebandit.config import is_loopback


class Scope(StrEnum):
    DECIDE = "decide"
    METRICS = "metrics"
    ADMIN = "admin"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class ApiKeys:
    def __init__(self, spec: str | None) -> None:
        self._keys: list[tuple[bytes, Scope]] = []
        for item in filter(None, (part.strip() for part in (spec or "").split(","))):
            scope, separator, key = item.partition(":")
            if not separator or not key or scope not in Scope.__members__.values():
                raise ValueError(
                    "LATEBANDIT_API_KEYS must be comma-separated scope:key pairs, scopes decide, metrics or admin"
                )
            if any(digest == _digest(key) for digest, _ in self._keys):
                raise ValueError("LATEBANDIT_API_KEYS lists the same key twice: give each scope its own key")
            self._keys.append((_digest(key), Scope(scope)))

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def scope_of(self, key: str) -> Scope | None:
        presented = _digest(key)
        found = None
        for digest, scope in self._keys:  # no early exit: the time taken does not depend on which key matched
            if hmac.compare_digest(presented, digest):
                found = scope
        return found

    def refusal(self, authorization: str, needed: Scope) -> tuple[int, str, str] | None:
        """(status, error code, detail) when the Authorization header does not grant ``needed``."""
        kind, _, key = authorization.partition(" ")
        scope = self.scope_of(key.strip()) if kind.lower() == "bearer" and key else None
        if scope is None:
            return 401, "unauthorized", "send a valid API key as 'Authorization: Bearer <key>'"
        if scope is not needed and scope is not Scope.ADMIN:
            wanted = "an admin key" if needed is Scope.ADMIN else f"a {needed} or admin key"
            return 403, "forbidden", f"this route needs {wanted}"
        return None


PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})
METRICS_PATH = "/metrics"
DECIDE_PATHS = frozenset({"/choose", "/feedback"})


def required_scope(path: str) -> Scope | None:
    """The scope a path needs: none for probes, ``metrics`` for the metrics (unless LATEBANDIT_METRICS_ACCESS
    waives it), ``decide`` for the hot paths, ``admin`` for the rest (campaigns, the API documentation, and
    unknown paths, which reveal nothing without a key)."""
    if path in PUBLIC_PATHS:
        return None
    if path == METRICS_PATH:
        return Scope.METRICS
    return Scope.DECIDE if path in DECIDE_PATHS else Scope.ADMIN


def over_loopback(scope: AsgiScope) -> bool:
    """Whether the connection arrived on a loopback address of this host (the server's end of it: a client
    cannot choose it); a Unix socket, which has none, is local too."""
    server = scope.get("server")
    return server is None or is_loopback(server[0])


class ApiKeyGate:
    """Checks the key before anything reads the body, so an unauthenticated client learns nothing from
    validation errors; a plain ASGI middleware, cheap on the hot paths."""

    def __init__(self, app: ASGIApp, keys: ApiKeys, insecure: bool, metrics_access: str) -> None:
        self.app = app
        self.keys = keys
        self.insecure = insecure
        self.metrics_access = metrics_access

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        refusal = self.refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, code, detail = refusal
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        await JSONResponse({"error": code, "detail": detail}, status, headers)(scope, receive, send)

    def refusal(self, scope: AsgiScope) -> tuple[int, str, str] | None:
        if not self.keys.enabled:
            if self.insecure or over_loopback(scope):
                return None
            return 403, "loopback_only", "this service has no API keys, so it answers only over loopback"
        needed = required_scope(scope["path"])
        if needed is None or (needed is Scope.METRICS and self.metrics_waived(scope)):
            return None
        authorization = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        return self.keys.refusal(authorization, needed)

    def metrics_waived(self, scope: AsgiScope) -> bool:
        return self.metrics_access == "open" or (self.metrics_access == "loopback" and over_loopback(scope))
