"""The application driven in process (httpx's ASGI transport, the lifespan run as uvicorn runs it) on a
clock the test moves: for tests where a real server adds nothing and waiting for the wall clock would
only make them slow. httpx reports the URL's host as the address the connection arrived on (the ASGI
scope's server), as uvicorn reports the socket's."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
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


STORE_KINDS = ["memory", *(pytest.param(name, marks=pytest.mark.redis) for name in ("redis", "cluster"))]


def store_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The Settings fields of the store a fixture parametrized "memory", "redis" or "cluster" stands for: none
    (the embedded store), the test's Redis with its own prefix, or the session's Redis Cluster with a prefix of
    the test's own (its keys go with the cluster)."""
    if request.param == "redis":
        return {
            "redis_url": request.getfixturevalue("redis_url"),
            "redis_prefix": request.getfixturevalue("redis_prefix"),
        }
    if request.param == "cluster":
        return {"redis_url": request.getfixturevalue("redis_cluster_url"), "redis_cluster": True,
                "redis_prefix": f"lb{uuid.uuid4().hex[:12]}"}  # fmt: skip
    return {}
