"""Every error the API answers, as one body shape: ``{"error": code, "detail": text}``.

The handlers are registered on the app, and the hot paths look them up in the same registry, so a
/choose or /feedback that fails answers exactly as a routed request would.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from latebandit import metrics
from latebandit.engine.contextual import OfferInvalid
from latebandit.engine.directory import CampaignArchived, UnknownCampaign
from latebandit.engine.feedback import not_served
from latebandit.store.base import StateUnreadable, StoreUnavailable


def problems(errors: Sequence[Any]) -> str:
    """Validation errors as one line: ``field: message; field: message``."""
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc'] if part != 'body') or 'body'}: {item['msg']}" for item in errors
    )


def error(status_code: int, code: str, detail: str) -> HTTPException:
    return HTTPException(status_code, detail={"error": code, "detail": detail})


def forbidden_campaign(campaign: str) -> HTTPException:
    return error(403, "forbidden_campaign", not_served(campaign))


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    body = {"error": "invalid_request", "detail": problems(exc.errors())}
    return JSONResponse(body, status.HTTP_422_UNPROCESSABLE_CONTENT)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Every error body is {"error": code, "detail": text}, including Starlette's own 404 and 405."""
    if isinstance(exc.detail, dict):
        body = exc.detail
    else:
        body = {"error": HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_"), "detail": str(exc.detail)}
    return JSONResponse(body, exc.status_code, headers=exc.headers)


async def unknown_campaign(request: Request, exc: UnknownCampaign) -> JSONResponse:
    return JSONResponse({"error": "unknown_campaign", "detail": f"no campaign {exc.args[0]!r}"}, 404)


async def campaign_archived(request: Request, exc: CampaignArchived) -> JSONResponse:
    detail = (f"campaign {exc.campaign_id!r} is archived: it makes no decisions and takes no changes "
              "(GET /campaigns/{id} has its archive time; GET /campaigns/{id}/state?at= its past states)")  # fmt: skip
    return JSONResponse({"error": "campaign_archived", "detail": detail}, 410)


async def offer_invalid(request: Request, exc: OfferInvalid) -> JSONResponse:
    """A /choose whose actions or context do not fit its campaign: nothing was decided or recorded."""
    return JSONResponse({"error": "invalid_request", "detail": str(exc)}, status.HTTP_422_UNPROCESSABLE_CONTENT)


async def store_down(request: Request, exc: StoreUnavailable) -> JSONResponse:
    metrics.STORE_ERRORS.labels(request.url.path.strip("/").split("/")[0] or "root").inc()
    return JSONResponse({"error": "store_unavailable", "detail": str(exc)}, 503, headers={"Retry-After": "1"})


async def state_unreadable(request: Request, exc: StateUnreadable) -> JSONResponse:
    """GET /state of a campaign whose stored state cannot be read (its decisions fall back meanwhile)."""
    detail = (f"{exc}; its decisions answer its default arm until the state is rebuilt from the audit log "
              f"(`latebandit rebuild --campaign {exc.campaign_id}`) or its policy is changed")  # fmt: skip
    return JSONResponse({"error": "state_unreadable", "detail": detail}, 503)


HANDLERS: dict[type[Exception], Callable[[Request, Any], Awaitable[Response]]] = {
    RequestValidationError: invalid_request,
    StarletteHTTPException: http_error,
    UnknownCampaign: unknown_campaign,
    CampaignArchived: campaign_archived,
    OfferInvalid: offer_invalid,
    StoreUnavailable: store_down,
    StateUnreadable: state_unreadable,
}


def add_error_handlers(app: FastAPI) -> None:
    for kind, handler in HANDLERS.items():
        app.add_exception_handler(kind, handler)
