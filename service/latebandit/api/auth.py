"""API keys with three scopes, ``decide``, ``metrics`` and ``admin`` (admin may do everything).

Keys come from ``LATEBANDIT_API_KEYS`` (``scope:key,scope:key``); only their SHA-256 digests are kept in
memory and a presented key is compared against every digest in constant time. A key may serve only some
campaigns (``decide@summer-*:key``): the gate leaves its glob in the request's scope, and each route that
names a campaign asks ``serves`` once it knows which (a /choose only once it has read its body).

With no keys configured the API is open, but only to connections that arrived over loopback (or a Unix
socket) unless told ``insecure``: checked per connection, so an app served by uvicorn directly on a public
address is as closed as one behind ``serve``, which also refuses to start on such a host. ``/metrics`` needs
a ``metrics`` (or admin) key as LATEBANDIT_METRICS_ACCESS says: not over loopback (the default), always
(``key``), or never (``open``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
from collections.abc import Iterable
from typing import NamedTuple

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as AsgiScope

from latebandit.config import KeyEntry, Scope, is_loopback


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class CampaignGlob:
    """The campaigns a restricted key serves: the ids its glob matches (fnmatch's ``*``, ``?`` and ``[...]``,
    case-sensitive), compiled once. Each answer is kept per campaign id, so a /choose pays a dict lookup
    rather than a regular expression; the memo is emptied when full, since the ids are the clients'."""

    MEMO_SIZE = 4096

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._match = re.compile(fnmatch.translate(pattern)).match
        self._memo: dict[str, bool] = {}

    def __call__(self, campaign: str) -> bool:
        served = self._memo.get(campaign)
        if served is None:
            if len(self._memo) >= self.MEMO_SIZE:
                self._memo.clear()
            served = self._memo[campaign] = self._match(campaign) is not None
        return served


class Grant(NamedTuple):
    """What a key may do: the routes of its scope, for the campaigns of its glob (None: every campaign)."""

    scope: Scope
    campaigns: CampaignGlob | None


def parse_grant(grant: str) -> Grant:
    """``decide`` or ``decide@summer-*`` (ValueError for anything else)."""
    scope, at, pattern = grant.partition("@")
    if scope not in Scope.__members__.values() or (at and not pattern):
        raise ValueError(
            "LATEBANDIT_API_KEYS must be comma-separated scope:key or scope@campaign-glob:key entries, "
            "scopes decide, metrics or admin"
        )
    return Grant(Scope(scope), CampaignGlob(pattern) if at else None)


class ApiKeys:
    def __init__(self, entries: Iterable[KeyEntry]) -> None:
        self._keys: list[tuple[bytes, Grant]] = []
        for grant, key in entries:
            parsed = parse_grant(grant)
            if not key:
                raise ValueError("LATEBANDIT_API_KEYS has an entry without a key: entries are scope:key")
            if any(digest == _digest(key) for digest, _ in self._keys):
                raise ValueError("LATEBANDIT_API_KEYS lists the same key twice: give each scope its own key")
            self._keys.append((_digest(key), parsed))

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def grant_of(self, authorization: str) -> Grant | None:
        """The grant of the key an Authorization header carries as a bearer, None if it carries no known key."""
        kind, _, key = authorization.partition(" ")
        if kind.lower() != "bearer" or not key.strip():
            return None
        presented = _digest(key.strip())
        found = None
        for digest, grant in self._keys:  # no early exit: the time taken does not depend on which key matched
            if hmac.compare_digest(presented, digest):
                found = grant
        return found


def refusal(grant: Grant | None, needed: Scope) -> tuple[int, str, str] | None:
    """(status, error code, detail) when ``grant`` does not open a route that needs ``needed``."""
    if grant is None:
        return 401, "unauthorized", "send a valid API key as 'Authorization: Bearer <key>'"
    if grant.scope is not needed and grant.scope is not Scope.ADMIN:
        wanted = "an admin key" if needed is Scope.ADMIN else f"a {needed} or admin key"
        return 403, "forbidden", f"this route needs {wanted}"
    if needed is Scope.METRICS and grant.campaigns is not None:
        return 403, "forbidden", "/metrics shows every campaign: this key serves only some"
    return None


# The ASGI scope's entry where the key gate leaves the campaigns a restricted key serves.
SERVED_CAMPAIGNS = "latebandit.served_campaigns"


def served_campaigns(scope: AsgiScope) -> CampaignGlob | None:
    """The campaigns the request's key serves, None when it serves every campaign."""
    return scope.get(SERVED_CAMPAIGNS)


def serves(scope: AsgiScope, campaign: str) -> bool:
    campaigns = served_campaigns(scope)
    return campaigns is None or campaigns(campaign)


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
        grant = self.keys.grant_of(authorization)
        if grant is not None and grant.campaigns is not None:
            scope[SERVED_CAMPAIGNS] = grant.campaigns
        return refusal(grant, needed)

    def metrics_waived(self, scope: AsgiScope) -> bool:
        return self.metrics_access == "open" or (self.metrics_access == "loopback" and over_loopback(scope))
