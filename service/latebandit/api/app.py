"""The FastAPI application: routes of docs/reference/http-api.md over the decision engine.

Bodies of /choose and /feedback are decoded with orjson and answered with pre-serialised JSON: they are
the hot paths. /feedback validates events one by one (a bad event is its own ``rejected`` entry), so its
body is parsed by hand and its schema is declared for the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Annotated, Any, cast

import orjson
from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.telemetry import TelemetryConfig
from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope

from latebandit import metrics
from latebandit.api.auth import SERVED_CAMPAIGNS, ApiKeyGate, ApiKeys, served_campaigns, serves
from latebandit.api.hot_paths import Endpoint, ExceptionHandler, HotPaths, JsonAnswer, read_body
from latebandit.api.past_states import CampaignNotYet, PastStates
from latebandit.campaign import CampaignSpec, CampaignStatus, PolicyChange
from latebandit.config import Settings
from latebandit.engine.core import CampaignExists, DecisionEngine
from latebandit.engine.directory import UnknownCampaign
from latebandit.engine.feedback import MAX_EVENTS, Reason, not_served
from latebandit.ids import Identifier
from latebandit.logs import NAMED_CAMPAIGN, RequestLog, name_campaigns
from latebandit.runtime import Runtime
from latebandit.store.base import CampaignMoved, StateUnreadable, StoreUnavailable
from latebandit.timeutil import Clock, parse_time, wall_clock

MAX_BODY_BYTES = 16 * 1024 * 1024
NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
log = logging.getLogger("latebandit")
admin_log = logging.getLogger("latebandit.admin")
readiness_log = logging.getLogger("latebandit.readiness")


class ChooseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    campaign: Identifier
    request_id: Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f\x7f]{1,256}$")] | None = None


CHOOSE_SCHEMA = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": ChooseRequest.model_json_schema()}}}
}
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


def problems(errors: Sequence[Any]) -> str:
    """Validation errors as one line: ``field: message; field: message``."""
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc'] if part != 'body') or 'body'}: {item['msg']}" for item in errors
    )


def error(status_code: int, code: str, detail: str) -> HTTPException:
    return HTTPException(status_code, detail={"error": code, "detail": detail})


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


def forbidden_campaign(campaign: str) -> HTTPException:
    return error(403, "forbidden_campaign", not_served(campaign))


# ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in a thread pool, a thread hop per request.
async def path_campaign(request: Request) -> None:
    """The campaign a route names in its path (every routed request passes here): named in the access line,
    refused to a key that does not serve it, before anything else of the request is looked at."""
    campaign = request.path_params.get("campaign_id")
    if campaign is not None:
        name_campaigns(request.scope, (campaign,))
        if not serves(request.scope, campaign):
            raise forbidden_campaign(campaign)


async def get_engine(request: Request) -> DecisionEngine:
    return request.app.state.runtime.engine


Engine = Annotated[DecisionEngine, Depends(get_engine)]


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
    hot_paths: dict[str, Endpoint] = {}  # filled below, once the routes are defined
    # FastAPI's registry also admits sync handlers; every one registered here (below, and FastAPI's defaults) is async.
    handlers = cast(dict[Any, ExceptionHandler], app.exception_handlers)
    app.add_middleware(HotPaths, endpoints=hot_paths, handlers=handlers)  # innermost
    app.add_middleware(ApiKeyGate, keys=keys, insecure=settings.insecure, metrics_access=settings.metrics_access)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        body = {"error": "invalid_request", "detail": problems(exc.errors())}
        return JSONResponse(body, status.HTTP_422_UNPROCESSABLE_CONTENT)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Every error body is {"error": code, "detail": text}, including Starlette's own 404 and 405."""
        if isinstance(exc.detail, dict):
            body = exc.detail
        else:
            body = {"error": HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_"), "detail": str(exc.detail)}
        return JSONResponse(body, exc.status_code, headers=exc.headers)

    @app.exception_handler(UnknownCampaign)
    async def unknown_campaign(request: Request, exc: UnknownCampaign) -> JSONResponse:
        return JSONResponse({"error": "unknown_campaign", "detail": f"no campaign {exc.args[0]!r}"}, 404)

    @app.exception_handler(StoreUnavailable)
    async def store_down(request: Request, exc: StoreUnavailable) -> JSONResponse:
        metrics.STORE_ERRORS.labels(request.url.path.strip("/").split("/")[0] or "root").inc()
        return JSONResponse({"error": "store_unavailable", "detail": str(exc)}, 503, headers={"Retry-After": "1"})

    @app.exception_handler(StateUnreadable)
    async def state_unreadable(request: Request, exc: StateUnreadable) -> JSONResponse:
        """GET /state of a campaign whose stored state cannot be read (its decisions fall back meanwhile)."""
        detail = (f"{exc}; its decisions answer its default arm until the state is rebuilt from the audit log "
                  f"(`latebandit rebuild --campaign {exc.campaign_id}`) or its policy is changed")  # fmt: skip
        return JSONResponse({"error": "state_unreadable", "detail": detail}, 503)

    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    app.add_middleware(RequestLog)  # outermost: refusals by the key gate and the body limit are logged too

    # campaigns ------------------------------------------------------------------------------------

    @app.post("/campaigns", status_code=201)
    async def create_campaign(spec: CampaignSpec, engine: Engine, request: Request) -> Response:
        name_campaigns(request.scope, (spec.id,))
        if not serves(request.scope, spec.id):
            raise forbidden_campaign(spec.id)
        try:
            campaign = await engine.create_campaign(spec)
        except CampaignExists as exists:
            campaign_id, why = exists.args
            raise error(409, "campaign_exists", f"campaign {campaign_id!r} cannot be created: {why}") from exists
        admin_log.info("campaign created", extra={"campaign": campaign.id, "policy": campaign.policy.name})
        return JsonAnswer(campaign.public(), 201)

    @app.get("/campaigns")
    async def list_campaigns(engine: Engine, request: Request) -> Response:
        campaigns = await engine.store.list_campaigns()
        served = served_campaigns(request.scope)
        return JsonAnswer({"campaigns": campaigns if served is None else list(filter(served, campaigns))})

    @app.get("/campaigns/{campaign_id}")
    async def get_campaign(campaign_id: Identifier, engine: Engine) -> Response:
        return JsonAnswer((await engine.campaign(campaign_id, fresh=True)).public())

    @app.get("/campaigns/{campaign_id}/state")
    async def get_state(
        campaign_id: Identifier, engine: Engine, request: Request, at: Annotated[str | None, Query()] = None
    ) -> Response:
        if at is None:
            return JsonAnswer(await engine.state(campaign_id))
        try:
            moment = parse_time(at)
        except ValueError as bad:
            raise error(422, "invalid_request", f"at: {bad}") from bad
        if moment >= engine.clock():
            return JsonAnswer(await engine.state(campaign_id, moment))
        await engine.campaign(campaign_id, fresh=True)
        try:
            return JsonAnswer(await request.app.state.past_states.state(campaign_id, moment))
        except CampaignNotYet as missing:
            raise error(404, "unknown_campaign", f"campaign {campaign_id!r} did not exist at that time") from missing

    @app.post("/campaigns/{campaign_id}/pause")
    async def pause(campaign_id: Identifier, engine: Engine) -> Response:
        campaign = await engine.set_status(campaign_id, CampaignStatus.PAUSED)
        admin_log.info("campaign paused", extra={"campaign": campaign_id})
        return JsonAnswer(campaign.public())

    @app.post("/campaigns/{campaign_id}/resume")
    async def resume(campaign_id: Identifier, engine: Engine) -> Response:
        campaign = await engine.set_status(campaign_id, CampaignStatus.ACTIVE)
        admin_log.info("campaign resumed", extra={"campaign": campaign_id})
        return JsonAnswer(campaign.public())

    @app.post("/campaigns/{campaign_id}/policy")
    async def change_policy(campaign_id: Identifier, change: PolicyChange, engine: Engine) -> Response:
        """The campaign's next policy version: a fresh state under the new policy, the old version's history
        kept in the audit log (GET /state?at= a time before the change still shows it)."""
        try:
            campaign = await engine.change_policy(campaign_id, change)
        except ValidationError as invalid:
            raise error(422, "invalid_request", problems(invalid.errors())) from invalid
        except CampaignMoved as moved:
            raise error(409, "policy_changed", "another policy change happened meanwhile: read and retry") from moved
        admin_log.info("campaign policy changed", extra={"campaign": campaign_id, "policy": campaign.policy.name,
                                                        "version": campaign.version})  # fmt: skip
        return JsonAnswer(campaign.public())

    # decisions and feedback -----------------------------------------------------------------------

    @app.post("/choose", openapi_extra=CHOOSE_SCHEMA)
    async def choose(request: Request) -> Response:
        """The body is validated straight from bytes (pydantic-core), without FastAPI's body and dependency
        machinery: this is the hottest path."""
        started = time.perf_counter()
        try:
            body = ChooseRequest.model_validate_json(await read_body(request))
        except ValidationError as invalid:
            raise error(422, "invalid_request", problems(invalid.errors())) from invalid
        scope = request.scope  # name_campaigns and serves, inlined on the hottest path
        scope[NAMED_CAMPAIGN] = body.campaign
        served = scope.get(SERVED_CAMPAIGNS)
        if served is not None and not served(body.campaign):
            raise forbidden_campaign(body.campaign)
        decision = await request.app.state.runtime.engine.choose(body.campaign, body.request_id)
        metrics.DECISION_LATENCY.observe(time.perf_counter() - started)
        return JsonAnswer(decision.body())

    @app.post("/feedback", openapi_extra=FEEDBACK_SCHEMA)
    async def feedback(request: Request) -> Response:
        started = time.perf_counter()
        engine: DecisionEngine = request.app.state.runtime.engine
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

    hot_paths.update({"/choose": choose, "/feedback": feedback})

    # operations -----------------------------------------------------------------------------------

    @app.get("/metrics")
    async def prometheus(engine: Engine) -> Response:
        await asyncio.to_thread(engine.publish_diagnostics)
        payload, content_type = metrics.exposition()
        return Response(payload, media_type=content_type)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> Response:
        """Each dependency "ok" or "unavailable", never why: the route is public, and a driver's message can
        name hosts, users and databases. The cause goes to the log."""
        runtime: Runtime = request.app.state.runtime
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

    return app
