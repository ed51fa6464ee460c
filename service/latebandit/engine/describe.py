"""The state a campaign's policy sees and shows: the statistics a decision reads, and the
``state`` object. One code for ``GET /state``, the metrics and a replay's ``--dump-state``, so that a replay
of the log and the live service describe the same state the same way."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from latebandit.campaign import Campaign
from latebandit.delays.tail import delay_summary
from latebandit.engine.contextual import model_state
from latebandit.engine.exposure import Exposure, campaign_stats, exposure
from latebandit.policies.base import EPS_N, ArmStats
from latebandit.store.base import StateSnapshot
from latebandit.timeutil import MICROS, format_time


def arm_stats(state: StateSnapshot, seen: Exposure) -> ArmStats:
    """The statistics for a decision. Pulls counted since the histogram read are missing from W; each adds
    at most ψ <= 1, so they are added at weight 1 and W stays an upper bound (docs/design-notes.md)."""
    weight = seen.tail_weight
    if weight is not None:
        weight = weight + np.maximum(state.counters.pulls - seen.pulls_seen, 0)
    return campaign_stats(state, seen.effective, seen.delay_exposure, weight, seen.pending, seen.reward_max)


def describe_state(campaign: Campaign, state: StateSnapshot, as_of: int) -> dict[str, Any]:
    """The ``state`` object (docs/reference/), computed the same way for the live service and for replays. Each
    arm also carries ``delays``, what its observed conversion delays say (service/latebandit/delays/tail.py). A
    contextual campaign has its ``model`` in place of arms (engine/contextual.py)."""
    if campaign.contextual:
        return {
            "campaign": campaign.id, "policy": campaign.policy.name, "decisions": int(state.counters.decisions),
            "as_of": format_time(as_of), "model": model_state(campaign, state, as_of),
            "policy_state": {"status": campaign.status.value, "window": campaign.window,
                             "bucket_width": campaign.bucket_width_us / MICROS},
        }  # fmt: skip
    seen = exposure(campaign, state, as_of)
    arms = arm_rows(campaign, state, seen)
    for arm, summary in delay_rows(campaign, state, seen).items():
        arms[arm]["delays"] = summary
    return {
        "campaign": campaign.id,
        "policy": campaign.policy.name,
        "decisions": int(state.counters.decisions),
        "as_of": format_time(as_of),
        "arms": arms,
        "policy_state": {
            "status": campaign.status.value,
            "window": campaign.window,
            "bucket_width": campaign.bucket_width_us / MICROS,
            **campaign.policy_impl.policy_state(campaign.on_active_arms(arm_stats(state, seen))),
        },
    }


def diagnostic_rows(campaign: Campaign, state: StateSnapshot, seen: Exposure) -> dict[str, dict[str, Any]]:
    """``arm_rows`` plus each arm's pending age, for the per-arm gauges."""
    rows = arm_rows(campaign, state, seen)
    for row, age in zip(rows.values(), seen.pending_age.tolist(), strict=True):
        row["pending_age"] = _number(age)
    return rows


def delay_rows(campaign: Campaign, state: StateSnapshot, seen: Exposure) -> dict[str, dict[str, Any]]:
    """Per arm, what the observed delays say, weighted by how many pulls could have shown each delay."""
    counts = state.delay_counts()
    return {arm: delay_summary(counts[k], seen.delay_exposure[k]) for k, arm in enumerate(campaign.arms)}


def arm_rows(campaign: Campaign, state: StateSnapshot, seen: Exposure) -> dict[str, dict[str, Any]]:
    """Per arm: pulls, conversions (how many counted), reward (their credited total, value units), effective
    pulls, estimate (value units per decision), index (the policy's, on rewards scaled to [0, 1], for t =
    decisions + 1), pending. A retired arm keeps its statistics, read by the policy as if it were still
    played, has no index (it is ranked no more) and shows ``"retired": true``."""
    counters = state.counters
    stats = arm_stats(state, seen)
    every = campaign.policy_on_every_arm
    effective = every.effective_pulls(stats)[0]
    estimate = every.estimate(stats)[0] * campaign.reward.max
    index = np.full(len(campaign.arms), np.nan)
    index[list(campaign.active_arms)] = campaign.policy_impl.index(campaign.on_active_arms(stats))[0]
    arms: dict[str, Any] = {}
    for k, arm in enumerate(campaign.arms):
        defined = effective[k] > EPS_N
        arms[arm] = {
            "pulls": int(counters.pulls[k]),
            "conversions": int(counters.counted[k]),
            "reward": _integral(counters.conversions[k]),
            "effective_pulls": float(effective[k]),
            "estimate": _number(estimate[k]) if defined else None,
            "index": _number(index[k]) if defined else None,
            "pending": int(seen.pending[k]),
        }
    for arm in campaign.retired:
        arms[arm]["retired"] = True
    return arms


def _number(value: float) -> float | None:
    return None if not math.isfinite(value) else float(value)


def _integral(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)
