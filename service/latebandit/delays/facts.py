"""What the anonymous-feedback policies must know of a delay model: E[τ], the bound d and Var(τ).

ODAAF (Pike-Burke 2018) needs the mean delay, ODAAF-B a bound on it, ODAAF-V its variance, CLW a bound;
all in slots. By default they are read off the campaign's or the scenario's ``delay`` model, which is in
seconds (service) or rounds (simulator); ``per_slot`` converts: a slot lasts ``per_slot`` model units.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from latebandit.delays.models import DelayModel, Empirical, Exponential, Fixed, Geometric, Mixture, Pareto, Uniform

FACT_PARAMS = {"mean_delay": "mean", "max_delay": "bound", "delay_variance": "variance"}


def support_end(model: DelayModel) -> float:
    """The largest delay the model can produce (inf when unbounded)."""
    if isinstance(model, Fixed):
        return model.value
    if isinstance(model, Uniform):
        return model.high
    if isinstance(model, Empirical) and model.quantiles[-1][1] >= 1.0:
        return model.quantiles[-1][0]
    if isinstance(model, Mixture):
        return max(support_end(component) for component in model.components)
    return math.inf


def second_moment(model: DelayModel) -> float:
    """E[τ²] (inf when infinite or unknown in closed form)."""
    if isinstance(model, Fixed):
        return model.value**2
    if isinstance(model, Uniform):
        return (model.low**2 + model.low * model.high + model.high**2) / 3.0
    if isinstance(model, Exponential):
        return 2.0 * model.mean() ** 2
    if isinstance(model, Geometric):
        return (1.0 - model.p) * (2.0 - model.p) / model.p**2
    if isinstance(model, Pareto):
        return model.alpha * model.scale**2 / (model.alpha - 2.0) if model.alpha > 2 else math.inf
    if isinstance(model, Empirical):
        if model.quantiles[-1][1] < 1.0:
            return math.inf
        delays = np.array([delay for delay, _ in model.quantiles])
        masses = np.diff([0.0, *(probability for _, probability in model.quantiles)])
        return float(delays**2 @ masses)
    if isinstance(model, Mixture):
        weights = np.array(model.weights) / sum(model.weights)
        return float(weights @ [second_moment(component) for component in model.components])
    return math.inf


def delay_fact(model: DelayModel, fact: str) -> float:
    """``mean``, ``bound`` or ``variance`` of the model (inf when it has none)."""
    if model.family == "unknown":
        return math.inf
    mean = model.mean()
    if fact == "mean":
        return mean
    if fact == "bound":
        return support_end(model)
    return second_moment(model) - mean**2 if math.isfinite(mean) else math.inf


def with_delay_facts(
    policy: str, declared: Mapping[str, Any], params: Mapping[str, Any], model: DelayModel, per_slot: float | None
) -> dict[str, Any]:
    """``params`` with each delay fact the policy declares and was not given filled in from ``model``.

    ``per_slot``: model units per slot, None when slots have no fixed length (then the facts must be given).
    """
    filled = dict(params)
    for name, fact in FACT_PARAMS.items():
        if name not in declared or filled.get(name) is not None:
            continue
        value = delay_fact(model, fact)
        if not math.isfinite(value):
            raise ValueError(
                f"policy {policy!r} needs {name} (the delay's {fact}, in slots): the delay model "
                f"{model.family!r} has no finite {fact}; give {name} in params"
            )
        if per_slot is None:
            raise ValueError(
                f"policy {policy!r} needs {name} in slots: give {name} in params, or slot_seconds, or "
                "decisions_per_second (the peak decision rate, to convert the delay model's seconds to slots)"
            )
        filled[name] = value / per_slot
    return filled
