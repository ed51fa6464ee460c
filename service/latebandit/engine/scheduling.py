"""Decisions and feedback for the campaigns whose policy plays planned segments (ODAAF, ARS-*, CLW).

The store holds one schedule per campaign (service/latebandit/store/schedule.py). A decision claims the next slot;
the caller names the arm and propensity it expects (the slot's segment is rarely another than the last
one this worker saw), because the decision id it signs carries the arm; when the store answers OTHER_ARM,
the decision is retried with the slot's real arm. When the plan has run out and the next one may be made,
the worker whose claim finds it so (NEEDS_PLAN) plans with the pure policy and commits the plan under
the schedule's version: of several replicas exactly one plan wins (the others' commits change nothing).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from latebandit import metrics
from latebandit.campaign import Campaign
from latebandit.policies.schedule import Observed, Plan, SchedulePolicy
from latebandit.store.base import Counters, Pull, StateStore, StateUnreadable, StoreUnavailable
from latebandit.store.schedule import Claim, ClaimStatus, ScheduleView
from latebandit.timeutil import format_time

MAX_ATTEMPTS = 8  # claims per decision: a slot boundary crossed by every attempt means heavy contention
UNSETTLED = (ClaimStatus.OTHER_ARM, ClaimStatus.NEEDS_PLAN)  # nothing taken: the decision claims again
PullMaker = Callable[[Campaign, int, float, int, str | None], Pull]

logger = logging.getLogger(__name__)


def unclaimed(campaign: Campaign) -> StoreUnavailable:
    """A decision whose claim stayed unsettled through MAX_ATTEMPTS: answered as for a store outage."""
    return StoreUnavailable(f"campaign {campaign.id!r}: no slot could be claimed in {MAX_ATTEMPTS} attempts")


class Scheduler:
    def __init__(self, store: StateStore, rng: np.random.Generator, make_pull: PullMaker) -> None:
        self.store = store
        self.rng = rng
        self.make_pull = make_pull
        self._expected: dict[str, tuple[int, float]] = {}  # campaign: (arm, propensity) of its last slot

    async def claim(self, campaign: Campaign, now: int, request_id: str | None, ttl: int) -> Claim:
        """Claim the next slot for a decision made at ``now`` (plan first if there is none yet)."""
        (claim,) = await self.claim_together(campaign, now, [request_id], ttl)
        if claim.status in UNSETTLED:
            raise unclaimed(campaign)
        return claim

    async def claim_together(
        self, campaign: Campaign, now: int, request_ids: list[str | None], ttl: int
    ) -> list[Claim]:
        """Claim the next slots for decisions made at ``now`` (plan first if there is none yet), in one store
        call per attempt. A decision still answered OTHER_ARM or NEEDS_PLAN after MAX_ATTEMPTS found no slot
        (heavy contention); the others' claims stand, so every decision recorded is answered. So too when the
        schedule cannot be read to make the next plan: the decisions still waiting are answered UNREADABLE
        (nothing taken; the engine falls back for them alone), not by an exception that would also fall back
        for the decisions this batch already recorded."""
        claims: list[Claim] = [Claim(ClaimStatus.NEEDS_PLAN)] * len(request_ids)
        waiting = list(range(len(request_ids)))
        for _ in range(MAX_ATTEMPTS):
            arm, propensity = self._expected.get(campaign.id, (0, 1.0))
            pulls = [self.make_pull(campaign, arm, propensity, now, request_ids[i]) for i in waiting]
            answers = await self.store.claim_slots(campaign, pulls, [request_ids[i] for i in waiting], ttl)
            plan_after = None
            for i, claim in zip(waiting, answers, strict=True):
                claims[i] = claim
                if claim.status is ClaimStatus.OTHER_ARM:
                    self._expected[campaign.id] = (claim.arm, claim.propensity)
                elif claim.status is ClaimStatus.NEEDS_PLAN:
                    plan_after = claim.version
            waiting = [i for i in waiting if claims[i].status in UNSETTLED]
            if not waiting:
                break
            if plan_after is not None:
                try:
                    await self.plan(campaign, now, plan_after)
                except StateUnreadable:
                    for i in waiting:
                        claims[i] = Claim(ClaimStatus.UNREADABLE)
                    break
        return claims

    async def plan(self, campaign: Campaign, now: int, after: int) -> bool:
        """Make and commit the plan that follows version ``after`` (the one the claim found played); False
        if another worker committed it first. Planning from a newer version would skip a plan: a worker
        that asked while there was none must not plan again from the first plan another one committed."""
        policy = campaign.policy_impl
        assert isinstance(policy, SchedulePolicy)
        view = await self.store.schedule_view(campaign)
        if view.version != after:
            return False
        state = view.plan.state if view.plan is not None else None
        closed, played = _seen_by_policy(campaign, view.closed, view.open)
        plan = _named_by_campaign(campaign, policy.plan(state, closed, played, self.rng))
        record = {"type": "campaign", "campaign": campaign.id, "at": now, "action": "plan",
                  "config": {"plan": plan.to_json(), "consumed": len(view.closed)}}  # fmt: skip
        committed = await self.store.commit_plan(campaign, view.version, plan, len(view.closed), record, now)
        if committed:
            metrics.SCHEDULE_PLANS.labels(metrics.campaign_label(campaign.id)).inc()
            logger.info("campaign %s: plan %d committed", campaign.id, view.version + 1)
        return committed


def _seen_by_policy(
    campaign: Campaign, closed: Sequence[Observed], played: Sequence[Observed]
) -> tuple[Sequence[Observed], Sequence[Observed]]:
    """Closed and open segments with their arms named as the policy knows them: it plays the active arms
    alone (Campaign.active_arms). Arms are retired only with a restart, whose fresh schedule holds no other."""
    if not campaign.retired:
        return closed, played
    position = {arm: j for j, arm in enumerate(campaign.active_arms)}

    def renamed(part: Sequence[Observed]) -> list[Observed]:
        return [replace(item, segment=replace(item.segment, arm=position[item.segment.arm])) for item in part]

    return renamed(closed), renamed(played)


def _named_by_campaign(campaign: Campaign, plan: Plan) -> Plan:
    """The policy's plan with its arms named by the campaign's arm indices, as the store keeps and claims them."""
    if not campaign.retired:
        return plan
    arms = campaign.active_arms
    segments = tuple(replace(segment, arm=arms[segment.arm]) for segment in plan.segments)
    return replace(plan, segments=segments, hold=replace(plan.hold, arm=arms[plan.hold.arm]))


def describe_schedule(campaign: Campaign, counters: Counters, view: ScheduleView, as_of: int) -> dict[str, Any]:
    """The state object (docs/reference/) of a planning campaign: per arm the slots (``effective_pulls``) and the
    reward (``reward``, value units; ``conversions`` repeats it: an aggregate has a value, not a count) credited
    to its counted segments, closed ones plus the open ones' sums so far; ``policy_state`` shows the plan, the
    schedule's position and what closed it."""
    slots = np.zeros(len(campaign.arms))
    reward = np.zeros(len(campaign.arms))
    for arm, (closed_slots, closed_reward) in view.credited.items():
        slots[arm] += closed_slots
        reward[arm] += closed_reward
    for item in view.open:
        if item.segment.counted:
            slots[item.segment.arm] += item.slots
            reward[item.segment.arm] += item.reward
    cap = campaign.reward.max
    arms = {
        arm: {
            "pulls": int(counters.pulls[k]),
            "conversions": float(reward[k]),
            "reward": float(reward[k]),
            "effective_pulls": float(slots[k]),
            "estimate": float(reward[k] / slots[k] / cap) if slots[k] > 0 else None,
            "index": None,
            "pending": 0,
        }
        for k, arm in enumerate(campaign.arms)
    }
    for name in campaign.retired:
        arms[name]["retired"] = True
    current = view.current
    state = {
        "status": campaign.status.value,
        "plan_version": view.version,
        "plan": view.plan.to_json() if view.plan is not None else None,
        "slot": view.slot,
        "watermark": format_time(view.watermark) if view.watermark else None,
        "closed_until": format_time(view.closed_until) if view.closed_until else None,
        "open_segments": len(view.open),
        "closed_not_planned": len(view.closed),
        "current_segment": None if current is None else {
            "arm": campaign.arms[current.segment.arm], "kind": current.segment.kind,
            "counted": current.segment.counted, "first_slot": current.first, "started_at": format_time(current.start),
        },
        "slot_seconds": campaign.slot_seconds,
        "allowed_lateness": campaign.allowed_lateness,
    }  # fmt: skip
    return {"campaign": campaign.id, "policy": campaign.policy.name, "decisions": counters.decisions,
            "as_of": format_time(as_of), "arms": arms, "policy_state": state}  # fmt: skip
