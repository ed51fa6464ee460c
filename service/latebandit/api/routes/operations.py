"""What operators ask of a worker: liveness, readiness and its Prometheus metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import APIRouter, Response

from latebandit import metrics
from latebandit.api.deps import AppRuntime, Engine
from latebandit.api.hot_paths import JsonAnswer
from latebandit.store.base import StoreUnavailable

readiness_log = logging.getLogger("latebandit.readiness")
router = APIRouter()


@router.get("/metrics")
async def prometheus(engine: Engine) -> Response:
    await asyncio.to_thread(engine.publish_diagnostics)
    archived: list[str] = []
    if metrics.multiprocess_mode():  # other workers' series of a campaign archived anywhere are in the files
        with contextlib.suppress(StoreUnavailable):  # then those this worker archived are still left out
            archived = await engine.store.list_archived()
    payload, content_type = metrics.exposition(archived)
    return Response(payload, media_type=content_type)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(runtime: AppRuntime) -> Response:
    """Each dependency "ok" or "unavailable", never why: the route is public, and a driver's message can
    name hosts, users and databases. The cause goes to the log."""
    checks: dict[str, str] = {}
    try:
        await runtime.store.ping()
        checks["store"] = "ok"
    except StoreUnavailable as down:
        checks["store"] = "unavailable"
        readiness_log.warning("not ready: the state store: %s", down)
    try:
        await asyncio.to_thread(runtime.audit.ping)
        checks["audit"] = "ok"
    except Exception as down:  # any database error means "not ready"
        checks["audit"] = "unavailable"
        readiness_log.warning("not ready: the audit database: %s", down)
    ready = all(value == "ok" for value in checks.values())
    return JsonAnswer({"ready": ready, "checks": checks}, 200 if ready else 503)
