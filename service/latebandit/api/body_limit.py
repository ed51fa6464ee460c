"""The request body's size limit, enforced before any route reads it."""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope


class BodyTooLarge(Exception):
    pass


class BodyLimit:
    """Refuse bodies over ``limit`` bytes with a 413, by Content-Length or while streaming. A plain ASGI
    middleware: Starlette's BaseHTTPMiddleware would cost a task per request on the hot paths."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise BodyTooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except BodyTooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        detail = f"bodies are limited to {self.limit} bytes"
        await JSONResponse({"error": "body_too_large", "detail": detail}, 413)(scope, receive, send)
