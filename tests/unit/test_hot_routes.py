"""A route is hot by its declaration (issue 33): HotPaths serves the routes of a ``HotRoute`` router, and
only those, straight to their endpoint, and refuses to declare a route it could not serve that way."""

from __future__ import annotations

from typing import Any, cast

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, Response

from latebandit.api.app import ROUTERS
from latebandit.api.hot_paths import ExceptionHandler, HotPaths, HotRoute, hot_endpoints
from latebandit.api.routes import decisions, feedback


def test_the_apps_hot_endpoints_are_those_its_routers_declare() -> None:
    assert hot_endpoints(ROUTERS) == {"/choose": decisions.choose, "/feedback": feedback.feedback}


async def routed_only(request: Request) -> None:
    """An app-wide dependency: FastAPI's solver runs it, HotPaths does not."""
    raise HTTPException(418, "routed")


async def test_a_hot_route_is_served_past_the_router_and_a_plain_one_through_it() -> None:
    hot, plain = APIRouter(route_class=HotRoute), APIRouter()

    @hot.post("/hot")
    async def answer_hot(request: Request) -> Response:
        return Response(b"hot")

    @plain.post("/plain")
    async def answer_plain(request: Request) -> Response:
        return Response(b"plain")

    app = FastAPI(dependencies=[Depends(routed_only)])
    for router in (hot, plain):
        app.include_router(router)
    handlers = cast(dict[Any, ExceptionHandler], app.exception_handlers)
    app.add_middleware(HotPaths, endpoints=hot_endpoints((hot, plain)), handlers=handlers)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        assert (await http.post("/hot")).content == b"hot"
        assert (await http.post("/plain")).status_code == 418
        assert (await http.get("/hot")).status_code == 405  # other methods still meet the routed path


async def takes_more(request: Request, campaign: str) -> Response:
    return Response()


async def takes_the_request(request: Request) -> Response:
    return Response()


@pytest.mark.parametrize(
    ("endpoint", "methods"),
    [(takes_the_request, ["GET"]), (takes_the_request, ["POST", "PUT"]), (takes_more, ["POST"])],
)
def test_a_route_hot_paths_could_not_serve_is_refused_at_its_declaration(endpoint: Any, methods: list[str]) -> None:
    with pytest.raises(TypeError, match="a hot route is a POST whose endpoint takes only the request"):
        HotRoute("/x", endpoint, methods=methods)
