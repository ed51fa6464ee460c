"""POST /feedback: conversions and other outcomes of past decisions, in batches. A hot path (HotPaths):
events are validated one by one (a bad event is its own ``rejected`` entry), so the body is parsed by hand
and its schema is declared for the OpenAPI document."""

from __future__ import annotations

import time

import orjson
from fastapi import APIRouter, Request, Response

from latebandit import metrics
from latebandit.api.auth import served_campaigns
from latebandit.api.deps import engine_of
from latebandit.api.errors import error
from latebandit.api.hot_paths import HotRoute, JsonAnswer, read_body
from latebandit.engine.feedback import MAX_EVENTS
from latebandit.logs import name_campaigns

FEEDBACK_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["events"],
                    "properties": {"events": {"type": "array", "maxItems": MAX_EVENTS, "items": {"type": "object"}}},
                }
            }
        },
    }
}
router = APIRouter(route_class=HotRoute)


@router.post("/feedback", openapi_extra=FEEDBACK_SCHEMA)
async def feedback(request: Request) -> Response:
    started = time.perf_counter()
    engine = engine_of(request)
    try:
        body = orjson.loads(await read_body(request))
    except orjson.JSONDecodeError as bad:
        raise error(422, "invalid_request", f"body is not JSON: {bad}") from bad
    if not isinstance(body, dict) or not isinstance(body.get("events"), list):
        raise error(422, "invalid_request", 'the body must be {"events": [...]}')
    if len(body["events"]) > MAX_EVENTS:
        raise error(413, "batch_too_large", f"at most {MAX_EVENTS} events per request")
    result = await engine.feedback(body["events"], served_campaigns(request.scope))
    name_campaigns(request.scope, result.campaigns)
    metrics.FEEDBACK_LATENCY.observe(time.perf_counter() - started)
    return JsonAnswer(result.body())
