"""``replay --policy``: estimate what another policy would have earned on a logged campaign's traffic.

The log must make the estimate meaningful. Where the logging policy was deterministic (logged propensity
1) the arms it did not play had probability 0, so nothing in the log says what they would have earned; if
the evaluated policy puts more than ``MAX_UNSUPPORTED`` of its choices there, the evaluation is refused
with that reason (an exploration floor on the campaign is the remedy). A log in which no window has
closed yet has no known reward and is refused too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from pydantic import ValidationError

from latebandit.campaign import Campaign
from latebandit.replay.estimators import (
    ESTIMATORS,
    Estimate,
    LoggedArrays,
    doubly_robust,
    ips,
    mean_interval,
    replay,
)
from latebandit.replay.logged import CampaignLog, NotEvaluable
from latebandit.replay.reenact import reenact

DEFAULT_CLIP = 100.0  # largest importance weight: binds only where a logged propensity is below 1 %
MAX_UNSUPPORTED = 0.01  # share of decisions the evaluated policy may send where the log cannot see
DETERMINISTIC = 1.0 - 1e-12


@dataclass(frozen=True)
class Evaluation:
    policy: str
    label: str  # the name, and the params as given when there are any (two variants of one policy differ)
    primary: Estimate
    estimates: dict[str, Estimate]
    decisions: int  # counted decisions in the log up to its end
    known: int  # of which the reward is known (window closed)
    steps: int  # decisions accepted into the policy's own play
    clipped: float  # share of the known decisions whose importance weight was clipped
    times: np.ndarray  # (decisions,) µs, the decision times (for curves)

    def contract(self) -> dict[str, Any]:
        """The ``--json`` document of docs/reference/cli.md."""
        return {
            "policy": self.policy,
            "estimator": self.primary.estimator,
            "value": self.primary.value,
            "ci95": list(self.primary.ci95),
            "effective_sample_size": self.primary.effective_sample_size,
        }


def target_campaign(logged: Campaign, name: str, params: dict[str, Any]) -> Campaign:
    """The logged campaign (arms, delay model, window, buckets) with the evaluated policy and no floor."""
    body = {**logged.model_dump(), "policy": {"name": name, "params": params}, "exploration_floor": 0.0}
    try:
        campaign = Campaign.model_validate(body)
    except ValidationError as error:
        raise NotEvaluable(f"policy {name!r}: {error.errors()[0]['msg']}") from None
    if not campaign.policy_impl.reports_probabilities:
        raise NotEvaluable(f"policy {name!r} does not report the probability of every arm, which an estimate needs")
    return campaign


def log_arrays(log: CampaignLog) -> LoggedArrays:
    return LoggedArrays(
        arms=np.array([d.arm for d in log.decisions], dtype=np.int64),
        propensity=np.array([d.propensity for d in log.decisions]),
        reward=np.array([np.nan if d.reward is None else d.reward for d in log.decisions]),
    )


def is_uniform(arrays: LoggedArrays, n_arms: int) -> bool:
    return bool(np.allclose(arrays.propensity, 1.0 / n_arms, rtol=1e-9, atol=0.0))


def evaluate(
    log: CampaignLog,
    name: str,
    params: dict[str, Any],
    clip: float = DEFAULT_CLIP,
    estimator: str | None = None,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> Evaluation:
    if estimator is not None and estimator not in ESTIMATORS:
        raise NotEvaluable(f"unknown estimator {estimator!r}; known: {', '.join(ESTIMATORS)}")
    if clip < 1.0:
        raise NotEvaluable(f"clip must be at least 1 (got {clip:g})")
    campaign = target_campaign(log.campaign, name, params)
    if not log.decisions:
        raise NotEvaluable(f"the log holds no counted decision of campaign {log.campaign.id!r}")
    arrays = log_arrays(log)
    known = ~np.isnan(arrays.reward)
    if not known.any():
        raise NotEvaluable(
            f"no decision's window ({log.campaign.window:g} s) closed before the end of the log, so no reward "
            "is known yet: evaluate a log that spans more than the window (or a later --at)"
        )
    played = reenact(log, campaign, clip, np.random.default_rng(seed), progress)
    probabilities = played.probabilities
    chosen = probabilities[np.arange(arrays.arms.size), arrays.arms]
    blind = (arrays.propensity >= DETERMINISTIC) * (1.0 - chosen)
    if blind.mean() > MAX_UNSUPPORTED:
        deterministic = int((arrays.propensity >= DETERMINISTIC).sum())
        raise NotEvaluable(
            f"the logging policy was deterministic (propensity 1) at {deterministic} of {arrays.arms.size} "
            f"decisions, and there {name!r} would have played an arm the log never shows with probability "
            f"{blind.mean():.1%} per decision: what those arms would have earned is not in the log. Log with a "
            "randomised policy or set the campaign's exploration_floor."
        )
    estimates = {
        "replay": replay(arrays, played.accepted),
        "ips": ips(arrays, probabilities, clip),
        "doubly-robust": doubly_robust(arrays, probabilities, clip),
    }
    uniform = not log.arm_changes and is_uniform(arrays, len(campaign.arms))
    chosen_estimator = estimator or ("replay" if uniform else "doubly-robust")
    primary = estimates[chosen_estimator]
    if np.isnan(primary.value):
        raise NotEvaluable(
            f"the {chosen_estimator} estimator kept fewer than two decisions with a known reward "
            f"({int(played.accepted.sum())} accepted of {arrays.arms.size}): the log is too short for {name!r}"
        )
    raw = chosen / arrays.propensity
    return Evaluation(
        policy=name,
        label=f"{name} {orjson.dumps(params).decode()}" if params else name,
        primary=primary,
        estimates=estimates,
        decisions=int(arrays.arms.size),
        known=int(known.sum()),
        steps=int(played.accepted.sum()),
        clipped=float((raw[known] > clip).mean()),
        times=np.array([d.at for d in log.decisions], dtype=np.int64),
    )


def logged_value(log: CampaignLog) -> Estimate:
    """The logging policy's own value (its mean reward): the reference every candidate is compared with."""
    arrays = log_arrays(log)
    value, ci = mean_interval(arrays.reward)
    return Estimate("on-policy", value, ci, float((~np.isnan(arrays.reward)).sum()), arrays.reward)
