"""Structured logs: one JSON object per line, each carrying the id of the HTTP request it belongs to.

An operator joins a client's complaint to the service's lines by the ``X-Request-ID`` header (sent by the
client or a proxy, else generated here and returned), and to a campaign by the access line's ``campaign``.
A request that fails answers a JSON 500 with its id, and its traceback is logged under the same id.
Secrets never reach a log line whole: headers and bodies are not logged, and ``mask`` shortens anything
shaped like a bearer key or a decision id that does reach a message (an exception text, say) to its first
characters.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

import orjson
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)

REQUEST_ID_HEADER = b"x-request-id"
_CLIENT_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,64}$")
KEPT_CHARACTERS = 6
# A decision id (base64url payload, a dot, a 22-character signature) or the key after "Bearer".
_SECRETS = re.compile(r"(?i)(?<=bearer )\S+|[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{22}(?![A-Za-z0-9_-])")
_RECORD_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "color_message"}

# The ASGI scope's entries where a route leaves the (first) campaign its request named, and how many it named
# when that is more than one, for the request's log lines.
NAMED_CAMPAIGN = "latebandit.campaign"
NAMED_COUNT = "latebandit.campaigns"

access = logging.getLogger("latebandit.access")
failures = logging.getLogger("latebandit.errors")


def mask(text: str) -> str:
    """``text`` with every bearer key and decision id cut to its first characters and an ellipsis."""
    return _SECRETS.sub(lambda found: found.group(0)[:KEPT_CHARACTERS] + "…", text)


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message", "request_id"?, ...extra fields}``; exceptions as text."""

    converter = staticmethod(time.gmtime)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": mask(record.getMessage()),
        }
        current = request_id.get()
        if current is not None:
            entry["request_id"] = current
        for key, value in record.__dict__.items():
            if key not in _RECORD_FIELDS and not key.startswith("_"):
                entry[key] = mask(value) if isinstance(value, str) else value
        if record.exc_info:
            entry["exception"] = mask(self.formatException(record.exc_info))
        return orjson.dumps(entry, default=str).decode()


def log_config(level: str) -> dict[str, Any]:
    """The ``logging.config.dictConfig`` of ``serve`` (uvicorn applies it in every worker)."""
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stdout"}
    loggers = {name: {"handlers": ["json"], "level": level.upper(), "propagate": False}
               for name in ("latebandit", "uvicorn", "uvicorn.error")}  # fmt: skip
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"json": handler},
        "loggers": loggers,
    }


def new_request_id() -> str:
    """32 random hex digits (128 random bits, the length of ``uuid4().hex``) without building a UUID, a
    fraction of ``uuid4``'s time on every request."""
    return os.urandom(16).hex()


def name_campaigns(scope: AsgiScope, campaigns: Sequence[str]) -> None:
    """Let the log lines of the request of ``scope`` name ``campaigns`` (in the order the request named
    them): ``campaign`` is the first, and ``campaigns`` counts them when there are several. (/choose sets
    NAMED_CAMPAIGN itself: a call and a tuple are a third of what this costs it.)"""
    if campaigns:
        scope[NAMED_CAMPAIGN] = campaigns[0]
    if len(campaigns) > 1:
        scope[NAMED_COUNT] = len(campaigns)


def with_campaigns(fields: dict[str, Any], scope: AsgiScope) -> dict[str, Any]:
    """``fields`` with the campaigns the request of ``scope`` named."""
    campaign = scope.get(NAMED_CAMPAIGN)
    if campaign is not None:
        fields["campaign"] = campaign
        if NAMED_COUNT in scope:
            fields["campaigns"] = scope[NAMED_COUNT]
    return fields


class RequestLog:
    """Gives each HTTP request its id (the client's ``X-Request-ID`` if well formed, else a new one),
    returns it as a header, and writes one access line: method, path, status, duration, and the campaign
    the route named (``name_campaigns``). A plain ASGI middleware, cheap on the hot paths; the query string
    is left out (it is the client's).

    An exception no handler answered is logged here, with its traceback, while the request's id is still
    current, and answered with a JSON 500 that carries the id (rather than Starlette's text/plain one,
    which is sent outside this middleware: without the id's header or a way to find the traceback)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope["headers"]).get(REQUEST_ID_HEADER, b"")
        current = sent.decode() if _CLIENT_REQUEST_ID.match(sent) else new_request_id()
        token = request_id.set(current)
        started = time.perf_counter()
        status = 0  # until a response starts

        async def tagged(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (REQUEST_ID_HEADER, current.encode())]
            await send(message)

        try:
            await self.app(scope, receive, tagged)
        except Exception:
            failures.exception("%s %s failed", scope["method"], scope["path"], extra=with_campaigns({}, scope))
            if status:
                raise  # the answer has begun: nothing else can be sent, the server closes the connection
            detail = "the service failed to answer this request; its log has the cause under this request_id"
            await JSONResponse({"error": "internal_error", "detail": detail, "request_id": current}, 500)(
                scope, receive, tagged
            )
        finally:
            if access.isEnabledFor(logging.INFO):
                status = status or 500  # no answer started: the server answers 500
                access.info(
                    "%s %s %d", scope["method"], scope["path"], status,
                    extra=with_campaigns({"method": scope["method"], "path": scope["path"], "status": status,
                                          "duration_ms": round((time.perf_counter() - started) * 1000, 3)}, scope),
                )  # fmt: skip
            request_id.reset(token)
