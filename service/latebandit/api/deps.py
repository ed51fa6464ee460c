"""What a route may ask of the running app, declared once: the runtime the lifespan started, its engine
and its past states, each an ``Annotated`` alias a handler names as a parameter type.

Every dependency is ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in a thread pool, a
thread hop per request. The hot endpoints (hot_paths.py) are called without FastAPI's dependency solver,
so they reach the engine through ``engine_of``, the function its dependency uses too.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from latebandit.api.auth import serves
from latebandit.api.errors import forbidden_campaign
from latebandit.api.past_states import PastStates
from latebandit.engine.core import DecisionEngine
from latebandit.logs import name_campaigns
from latebandit.runtime import Runtime


async def path_campaign(request: Request) -> None:
    """The campaign a route names in its path (every routed request passes here): named in the access line,
    refused to a key that does not serve it, before anything else of the request is looked at."""
    campaign = request.path_params.get("campaign_id")
    if campaign is not None:
        name_campaigns(request.scope, (campaign,))
        if not serves(request.scope, campaign):
            raise forbidden_campaign(campaign)


def engine_of(request: Request) -> DecisionEngine:
    return request.app.state.runtime.engine


async def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


async def get_engine(request: Request) -> DecisionEngine:
    return engine_of(request)


async def get_past_states(request: Request) -> PastStates:
    return request.app.state.past_states


AppRuntime = Annotated[Runtime, Depends(get_runtime)]
Engine = Annotated[DecisionEngine, Depends(get_engine)]
AppPastStates = Annotated[PastStates, Depends(get_past_states)]
