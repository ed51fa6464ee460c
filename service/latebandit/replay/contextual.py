"""``replay --policy`` on a contextual campaign's log: what a linear policy (policies/linear.py) would have
earned on the logged requests, delays re-enacted.

The log must say what each request offered: an actions campaign logs it only with ``log_actions`` (each
decision's ``actions``, ids and features); a context campaign's decision carries its context (``features``).
The evaluated policy replays the log in time order. At each logged decision it chooses, with the injected
generator, among the logged actions (``choose_actions``) or among the arms active then with the logged context
(``choose_arm``; arms added and retired as the log's ``arms`` lines say), from its own statistics; where it
agrees with the log the decision is accepted with probability 1/(M·μ) (rejection sampling, M = min(clip, max
1/μ); on a uniform log of K actions, M = K and every agreement is accepted: the replay of Li et al. 2011). An
accepted decision enters its statistics as the service would record it: the same MemoryStore and LinearStats
view as /choose (engine/contextual.py), the chosen features added to V with the policy's own footprint, and
each of its conversions added to b once the service had received it (``received_at``), counted only within the
window.

Its probability of the logged choice is the agreement itself (0 or 1, one draw), so w_k = 1{agree}/μ_k is
an unbiased importance weight: ``ips`` and ``snips`` average it over every decision whose reward is known,
``replay`` the rewards of the accepted ones (estimators.py). A reward model per action would need a model
of the features, so there is no doubly-robust estimate here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from latebandit.campaign import Campaign
from latebandit.engine.contextual import matured_cells, policy_stats
from latebandit.policies import POLICIES
from latebandit.policies.linear import CONTEXTUAL_POLICIES, ContextualPolicy, LinearStats, make_contextual_policy
from latebandit.replay.estimators import LoggedArrays, ips, replay, snips
from latebandit.replay.evaluate import (
    DEFAULT_CLIP,
    Evaluation,
    check_options,
    conclude,
    require_support,
    rewarded_arrays,
)
from latebandit.replay.logged import (
    CampaignLog,
    LoggedDecision,
    LogLines,
    NotEvaluable,
    logged_decision,
    read_lines,
)
from latebandit.replay.reenact import PROGRESS_EVERY, History

ESTIMATORS = ("replay", "ips", "snips")
CONTEXTUAL_NAMES = f"{', '.join(CONTEXTUAL_POLICIES)} or uniform"


@dataclass(frozen=True)
class LoggedOffer:
    vectors: np.ndarray  # (K, d) the actions offered, or (1, d) a context campaign's context
    chosen: int  # the logged choice: its index among the actions, or its arm


@dataclass(frozen=True)
class ContextualLog:
    log: CampaignLog  # its decisions' arm is their model block: 0 on an actions campaign, else the arm
    offers: list[LoggedOffer]  # one per decision, in the same order


def read_contextual_log(lines: Iterable[dict[str, Any]], campaign_id: str | None, at: int | None) -> ContextualLog:
    """The contextual campaign's decisions with what each offered, up to ``at`` (default: the log's end)."""
    read = read_lines(lines, campaign_id, at)
    campaign = read.campaign
    if not campaign.contextual:
        raise NotEvaluable(
            f"campaign {campaign.id!r} is not contextual: its decisions carry no features, so evaluate a policy "
            "over its arms"
        )
    unlogged = sum(1 for _, line in read.decisions if campaign.offers == "actions" and "actions" not in line)
    if unlogged:
        raise NotEvaluable(
            f"{unlogged} of {len(read.decisions)} decisions of campaign {campaign.id!r} do not log the actions "
            "their request offered, which an evaluation chooses among: set log_actions on the campaign"
        )
    arm_index = read.arm_index()
    paired = sorted((_pair(campaign, arm_index, moment, line, read) for moment, line in read.decisions),
                    key=lambda p: p[0].at)  # fmt: skip
    log = CampaignLog(campaign, [decision for decision, _ in paired], read.end, read.skipped, read.arm_changes)
    return ContextualLog(log, [offer for _, offer in paired])


def _pair(
    campaign: Campaign, arm_index: dict[str, int], moment: int, line: dict[str, Any], read: LogLines
) -> tuple[LoggedDecision, LoggedOffer]:
    """The logged decision (its arm: its model block, by ``arm_index`` of every arm the campaign had by the
    log's end) and its offer; NotEvaluable for one that does not fit."""
    name = f"decision {line['decision_id'][:40]!r}"
    if campaign.offers == "actions":
        actions = line["actions"] if isinstance(line["actions"], list) else []
        if not actions or not all(isinstance(action, dict) for action in actions):
            raise NotEvaluable(f"{name} logs its actions as something else than a list of {{id, features}}")
        ids = [action.get("id") for action in actions]
        if line["arm"] not in ids:
            raise NotEvaluable(f"{name} chose {line['arm']!r}, which is not among the actions it logs")
        block, chosen, rows = 0, ids.index(line["arm"]), [action.get("features") for action in line["actions"]]
    else:
        if line["arm"] not in arm_index:
            raise NotEvaluable(f"{name} names an unknown arm {line['arm']!r}")
        block = chosen = arm_index[line["arm"]]
        rows = [line.get("features")]
    try:
        vectors = np.array(rows, dtype=np.float64)
    except (TypeError, ValueError):
        vectors = np.empty(0)
    if vectors.ndim != 2 or vectors.shape[1] != campaign.features or not np.isfinite(vectors).all():
        raise NotEvaluable(f"{name} logs no features of dimension {campaign.features} for what it offered")
    return logged_decision(campaign, block, line, moment, read), LoggedOffer(vectors, chosen)


@dataclass(frozen=True)
class Replayed:
    choices: np.ndarray  # (n,) the policy's choice at each decision
    accepted: np.ndarray  # (n,) bool: the decision entered its statistics (one step of its own play)


def evaluate_contextual(
    log: ContextualLog,
    name: str,
    params: dict[str, Any],
    clip: float = DEFAULT_CLIP,
    estimator: str | None = None,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> Evaluation:
    """``evaluate`` for a contextual log: the primary estimator is ``replay`` on a uniformly logged campaign
    (every propensity 1/K), else ``snips``."""
    if estimator == "doubly-robust":
        raise NotEvaluable(f"doubly-robust needs a reward model per arm; a contextual log has {', '.join(ESTIMATORS)}")
    check_options(clip, estimator, ESTIMATORS)
    campaign = log.log.campaign
    if name in POLICIES and name != "uniform":
        raise NotEvaluable(f"campaign {campaign.id!r} is contextual and policy {name!r} is not: evaluate "
                           f"{CONTEXTUAL_NAMES}")  # fmt: skip
    try:
        policy = make_contextual_policy(name, params)
    except ValueError as error:
        raise NotEvaluable(str(error)) from None
    if policy.needs_window_gram or policy.needs_window_actions:
        raise NotEvaluable(
            f"policy {name!r}: correction {policy.params()['correction']!r} is the simulator's, which the service "
            "does not keep the sums of"
        )
    arrays = rewarded_arrays(log.log)
    played = replay_offers(log, policy, clip, np.random.default_rng(seed), progress)
    agreed = (played.choices == np.array([offer.chosen for offer in log.offers])).astype(np.float64)
    require_support(arrays, agreed, name, "Log with a randomised policy (otf-lints).")
    # Each decision's one column: the policy's probability of the logged choice (the agreement).
    single = LoggedArrays(np.zeros(arrays.arms.size, dtype=np.int64), arrays.propensity, arrays.reward)
    estimates = {
        "replay": replay(single, played.accepted),
        "ips": ips(single, agreed[:, None], clip),
        "snips": snips(single, agreed[:, None], clip),
    }
    sizes = np.array([len(campaign.arms) if campaign.offers == "context" else len(o.vectors) for o in log.offers])
    uniform = not log.log.arm_changes and bool(np.allclose(arrays.propensity * sizes, 1.0, rtol=1e-9, atol=0.0))
    primary = estimator or ("replay" if uniform else "snips")
    return conclude(
        log.log, name, params, arrays, agreed, played.accepted, estimates, primary, clip, choices=played.choices
    )


def replay_offers(
    log: ContextualLog,
    policy: ContextualPolicy,
    clip: float,
    rng: np.random.Generator,
    progress: Callable[[int], None] | None = None,
) -> Replayed:
    """One pass over the log for ``policy``; ``progress`` is told how many more decisions were done, every
    PROGRESS_EVERY."""
    return asyncio.run(_replay(log, policy, clip, rng, progress))


async def _replay(
    log: ContextualLog,
    policy: ContextualPolicy,
    clip: float,
    rng: np.random.Generator,
    progress: Callable[[int], None] | None,
) -> Replayed:
    campaign, decisions = log.log.campaign, log.log.decisions
    history = History(campaign, at_receipt=True)
    await history.start()
    bound = min(clip, max(1.0 / d.propensity for d in decisions))
    accept_draws = rng.random(len(decisions))
    choices = np.zeros(len(decisions), dtype=np.int64)
    accepted = np.zeros(len(decisions), dtype=bool)
    changes = list(reversed(log.log.arm_changes))
    for k, (decision, offer) in enumerate(zip(decisions, log.offers, strict=True)):
        await history.advance(decision.at)
        while changes and changes[-1].at <= decision.at:
            await history.change_arms(changes.pop())
        stats = await _statistics(history)
        if campaign.offers == "actions":
            choice = policy.choose_actions(stats, offer.vectors[None], rng)
            choices[k], features = int(choice.action[0]), offer.vectors[offer.chosen]
        else:  # among the arms active then: the policy's rows (policy_stats)
            choice = policy.choose_arm(stats, offer.vectors[0], rng)
            choices[k], features = history.campaign.active_arms[int(choice.action[0])], offer.vectors[0]
        if choices[k] == offer.chosen and accept_draws[k] < 1.0 / (bound * decision.propensity):
            accepted[k] = True
            pull = replace(history.pull(decision), features=features, footprint=float(choice.footprint[0]))
            await history.record(pull, decision)
        if progress is not None and (k + 1) % PROGRESS_EVERY == 0:
            progress(PROGRESS_EVERY)
    return Replayed(choices, accepted)


async def _statistics(history: History) -> LinearStats:
    """What /choose shows the policy now (engine/core.py): the window's cells read, the matured ones folded."""
    snapshot = await history.store.snapshot(history.campaign)
    matured = matured_cells(history.campaign, snapshot, history.now)
    if matured.any():
        hist = snapshot.histogram
        await history.store.fold_matured(history.campaign, hist.arm[matured], hist.bucket[matured])
    return policy_stats(history.campaign, snapshot, history.now)
