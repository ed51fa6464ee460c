"""API keys with two scopes, ``decide`` and ``admin`` (admin may do everything).

Keys come from ``LATEBANDIT_API_KEYS`` (``scope:key,scope:key``); only their SHA-256 digests are kept in
memory and a presented key is compared against every digest in constant time. With no keys configured the
API is open, and ``serve`` refuses to bind a non-loopback address unless told ``--insecure``.
"""

from __future__ import annotations

import hashlib
import hmac
from enum import StrEnum

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as AsgiScope


class Scope(StrEnum):
    DECIDE = "decide"
    ADMIN = "admin"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class ApiKeys:
    def __init__(self, spec: str | None) -> None:
        self._keys: list[tuple[bytes, Scope]] = []
        for item in filter(None, (part.strip() for part in (spec or "").split(","))):
            scope, separator, key = item.partition(":")
            if not separator or not key or scope not in Scope.__members__.values():
                raise ValueError("LATEBANDIT_API_KEYS must be comma-separated scope:key pairs, scopes decide or admin")
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
        if needed is Scope.ADMIN and scope is not Scope.ADMIN:
            return 403, "forbidden", "this route needs an admin key"
        return None


PUBLIC_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})
DECIDE_PATHS = frozenset({"/choose", "/feedback"})


def required_scope(path: str) -> Scope | None:
    """The scope a path needs: none for probes and metrics, ``decide`` for the hot paths, ``admin`` for the
    rest (campaigns, the API documentation, and unknown paths, which reveal nothing without a key)."""
    if path in PUBLIC_PATHS:
        return None
    return Scope.DECIDE if path in DECIDE_PATHS else Scope.ADMIN


class ApiKeyGate:
    """Checks the key before anything reads the body, so an unauthenticated client learns nothing from
    validation errors; a plain ASGI middleware, cheap on the hot paths."""

    def __init__(self, app: ASGIApp, keys: ApiKeys) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        needed = required_scope(scope["path"]) if scope["type"] == "http" and self.keys.enabled else None
        if needed is not None:
            authorization = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            refusal = self.keys.refusal(authorization, needed)
            if refusal is not None:
                status, code, detail = refusal
                headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
                await JSONResponse({"error": code, "detail": detail}, status, headers)(scope, receive, send)
                return
        await self.app(scope, receive, send)
