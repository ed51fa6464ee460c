"""The application driven in process (httpx's ASGI transport, the lifespan run as uvicorn runs it) on a
clock the test moves: for tests where a real server adds nothing and waiting for the wall clock would
only make them slow. httpx reports the URL's host as the address the connection arrived on (the ASGI
scope's server), as uvicorn reports the socket's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI

from latebandit.api.app import create_app
from latebandit.config import Settings
from latebandit.timeutil import MICROS, Clock, wall_clock

LOOPBACK = "http://127.0.0.1:8000"


class ManualClock:
    """Epoch microseconds that move only when the test says, from the wall clock's now."""

    def __init__(self) -> None:
        self.now = wall_clock()

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += round(seconds * MICROS)


@asynccontextmanager
async def started(settings: Settings, clock: Clock = wall_clock) -> AsyncIterator[FastAPI]:
    """The app of ``settings`` with its runtime started, and closed afterwards."""
    app = create_app(settings, clock)
    async with app.router.lifespan_context(app):
        yield app


def client(app: FastAPI, base_url: str = LOOPBACK) -> httpx.AsyncClient:
    """A client whose connections arrive on ``base_url``'s host."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url)


@asynccontextmanager
async def served(settings: Settings, clock: Clock = wall_clock) -> AsyncIterator[httpx.AsyncClient]:
    """A loopback client of the app of ``settings``."""
    async with started(settings, clock) as app, client(app) as http:
        yield http
