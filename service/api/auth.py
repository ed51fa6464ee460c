"""API keys with two scopes, ``decide`` and ``admin`` (admin may do everything).

Keys come from ``LATEBANDIT_API_KEYS`` (``scope:key,scope:key``); only their SHA-256 digests are kept in
memory and a presented key is compared against every digest in constant time. With no keys configured the
API is open, and ``serve`` refuses to bind a non-loopback address unless told ``--insecure``.
"""

from __future__ import annotations

import hashlib
import hmac
from enum import StrEnum

from fastapi import HTTPException, Request, status


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

    def check(self, request: Request, needed: Scope) -> None:
        if not self.enabled:
            return
        header = request.headers.get("authorization", "")
        kind, _, key = header.partition(" ")
        scope = self.scope_of(key.strip()) if kind.lower() == "bearer" and key else None
        if scope is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                detail={"error": "unauthorized", "detail": "send a valid API key as 'Authorization: Bearer <key>'"},
                headers={"WWW-Authenticate": "Bearer"},
            )
        if needed is Scope.ADMIN and scope is not Scope.ADMIN:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, detail={"error": "forbidden", "detail": "this route needs an admin key"}
            )
