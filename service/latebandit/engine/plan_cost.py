"""What one guha-bayes plan costs, measured: ``latebandit plan`` solves a campaign's plan as the service
would at creation (every arm at its prior) and reports the solve's time, memory and states."""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import numpy as np

from latebandit.campaign import Campaign, CampaignSpec
from latebandit.policies import ArmStats
from latebandit.policies.guha import GuhaBayes


def measure_plan(spec: CampaignSpec) -> dict[str, Any]:
    """Solve the plan of a guha-bayes campaign body; ValueError if it is not one. Peak memory is what
    tracemalloc sees allocated (NumPy reports its buffers to it) during the solve."""
    campaign = Campaign(**spec.model_dump())
    policy = campaign.policy_impl
    if not isinstance(policy, GuhaBayes):
        raise ValueError(f"policy {campaign.policy.name!r} precomputes nothing; `plan` is for guha-bayes")
    arms = len(campaign.arms)
    fresh = ArmStats(np.zeros((1, arms)), np.zeros((1, arms)), np.zeros((1, arms)), np.ones(1))
    tracemalloc.start()
    started = time.perf_counter()
    try:
        planned = policy.prepare(fresh)
        seconds = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    plan = planned.plan
    assert plan is not None
    return {
        "campaign": campaign.id, "params": policy.params(), "seconds": seconds, "peak_memory_bytes": peak,
        "states": plan.cost.states, "table_bytes": plan.cost.table_bytes, "working_bytes": plan.cost.working_bytes,
        "operations_per_multiplier": plan.cost.work, "dp_sweeps": plan.cost.solves, "multiplier": plan.multiplier,
        "mix": plan.mix, "lp_bound": plan.bound, "dual": plan.dual, "order": [campaign.arms[i] for i in plan.order],
        "expected_plays": dict(zip(campaign.arms, plan.plays.tolist(), strict=True)),
    }  # fmt: skip
