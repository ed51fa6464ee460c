"""POST /choose and POST /feedback straight to their handlers.

Measured under load (docs/benchmarks.md), FastAPI's router, dependency solver and exception middleware
cost more per /choose than the decision itself. This ASGI layer sits inside the key gate, the body limit
and the request log (so every guarantee of those holds) and hands the two hot routes their Request
directly. Their exceptions go to the handlers the app registered, looked up as Starlette does, so every
answer, error or not, is the one the routed path gives. A route is hot by its declaration, a HotRoute in
its router, and stays routed on the app too, which is what documents it in the OpenAPI schema and answers
its other methods (405). The endpoints read their body and write their answer with the two helpers below,
past Starlette's per-request layers.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import orjson
from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]
ExceptionHandler = Callable[[Request, Exception], Awaitable[Response]]


class HotRoute(APIRoute):
    """A route HotPaths serves directly (``APIRouter(route_class=HotRoute)``): a POST whose endpoint takes
    the Request alone, since nothing else is solved for it there."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        if self.methods != {"POST"} or len(inspect.signature(endpoint).parameters) != 1:
            raise TypeError(f"{path}: a hot route is a POST whose endpoint takes only the request")


def hot_endpoints(routers: Iterable[APIRouter]) -> dict[str, Endpoint]:
    """The endpoints of ``routers``' hot routes, by their declared path: under a prefix, a hot route would be
    served through the router instead (the same answers, at the routed cost)."""
    return {route.path: route.endpoint for router in routers for route in router.routes if isinstance(route, HotRoute)}


class HotPaths:
    def __init__(
        self, app: ASGIApp, endpoints: Mapping[str, Endpoint], handlers: Mapping[type, ExceptionHandler]
    ) -> None:
        self.app = app
        self.endpoints = endpoints
        self.handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.endpoints.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await endpoint(request)
        except Exception as error:
            handler = self._handler(error)
            if handler is None:
                raise
            response = await handler(request, error)
        await response(scope, receive, send)

    def _handler(self, error: Exception) -> ExceptionHandler | None:
        """The registered handler of the nearest class of ``error`` (Starlette's lookup)."""
        for kind in type(error).__mro__:
            if kind in self.handlers:
                return self.handlers[kind]
        return None


async def read_body(request: Request) -> bytes:
    """The request's body, as ``Request.body`` reads it (the chunks of its ``http.request`` messages; a
    client that disconnects first raises ClientDisconnect), without its stream's async generator, a layer
    every hot request would pay (docs/benchmarks.md). Read once: unlike
    ``Request.body`` it keeps no copy, and the endpoint is the body's only reader."""
    chunks = []
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        if message["type"] == "http.request":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)


class JsonAnswer(Response):
    """An answer of ``content`` as JSON, as the campaign, decision, feedback and readiness routes answer (the
    error handlers, /metrics and /healthz answer through Starlette): the headers Starlette's ``Response``
    sends for it (the same bytes, in the same order, for a status that has a body), set directly rather than
    assembled per request."""

    media_type = "application/json"

    def __init__(self, content: Any, status_code: int = 200) -> None:
        self.body = orjson.dumps(content)
        self.status_code = status_code
        self.background = None
        self.raw_headers = [(b"content-length", str(len(self.body)).encode()), (b"content-type", b"application/json")]
