"""Bandit policies: pure objects that turn per-arm statistics and an injected RNG into decisions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from latebandit.policies.base import ArmStats, Choice, Policy, Setting
from latebandit.policies.baselines import KLUCB, UCB1, DelayedThompson, Fixed, Thompson, Uniform
from latebandit.policies.guha import GuhaBayes
from latebandit.policies.linear import CONTEXTUAL_POLICIES, ContextualPolicy, LinearStats, make_contextual_policy
from latebandit.policies.manegueu import AdaptPatientBandits, PatientBandits
from latebandit.policies.pikeburke import Odaaf, OdaafB, OdaafV, QpmD
from latebandit.policies.schedule import SchedulePolicy
from latebandit.policies.vernade import DelayedKLUCB, DelayedUCB
from latebandit.policies.wang import ArsExp3, ArsUcb, Clw

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        *(Uniform, Fixed, UCB1, KLUCB, Thompson, DelayedUCB, DelayedKLUCB, PatientBandits, AdaptPatientBandits),
        *(DelayedThompson, GuhaBayes, Odaaf, OdaafB, OdaafV, QpmD, ArsUcb, ArsExp3, Clw),
    )
}


def make_policy(name: object, params: Mapping[str, Any], n_arms: int, setting: Setting | None = None) -> Policy:
    """The named policy with validated params; ValueError naming what is wrong (``name`` too, from a file)."""
    cls = POLICIES.get(name) if isinstance(name, str) else None
    if name in CONTEXTUAL_POLICIES:
        raise ValueError(
            f"policy {name!r} is contextual: it chooses among each request's action vectors, so it needs a "
            "contextual campaign or scenario (features), not a list of arms"
        )
    if cls is None:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    if not isinstance(params, Mapping) or not all(isinstance(key, str) for key in params):
        raise ValueError(f"policy {name!r}: params must be an object with string keys")
    return cls(n_arms, setting, **params)


def takes_new_arms(policy: Policy) -> bool:
    """Whether the policy takes an arm change within one state: index and Bayesian policies do (a new arm is
    opened as every arm is, or starts at the prior); a policy that plays a schedule over its arms, or solves
    plans over them (guha-bayes), does not (its schedule or plan names the arms it was made for)."""
    return not isinstance(policy, SchedulePolicy | GuhaBayes)


__all__ = [
    "CONTEXTUAL_POLICIES",
    "POLICIES",
    "ArmStats",
    "Choice",
    "ContextualPolicy",
    "LinearStats",
    "Policy",
    "SchedulePolicy",
    "Setting",
    "make_contextual_policy",
    "make_policy",
    "takes_new_arms",
]
