"""The FastAPI application: routes of docs/reference/http-api.md over the decision engine.

The routes live in ``routes/``, one router per resource; their dependencies in ``deps.py``; their error
answers in ``errors.py``. Bodies of /choose and /feedback are decoded with orjson and answered with
pre-serialised JSON: they are the hot paths (``hot_paths.py``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

from fastapi import Depends, FastAPI
from fastapi.telemetry import TelemetryConfig
from threadpoolctl import threadpool_limits

from latebandit import metrics
from latebandit.api.auth import ApiKeyGate, ApiKeys
from latebandit.api.body_limit import BodyLimit
from latebandit.api.deps import path_campaign
from latebandit.api.errors import add_error_handlers
from latebandit.api.hot_paths import ExceptionHandler, HotPaths, hot_endpoints
from latebandit.api.past_states import PastStates
from latebandit.api.routes import campaigns, decisions, feedback, operations
from latebandit.config import Settings
from latebandit.engine.feedback import Reason
from latebandit.logs import RequestLog
from latebandit.runtime import Runtime
from latebandit.timeutil import Clock, wall_clock

MAX_BODY_BYTES = 16 * 1024 * 1024
NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
ROUTERS = (campaigns.router, decisions.router, feedback.router, operations.router)
log = logging.getLogger("latebandit")


def create_app(settings: Settings | None = None, clock: Clock = wall_clock) -> FastAPI:
    """The application of ``settings`` (default: the environment's), deciding and receiving feedback at
    ``clock``'s times (a test's own clock runs the app in process without waiting for the wall clock).
    Refuses unsafe settings here, where every way of serving it passes, `latebandit serve` or uvicorn
    directly (UnsafeSettings)."""
    settings = settings or Settings()
    for warning in settings.check():
        log.warning(warning)
    keys = ApiKeys(settings.api_key_entries())
    metrics.caps.campaigns, metrics.caps.arms = settings.metrics_campaigns, settings.metrics_arms
    metrics.preset(reason.value for reason in Reason)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # One BLAS thread: a worker is one event loop on one core, and BLAS's own threads only fight it and
        # Redis for the cores. Measured at 32 concurrent contextual requests (d = 50), a read's Σ AAᵀ took 20 ms
        # with two and under 1 ms with one, and the worker's decisions/s rose from 2,800 to 4,400.
        threadpool_limits(limits=1, user_api="blas")
        runtime = Runtime.build(settings, clock)
        await runtime.start()
        app.state.runtime = runtime
        app.state.past_states = PastStates(runtime)
        try:
            yield
        finally:
            await runtime.close()

    # No OpenTelemetry: operators get Prometheus metrics, and FastAPI's check for a configured provider
    # reads the environment on every request (4 % of a /choose under load).
    app = FastAPI(
        title="latebandit",
        version="0.1.0",
        lifespan=lifespan,
        telemetry=NO_TELEMETRY,
        dependencies=[Depends(path_campaign)],
    )
    for router in ROUTERS:
        app.include_router(router)
    add_error_handlers(app)
    # Middleware, innermost first. FastAPI's registry also admits sync handlers; every one registered
    # (errors.py, and FastAPI's defaults) is async.
    handlers = cast(dict[Any, ExceptionHandler], app.exception_handlers)
    app.add_middleware(HotPaths, endpoints=hot_endpoints(ROUTERS), handlers=handlers)
    app.add_middleware(ApiKeyGate, keys=keys, insecure=settings.insecure, metrics_access=settings.metrics_access)
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    app.add_middleware(RequestLog)  # outermost: refusals by the key gate and the body limit are logged too
    return app
