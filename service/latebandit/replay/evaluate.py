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
from latebandit.policies.linear import CONTEXTUAL_POLICIES
from latebandit.replay.estimators import (
    ESTIMATORS,
    Estimate,
    LoggedArrays,
    doubly_robust,
    ips,
    mean_interval,
    replay,
    snips,
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
    # a contextual evaluation's: the policy's choice at each decision (an index among its offered actions,
    # or an arm), from which a check knows what it would have earned
    choices: np.ndarray | None = None

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
    if name in CONTEXTUAL_POLICIES:
        raise NotEvaluable(
            f"policy {name!r} is contextual, and campaign {logged.id!r} is not: its log has no features to choose among"
        )
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


def check_options(clip: float, estimator: str | None, known: tuple[str, ...]) -> None:
    """NotEvaluable for options no evaluation takes, before any work."""
    if estimator is not None and estimator not in known:
        raise NotEvaluable(f"unknown estimator {estimator!r}; known: {', '.join(known)}")
    if clip < 1.0:
        raise NotEvaluable(f"clip must be at least 1 (got {clip:g})")


def rewarded_arrays(log: CampaignLog) -> LoggedArrays:
    """The log's arrays; NotEvaluable for a log with no decision or none whose reward is known yet."""
    if not log.decisions:
        raise NotEvaluable(f"the log holds no counted decision of campaign {log.campaign.id!r}")
    arrays = log_arrays(log)
    if np.isnan(arrays.reward).all():
        raise NotEvaluable(
            f"no decision's window ({log.campaign.window:g} s) closed before the end of the log, so no reward "
            "is known yet: evaluate a log that spans more than the window (or a later --at)"
        )
    return arrays


def require_support(arrays: LoggedArrays, chosen: np.ndarray, name: str, remedy: str) -> None:
    """NotEvaluable where the logging policy was deterministic and the evaluated one (probability ``chosen``
    of each logged choice) would too often have chosen otherwise: the log never shows what that earns."""
    blind = (arrays.propensity >= DETERMINISTIC) * (1.0 - chosen)
    if blind.mean() > MAX_UNSUPPORTED:
        deterministic = int((arrays.propensity >= DETERMINISTIC).sum())
        raise NotEvaluable(
            f"the logging policy was deterministic (propensity 1) at {deterministic} of {arrays.arms.size} "
            f"decisions, and there {name!r} would have chosen otherwise with probability {blind.mean():.1%} per "
            f"decision: what that would have earned is not in the log. {remedy}"
        )


def conclude(
    log: CampaignLog, name: str, params: dict[str, Any], arrays: LoggedArrays, chosen: np.ndarray,
    accepted: np.ndarray, estimates: dict[str, Estimate], estimator: str, clip: float,
    choices: np.ndarray | None = None,
) -> Evaluation:  # fmt: skip
    """The Evaluation with ``estimator`` primary (``chosen``: the evaluated policy's probability of each
    logged choice); NotEvaluable when that estimator kept too few decisions."""
    primary = estimates[estimator]
    if np.isnan(primary.value):
        raise NotEvaluable(
            f"the {estimator} estimator kept fewer than two decisions with a known reward "
            f"({int(accepted.sum())} accepted of {arrays.arms.size}): the log is too short for {name!r}"
        )
    known = ~np.isnan(arrays.reward)
    raw = chosen / arrays.propensity
    return Evaluation(
        policy=name,
        label=f"{name} {orjson.dumps(params).decode()}" if params else name,
        primary=primary,
        estimates=estimates,
        decisions=int(arrays.arms.size),
        known=int(known.sum()),
        steps=int(accepted.sum()),
        clipped=float((raw[known] > clip).mean()),
        times=np.array([d.at for d in log.decisions], dtype=np.int64),
        choices=choices,
    )


def evaluate(
    log: CampaignLog,
    name: str,
    params: dict[str, Any],
    clip: float = DEFAULT_CLIP,
    estimator: str | None = None,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> Evaluation:
    check_options(clip, estimator, ESTIMATORS)
    campaign = target_campaign(log.campaign, name, params)
    arrays = rewarded_arrays(log)
    played = reenact(log, campaign, clip, np.random.default_rng(seed), progress)
    probabilities = played.probabilities
    chosen = probabilities[np.arange(arrays.arms.size), arrays.arms]
    require_support(arrays, chosen, name, "Log with a randomised policy or set the campaign's exploration_floor.")
    estimates = {
        "replay": replay(arrays, played.accepted),
        "ips": ips(arrays, probabilities, clip),
        "snips": snips(arrays, probabilities, clip),
        "doubly-robust": doubly_robust(arrays, probabilities, clip),
    }
    uniform = not log.arm_changes and is_uniform(arrays, len(campaign.arms))
    primary = estimator or ("replay" if uniform else "doubly-robust")
    return conclude(log, name, params, arrays, chosen, played.accepted, estimates, primary, clip)


def logged_value(log: CampaignLog) -> Estimate:
    """The logging policy's own value (its mean reward): the reference every candidate is compared with."""
    arrays = log_arrays(log)
    value, ci = mean_interval(arrays.reward)
    return Estimate("on-policy", value, ci, float((~np.isnan(arrays.reward)).sum()), arrays.reward)
