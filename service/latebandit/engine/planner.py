"""Precomputed plans for the policies that need one (guha-bayes), solved off the request path.

Each API worker keeps, per campaign, the planned copy of the campaign's policy (tables of a few MB, see
docs/design-notes.md). /choose never solves: it asks ``policy_for``, which answers at once with the planned
policy, or, while the first plan is being solved, with the unplanned one (whose rule is the plan's own
fallback: the arm of highest posterior mean). A solve runs in a worker thread, started by the decision
that finds the plan missing or due (its rolling window half used, or no arm wanting a play a delay after it
started: ``GuhaBayes.replan_due``, docs/design-notes.md), and it is re-rooted at the
campaign's posteriors at that moment. Its cost (seconds, states, memory) goes to the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from latebandit import metrics
from latebandit.campaign import Campaign
from latebandit.policies import ArmStats, Policy
from latebandit.policies.guha import GuhaBayes

log = logging.getLogger("latebandit")


class Planner:
    def __init__(self) -> None:
        self._ready: dict[str, tuple[int, GuhaBayes]] = {}  # campaign → (campaign version, planned policy)
        self._solving: dict[str, asyncio.Task[None]] = {}

    def policy_for(self, campaign: Campaign, stats: ArmStats) -> Policy:
        """The policy to decide with now; starts a solve in the background when the plan is missing or due."""
        unplanned = campaign.policy_impl
        if not self.solves_for(campaign):
            return unplanned
        entry = self._ready.get(campaign.id)
        current = entry[1] if entry is not None and entry[0] == campaign.version else None
        if current is None or current.replan_due(stats):
            self._start(campaign, stats)
        if current is None:
            metrics.PLAN_PENDING_DECISIONS.labels(metrics.campaign_label(campaign.id)).inc()
            return unplanned
        return current

    @staticmethod
    def solves_for(campaign: Campaign) -> bool:
        """Whether the campaign's policy decides from a plan solved here."""
        return isinstance(campaign.policy_impl, GuhaBayes)

    def planned(self, campaign: Campaign) -> GuhaBayes | None:
        entry = self._ready.get(campaign.id)
        return entry[1] if entry is not None and entry[0] == campaign.version else None

    def _start(self, campaign: Campaign, stats: ArmStats) -> None:
        running = self._solving.get(campaign.id)
        if running is not None and not running.done():
            return
        # the thread's own copy: Store.snapshot promises its arrays are never modified once returned, and the
        # solve, which outlives the request, need not rest on that promise
        frozen = ArmStats(
            *(np.array(part, copy=True) for part in (stats.pulls, stats.conversions, stats.effective, stats.t))
        )
        self._solving[campaign.id] = asyncio.get_running_loop().create_task(self._solve(campaign, frozen))

    async def _solve(self, campaign: Campaign, stats: ArmStats) -> None:
        label = metrics.campaign_label(campaign.id)
        unplanned = campaign.policy_impl
        assert isinstance(unplanned, GuhaBayes)
        started = time.perf_counter()
        try:
            planned = await asyncio.to_thread(unplanned.prepare, stats)
        except Exception:  # a failed solve leaves the previous plan (or the fallback rule) in charge
            metrics.PLANS.labels(label, "error").inc()
            log.exception("plan solve failed for campaign %s", campaign.id)
            return
        metrics.PLAN_SECONDS.labels(label).set(time.perf_counter() - started)
        assert planned.plan is not None  # prepare always solves one
        cost = planned.plan.cost
        metrics.PLAN_STATES.labels(label).set(cost.states)
        metrics.PLAN_BYTES.labels(label, "tables").set(cost.table_bytes)
        metrics.PLAN_BYTES.labels(label, "working").set(cost.working_bytes)
        metrics.PLANS.labels(label, "ok").inc()
        self._ready[campaign.id] = (campaign.version, planned)

    def forget(self, campaign_id: str) -> None:
        """Drop a campaign's plan (it decides no more); a solve still running ends unused."""
        self._ready.pop(campaign_id, None)
        running = self._solving.pop(campaign_id, None)
        if running is not None:
            running.cancel()

    async def wait(self, campaign_id: str) -> None:
        """Until the campaign's running solve (if any) is over; for tests and graceful shutdown."""
        running = self._solving.get(campaign_id)
        if running is not None:
            await running

    async def close(self) -> None:
        for task in self._solving.values():
            task.cancel()
