"""Contextual decisions: how /choose picks among feature vectors (policies/linear.py) on a campaign with
``features``.

A request offers its own actions (``offers: "actions"``: one parameter θ shared by every action) or one
context for the campaign's arms (``offers: "context"``: a parameter per arm, the context in that arm's
block; arms are added and retired as on any campaign). Either way the policy reads LinearStats with one row
per model block it may choose (``policy_stats``: a retired arm's row left out), built from what the store
keeps for every campaign plus the model's sums:
- Σ AAᵀ and b = Σ (value/max)·A per block (``StateSnapshot.model``), the decisions per block (the counters'
  pulls);
- the window, per block: the decisions inside it (the histogram's cells younger than the window, as Ñ reads
  them) and the sum of their footprints (each decision's number frozen when it was made, kept per cell).
The policy decides from its model of those stats (policies/linear.py ``PreparedModel``: for an index, θ̂,
V⁻¹ and the width's coefficient per block), prepared once per state version and kept (``PreparedModels``),
so that a request computes only its own actions' products. Decisions grouped into one store call are chosen
in turn, each seeing the ones before it (``with_decision``: a deterministic index on identical contexts
would otherwise pick one arm for the whole group).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from latebandit.campaign import Campaign
from latebandit.policies.linear import FRESH_EVERY, LinearStats, PreparedModel
from latebandit.store.base import LinearSums, Pull, StateSnapshot, StateVersion

MAX_ACTIONS = 1_000
NORM_LIMIT = 1.0 + 1e-9  # the largest ‖a‖ taken: the width's scale assumes ‖a‖ <= 1 (docs/algorithms/linear.md)


class OfferInvalid(ValueError):
    """A /choose body whose actions or context do not fit the campaign: a 422 naming ``field``."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field


@dataclass(frozen=True)
class Offer:
    """What a /choose request offers a contextual campaign: its actions' features (K, d) with their ids, or a
    context (1, d) with no ids."""

    vectors: np.ndarray
    labels: tuple[str, ...] | None

    @classmethod
    def of_request(cls, actions: list[tuple[str, list[float]]] | None, context: list[float] | None) -> Offer | None:
        """The request's offer (None when it offers nothing); OfferInvalid for both forms at once, or for
        actions whose ids repeat."""
        if actions is not None and context is not None:
            raise OfferInvalid("actions", "give either actions or a context, not both")
        if context is not None:
            return cls(_vectors("context", [context]), None)
        if actions is None:
            return None
        labels = tuple(label for label, _ in actions)
        if len(set(labels)) != len(labels):
            raise OfferInvalid("actions", "action ids must be unique within a request")
        return cls(_vectors("actions", [features for _, features in actions]), labels)

    def check(self, campaign: Campaign) -> None:
        """OfferInvalid unless this offer is the campaign's form, of its dimension, with finite features of norm
        at most 1."""
        field = "context" if self.labels is None else "actions"
        if campaign.offers is None:
            raise OfferInvalid(
                field, f"campaign {campaign.id!r} is not contextual: its requests name only the campaign"
            )
        if campaign.offers != field:
            wanted = "its own actions" if campaign.offers == "actions" else "a context for its arms"
            raise OfferInvalid(field, f'campaign {campaign.id!r} takes {wanted} ("{campaign.offers}")')
        width = self.vectors.shape[1]
        if width != campaign.features:
            raise OfferInvalid(
                field, f"features have {width} numbers; campaign {campaign.id!r} has d = {campaign.features}"
            )
        squares = np.einsum("kd,kd->k", self.vectors, self.vectors)
        # false for a nan or an infinity too (max propagates a nan): one pass checks both
        if not squares.max() <= NORM_LIMIT**2:
            if not np.isfinite(self.vectors).all():
                raise OfferInvalid(field, "features are finite numbers")
            worst = int(squares.argmax())
            where = field if self.labels is None else f"actions[{worst}]"
            raise OfferInvalid(
                where, f"features have norm {math.sqrt(squares[worst]):.6g} > 1: scale them by a fixed bound per "
                "feature"
            )  # fmt: skip


def _vectors(field: str, rows: list[list[float]]) -> np.ndarray:
    if not rows:
        raise OfferInvalid(field, "at least one action")
    if len(rows) > MAX_ACTIONS:
        raise OfferInvalid(field, f"at most {MAX_ACTIONS} actions a request")
    try:
        vectors = np.array(rows, dtype=np.float64)
    except ValueError:  # rows of different lengths (NumPy refuses a ragged array)
        raise OfferInvalid(field, "every action has the same number of features") from None
    if vectors.shape[1] == 0:
        raise OfferInvalid(field, "features are d numbers, at least one")
    return vectors


@dataclass(frozen=True)
class ContextualChoice:
    """One request's decision: the model block its pull counts in (its arm index), what the answer names, and
    what its record carries."""

    block: int
    label: str
    propensity: float
    features: np.ndarray
    footprint: float


def linear_stats(campaign: Campaign, state: StateSnapshot, now: int) -> LinearStats:
    """The policy's view of ``state`` at ``now`` (µs): one row per block; rewards on value/max."""
    blocks, d = len(campaign.arms), int(campaign.features or 0)
    model = state.model if state.model is not None else LinearSums.zeros(blocks, d)
    hist = state.histogram
    inside = (hist.bucket + 1) * campaign.bucket_width_us > now - campaign.window_us
    footprint = hist.footprint if hist.footprint is not None else np.zeros(len(hist.count))
    return LinearStats(
        model.gram,
        model.reward / campaign.reward.max,
        state.counters.pulls.astype(np.float64),
        np.bincount(hist.arm[inside], hist.count[inside].astype(np.float64), minlength=blocks),
        np.bincount(hist.arm[inside], footprint[inside], minlength=blocks),
        inverses=model.inverses,  # the same gram's: inverted once per read (policies/linear.py)
    )


def policy_stats(campaign: Campaign, state: StateSnapshot, now: int) -> LinearStats:
    """What the policy decides from: ``linear_stats`` of the campaign's active arms alone, in order (a retired
    arm is never chosen; ``model_block`` names an arm's row), as an arm campaign's policy sees its active arms
    (Campaign.on_active_arms)."""
    stats = linear_stats(campaign, state, now)
    if not campaign.retired:
        return stats
    stats.inverses.of(stats.gram, campaign.contextual_policy.ridge())  # memoised with the sums: rows share it
    return stats.on_runs(campaign.active_arms)


def model_block(campaign: Campaign, arm: int) -> int:
    """Where arm ``arm`` (a campaign arm index, an actions campaign's block 0) is among the policy's rows."""
    return campaign.active_arms.index(arm) if campaign.retired else arm


def matured_cells(campaign: Campaign, state: StateSnapshot, now: int) -> np.ndarray:
    """(n,) bool: the histogram cells wholly older than the window, which the store folds away."""
    return (state.histogram.bucket + 1) * campaign.bucket_width_us <= now - campaign.window_us


@dataclass(frozen=True)
class _Kept:
    version: StateVersion  # the statistics it serves
    model: PreparedModel
    chained: int  # decisions added to it since it was prepared from statistics (with_decision)


@dataclass(frozen=True)
class _Successor(_Kept):
    decision_id: str  # the lone decision it adds: it serves only once the store counted that one


class PreparedModels:
    """A worker's prepared models of its contextual campaigns (policies/linear.py ``PreparedModel``): one per
    campaign, kept with the StateVersion it serves, so that every request at that version decides from it,
    computing only its own actions' products. A model is prepared from a snapshot by the first request of a
    histogram read (which folds the read's matured cells), or once a decision is answered, for the snapshot
    the worker then holds (``prepare_next``); its window (which cells are inside it) is as of that moment, at
    most ``snapshot_interval`` old, as an arm campaign's Ñ is (engine/choosing.py).

    A lone decision's **successor** is prepared while the store records it, when the worker would otherwise
    wait (``follow``): the model plus that decision, as the next decision of a group sees it (its footprint
    joins the window too). It serves the next request once the store counted that decision (``counted``: not
    a retried request's, which the store answers with the earlier decision) and holds exactly the statistics
    after it (same read and write stamp, one decision more), which is the common case between two
    conversions; else the next snapshot is prepared as before. The two may differ in the window only: a model
    prepared from a snapshot counts the window of the snapshot's read, without the worker's own decisions
    since (they are in V), until the next read. A chain of successors is cut after FRESH_EVERY decisions, as
    a held inverse is (each adds a rounding of order d·ε)."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}
        self._successors: dict[str, _Successor] = {}
        self._counted: dict[str, str] = {}  # per campaign, the last lone decision the store counted

    def kept(self, campaign_id: str, version: StateVersion | None) -> PreparedModel | None:
        """The model kept for ``version`` of the campaign's statistics (the successor taking over if it is the
        one prepared for them and its decision was counted); None if none (or unversioned)."""
        if version is None:
            return None
        kept = self._kept.get(campaign_id)
        if kept is not None and kept.version == version:
            return kept.model
        successor = self._successors.get(campaign_id)
        if successor is None or successor.version != version or self._counted.get(campaign_id) != successor.decision_id:
            return None
        self._kept[campaign_id] = self._successors.pop(campaign_id)
        return successor.model

    def prepare(self, campaign: Campaign, state: StateSnapshot, now: int) -> PreparedModel:
        """The model of ``state`` at ``now``, kept if the state is versioned."""
        model = campaign.contextual_policy.prepare(policy_stats(campaign, state, now))
        if state.version is not None:
            self._kept[campaign.id] = _Kept(state.version, model, 0)
        return model

    def follow(self, campaign: Campaign, version: StateVersion | None, decision: Pull) -> None:
        """The successor of the model kept for ``version``, from which ``decision`` was just taken alone."""
        kept = self._kept.get(campaign.id)
        if version is None or kept is None or kept.version != version or kept.chained >= FRESH_EVERY:
            return
        assert decision.features is not None, "a contextual decision carries its features"
        model = kept.model.with_decision(model_block(campaign, decision.arm), decision.features, decision.footprint)
        after = replace(version, decisions=version.decisions + 1)
        self._successors[campaign.id] = _Successor(after, model, kept.chained + 1, decision.decision_id)

    def counted(self, campaign_id: str, decision_id: str) -> None:
        """The store recorded lone decision ``decision_id`` as new: its successor may serve."""
        self._counted[campaign_id] = decision_id

    def prepare_next(self, campaign: Campaign, state: StateSnapshot | None, now: int) -> None:
        """The model of ``state``, the snapshot the worker holds (no I/O), made ready for the next request:
        only where none serves it yet and the kept one is of another version of the same histogram read,
        whose matured cells were folded and gauges published when its first request prepared it (a new read
        waits for its request)."""
        if state is None or state.version is None or self.kept(campaign.id, state.version) is not None:
            return
        kept = self._kept.get(campaign.id)
        if kept is not None and (kept.version.policy, kept.version.read) == (state.version.policy, state.version.read):
            self.prepare(campaign, state, now)

    def forget(self, campaign_id: str) -> None:
        """Drop the models of a campaign that decides no more (archived)."""
        for kept in (self._kept, self._successors, self._counted):
            kept.pop(campaign_id, None)


def choose_offers(
    campaign: Campaign, model: PreparedModel, offers: list[Offer], rng: np.random.Generator
) -> list[ContextualChoice]:
    """The decisions of ``offers`` in turn, each chosen from ``model`` plus the decisions before it."""
    chosen = list[ContextualChoice]()
    for number, offer in enumerate(offers):
        if number:  # each decision seen by the next (the last one's by the next read, or the store's own sums)
            previous = chosen[-1]
            model = model.with_decision(model_block(campaign, previous.block), previous.features, previous.footprint)
        if offer.labels is None:
            choice = model.choose_arm(offer.vectors[0], rng)
            block = campaign.active_arms[int(choice.action[0])]
            label, features = campaign.arms[block], offer.vectors[0]
        else:
            choice = model.choose(offer.vectors[None], rng)
            action = int(choice.action[0])
            block, label, features = 0, offer.labels[action], offer.vectors[action]
        footprint = float(choice.footprint[0])
        chosen.append(ContextualChoice(block, label, float(choice.propensity[0]), features, footprint))
    return chosen


def fallback_choice(campaign: Campaign, offer: Offer) -> ContextualChoice:
    """What a contextual campaign falls back to: its default arm, or the first action offered (the caller's
    order is its preference), with propensity 1 and no footprint (a fallback's pull never counts)."""
    if offer.labels is None:
        arm = campaign.default_arm or campaign.arms[0]
        return ContextualChoice(campaign.arm_index[arm], arm, 1.0, offer.vectors[0], 0.0)
    return ContextualChoice(0, offer.labels[0], 1.0, offer.vectors[0], 0.0)


def decision_fields(campaign: Campaign, offer: Offer, features: np.ndarray, footprint: float) -> dict[str, Any]:
    """What a contextual decision's audit record adds: the chosen features and footprint (what a rebuild adds
    to the model), and the offered actions when the campaign logs them (what ``replay --policy`` needs)."""
    fields: dict[str, Any] = {"features": features.tolist(), "footprint": footprint}
    if campaign.log_actions and offer.labels is not None:
        fields["actions"] = [
            {"id": label, "features": row} for label, row in zip(offer.labels, offer.vectors.tolist(), strict=True)
        ]
    return fields


def model_state(campaign: Campaign, state: StateSnapshot, now: int) -> dict[str, Any]:
    """The ``model`` object of GET /state: θ̂ estimates τ_m·θ (the window-discounted parameter; for a context
    campaign the blocks of every arm in arm order, d numbers each, and each arm's own row under ``arms``).
    ``correction_share`` is how much of the exploration width the delay correction makes (the worst arm's)."""
    stats = linear_stats(campaign, state, now)
    policy = campaign.contextual_policy
    rows = [policy.policy_state(stats.on_runs([k])) for k in range(len(campaign.arms))]
    theta = [value for row in rows for value in row["theta"]]
    body: dict[str, Any] = {
        "d": campaign.features,
        "decisions": int(state.counters.pulls.sum()),
        "conversions": int(state.counters.counted.sum()),
        "value": float(state.counters.conversions.sum()),
        "theta": theta,
        "pending": int(stats.window_count.sum()),
        "theta_norm": float(np.linalg.norm(theta)),
        "correction_share": max(_correction_share(policy.params(), row) for row in rows),
    }
    if campaign.offers == "context":
        retired = set(campaign.retired)
        body["arms"] = {arm: row | ({"retired": True} if arm in retired else {})
                        for arm, row in zip(campaign.arms, rows, strict=True)}  # fmt: skip
    else:
        body |= {key: value for key, value in rows[0].items() if key not in body}
    return body


def _correction_share(params: dict[str, Any], row: dict[str, Any]) -> float:
    """S/(2f+S) for a UCB index (0 without a correction), (c − σ0)/c for the Thompson inflation c."""
    if "inflation" in row:
        return float((row["inflation"] - params["sigma0"]) / row["inflation"])
    width = row.get("window_sum", 0.0)
    return float(width / (2.0 * row["f"] + width)) if width > 0 else 0.0
