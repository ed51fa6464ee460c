"""POST /choose: a campaign's next decision, a hot path (HotPaths)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from latebandit import metrics
from latebandit.api.auth import SERVED_CAMPAIGNS
from latebandit.api.deps import engine_of
from latebandit.api.errors import error, forbidden_campaign, problems
from latebandit.api.hot_paths import HotRoute, JsonAnswer, read_body
from latebandit.campaign import MAX_FEATURES
from latebandit.engine.contextual import MAX_ACTIONS, Offer
from latebandit.ids import Identifier
from latebandit.logs import NAMED_CAMPAIGN

Features = Annotated[list[Annotated[float, Field(allow_inf_nan=False)]], Field(min_length=1, max_length=MAX_FEATURES)]


class OfferedAction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: Identifier
    features: Features


class ChooseRequest(BaseModel):
    """A decision's request; a contextual campaign's also offers ``actions`` (their own features each) or one
    ``context`` (every arm's features)."""

    model_config = ConfigDict(extra="forbid")

    campaign: Identifier
    request_id: Annotated[str, StringConstraints(pattern=r"^[^\x00-\x1f\x7f]{1,256}$")] | None = None
    actions: Annotated[list[OfferedAction], Field(min_length=1, max_length=MAX_ACTIONS)] | None = None
    context: Features | None = None

    def offer(self) -> Offer | None:
        """What the request offers a contextual campaign (Offer.of_request); None for a plain request."""
        actions = None if self.actions is None else [(action.id, action.features) for action in self.actions]
        return Offer.of_request(actions, self.context)


CHOOSE_SCHEMA = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": ChooseRequest.model_json_schema()}}}
}
router = APIRouter(route_class=HotRoute)


@router.post("/choose", openapi_extra=CHOOSE_SCHEMA)
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
    decision = await engine_of(request).choose(body.campaign, body.request_id, body.offer())
    metrics.DECISION_LATENCY.observe(time.perf_counter() - started)
    return JsonAnswer(decision.body())
