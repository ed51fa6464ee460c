"""The campaigns: created, listed, read, paused and resumed, their policy changed, arms added and retired,
archived, their state read now or as it was at a past moment."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from pydantic import ValidationError

from latebandit.api.auth import served_campaigns, serves
from latebandit.api.deps import AppPastStates, Engine
from latebandit.api.errors import error, forbidden_campaign, problems
from latebandit.api.hot_paths import JsonAnswer
from latebandit.api.past_states import CampaignNotYet
from latebandit.campaign import ArmAdded, ArmsRefused, Campaign, CampaignSpec, CampaignStatus, PolicyChange
from latebandit.engine.core import CampaignExists, DecisionEngine
from latebandit.ids import Identifier
from latebandit.logs import name_campaigns
from latebandit.store.base import CampaignMoved
from latebandit.timeutil import format_time, parse_time

admin_log = logging.getLogger("latebandit.admin")
router = APIRouter()


@router.post("/campaigns", status_code=201)
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


@router.get("/campaigns")
async def list_campaigns(engine: Engine, request: Request, archived: Annotated[bool, Query()] = False) -> Response:
    """The live campaigns' ids, or with ``?archived=true`` the archived ones'."""
    campaigns = await (engine.store.list_archived() if archived else engine.store.list_campaigns())
    served = served_campaigns(request.scope)
    return JsonAnswer({"campaigns": campaigns if served is None else list(filter(served, campaigns))})


@router.get("/campaigns/{campaign_id}")
async def get_campaign(campaign_id: Identifier, engine: Engine) -> Response:
    return JsonAnswer((await engine.campaign(campaign_id, fresh=True)).public())


@router.get("/campaigns/{campaign_id}/state")
async def get_state(
    campaign_id: Identifier, engine: Engine, past_states: AppPastStates, at: Annotated[str | None, Query()] = None
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
        return JsonAnswer(await past_states.state(campaign_id, moment))
    except CampaignNotYet as missing:
        raise error(404, "unknown_campaign", f"campaign {campaign_id!r} did not exist at that time") from missing


@router.post("/campaigns/{campaign_id}/pause")
async def pause(campaign_id: Identifier, engine: Engine) -> Response:
    campaign = await engine.set_status(campaign_id, CampaignStatus.PAUSED)
    admin_log.info("campaign paused", extra={"campaign": campaign_id})
    return JsonAnswer(campaign.public())


@router.post("/campaigns/{campaign_id}/resume")
async def resume(campaign_id: Identifier, engine: Engine) -> Response:
    campaign = await engine.set_status(campaign_id, CampaignStatus.ACTIVE)
    admin_log.info("campaign resumed", extra={"campaign": campaign_id})
    return JsonAnswer(campaign.public())


@router.delete("/campaigns/{campaign_id}")
async def archive(campaign_id: Identifier, engine: Engine) -> Response:
    """Archive the campaign; a repeated DELETE answers the first archive again (same ``archived_at``)."""
    campaign = await engine.archive(campaign_id)
    assert campaign.archived_at is not None and campaign.feedback_until is not None
    admin_log.info("campaign archived", extra={"campaign": campaign_id})
    body = {"campaign": campaign.id, "archived_at": format_time(campaign.archived_at),
            "feedback_until": format_time(campaign.feedback_until)}  # fmt: skip
    return JsonAnswer(body)


@router.post("/campaigns/{campaign_id}/policy")
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


Restart = Annotated[
    bool, Query(description="start a new policy version with the new arms (a fresh state, as a policy change)")
]


@router.post("/campaigns/{campaign_id}/arms", status_code=201)
async def add_arm(campaign_id: Identifier, body: ArmAdded, engine: Engine, restart: Restart = False) -> Response:
    """A new arm, with no pulls and no conversions, that the policy plays from its next decision on."""
    campaign = await _change_arms(engine, campaign_id, [body.arm], [], restart)
    return JsonAnswer(campaign.public(), 201)


@router.delete("/campaigns/{campaign_id}/arms/{arm}")
async def retire_arm(campaign_id: Identifier, arm: Identifier, engine: Engine, restart: Restart = False) -> Response:
    """The arm is never chosen again; its statistics stay, and its earlier decisions' conversions count."""
    return JsonAnswer((await _change_arms(engine, campaign_id, [], [arm], restart)).public())


async def _change_arms(
    engine: DecisionEngine, campaign_id: str, added: list[str], retired: list[str], restart: bool
) -> Campaign:
    try:
        campaign = await engine.change_arms(campaign_id, added, retired, restart)
    except ArmsRefused as refused:
        raise error(404 if refused.code == "unknown_arm" else 409, refused.code, refused.detail) from refused
    except CampaignMoved as moved:
        raise error(409, "campaign_changed", "another change of the campaign happened meanwhile: retry") from moved
    admin_log.info("campaign arms changed", extra={"campaign": campaign_id, "added": added, "retired": retired,
                                                  "version": campaign.version})  # fmt: skip
    return campaign
