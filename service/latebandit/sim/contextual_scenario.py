"""Contextual scenario files (docs/reference/scenarios.md, "Contextual scenarios"): a delayed linear bandit.

A scenario is contextual when it has a ``contextual`` block: each round offers ``actions_per_round``
fresh action vectors in R^d drawn from ``features``; the played one converts with probability θᵀa (θ fixed,
or drawn per run from its distribution), after a delay from ``delay`` censored at the required ``window``
(the model of Vernade et al. 2020). There are no ``arms``; rewards are Bernoulli and attributed.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from latebandit.delays.models import DelayModel
from latebandit.policies.linear import make_contextual_policy
from latebandit.sim.scenario import (
    MAX_LABEL,
    POLICY_KEYS,
    PolicySpec,
    ScenarioError,
    _checkpoints,
    _delays,
    _integer,
    _list,
    _mapping,
    _no_extra,
    _show,
)

KEYS = {"horizon", "runs", "seed", "contextual", "delay", "window", "policies", "checkpoints"}
BLOCK_KEYS = {"d", "actions_per_round", "theta", "features", "delay_start"}
FEATURES = ("uniform-unit", "signs")
THETA_FAMILIES = ("signed-dirichlet",)
MAX_D = 256  # as a contextual campaign's "features"
MAX_ACTIONS = 1000  # as a /choose request's actions
RATE_SLACK = 1e-12  # float rounding allowed on a conversion rate's [0, 1] range


@dataclass(frozen=True)
class Features:
    """How each round's action vectors are drawn.

    - ``uniform-unit``: every coordinate uniform on [0, 1], then the vector scaled to unit length (the
      released experiments of Vernade et al. 2020);
    - ``signs``: a = (1/√2, s_1, …, s_{d−1}/sqrt(2(d−1))) with s_j = ±1 equiprobable (unit length; the spec's
      low-rate setting).
    """

    family: str

    def draw(self, rng: np.random.Generator, shape: tuple[int, int], d: int) -> np.ndarray:
        """(rounds, K, d) action vectors."""
        if self.family == "uniform-unit":
            raw = rng.random((*shape, d))
            return raw / np.linalg.norm(raw, axis=-1, keepdims=True)
        signs = rng.integers(0, 2, (*shape, d - 1)) * 2.0 - 1.0
        return np.concatenate([np.full((*shape, 1), math.sqrt(0.5)), signs / math.sqrt(2.0 * (d - 1))], axis=-1)

    def rate_range(self, theta: np.ndarray) -> tuple[float, float]:
        """The smallest and largest θᵀa over the support (a bound for ``uniform-unit``, whose θ must be >= 0)."""
        if self.family == "uniform-unit":
            return 0.0, float(np.linalg.norm(theta))
        base, spread = theta[0] * math.sqrt(0.5), float(np.abs(theta[1:]).sum()) / math.sqrt(2.0 * (len(theta) - 1))
        return base - spread, base + spread


@dataclass(frozen=True)
class Theta:
    """θ: ``fixed`` (a list of d numbers), or ``signed-dirichlet`` per run: θ_0 = center·√2, θ_j =
    spread·sqrt(2(d−1))·w_j·±1 with w ~ Dirichlet(1, …, 1), so that with ``signs`` features every rate is
    center + spread·Σ w_j·(±1) in [center − spread, center + spread]."""

    fixed: tuple[float, ...] | None = None
    center: float = 0.0
    spread: float = 0.0

    def draw(self, rng: np.random.Generator, d: int) -> np.ndarray:
        if self.fixed is not None:
            return np.array(self.fixed)
        weights = rng.dirichlet(np.ones(d - 1)) * (rng.integers(0, 2, d - 1) * 2.0 - 1.0)
        return np.concatenate([[self.center * math.sqrt(2.0)], self.spread * math.sqrt(2.0 * (d - 1)) * weights])

    def to_json(self) -> Any:
        if self.fixed is not None:
            return list(self.fixed)
        return {"family": "signed-dirichlet", "center": self.center, "spread": self.spread}


@dataclass(frozen=True)
class ContextualScenario:
    horizon: int
    runs: int
    seed: int
    d: int
    actions_per_round: int
    theta: Theta
    features: Features
    delay: DelayModel
    delay_start: int  # rounds added to every drawn delay: 1 gives scipy's geometric support 1, 2, … (released code)
    window: int
    policies: tuple[PolicySpec, ...]
    checkpoints: tuple[int, ...]

    def with_overrides(self, runs: int | None = None, seed: int | None = None) -> ContextualScenario:
        """The same scenario with the CLI's --runs / --seed applied."""
        return replace(self, runs=self.runs if runs is None else runs, seed=self.seed if seed is None else seed)

    def within_window(self) -> float:
        """τ_m = P(delay_start + D <= m): the share of conversions the window keeps."""
        return float(self.delay.cdf(self.window - self.delay_start)) if self.window >= self.delay_start else 0.0

    def to_json(self) -> dict[str, Any]:
        """The normalised scenario; loading it again gives an equal scenario."""
        block = {"d": self.d, "actions_per_round": self.actions_per_round, "theta": self.theta.to_json(),
                 "features": {"family": self.features.family}, "delay_start": self.delay_start}  # fmt: skip
        return {
            "horizon": self.horizon,
            "runs": self.runs,
            "seed": self.seed,
            "contextual": block,
            "delay": self.delay.to_spec(),
            "window": self.window,
            "policies": [spec.to_json() for spec in self.policies],
            "checkpoints": list(self.checkpoints),
        }


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ScenarioError(f"{where} must be a finite number (got {_show(value)})")
    return float(value)


def _theta(value: object, d: int, features: Features) -> Theta:
    if isinstance(value, Mapping):
        data = _mapping(value, "contextual.theta")
        _no_extra(data, {"family", "center", "spread"}, "contextual.theta")
        if data.get("family") not in THETA_FAMILIES:
            raise ScenarioError(f"contextual.theta.family must be one of {', '.join(THETA_FAMILIES)}")
        if features.family != "signs" or d < 2:
            raise ScenarioError("contextual.theta 'signed-dirichlet' goes with features 'signs' and d >= 2")
        theta = Theta(None, _number(data.get("center"), "contextual.theta.center"),
                      _number(data.get("spread"), "contextual.theta.spread"))  # fmt: skip
        low, high = theta.center - abs(theta.spread), theta.center + abs(theta.spread)
    else:
        numbers_ = [_number(x, f"contextual.theta[{i}]") for i, x in enumerate(_list(value, "contextual.theta"))]
        if len(numbers_) != d:
            raise ScenarioError(f"contextual.theta must list d = {d} numbers (got {len(numbers_)})")
        if features.family == "uniform-unit" and min(numbers_) < 0:
            raise ScenarioError("contextual.theta must be >= 0 with features 'uniform-unit' (rates θᵀa >= 0)")
        if features.family == "signs" and d < 2:
            raise ScenarioError("features 'signs' need d >= 2")
        theta = Theta(tuple(numbers_))
        low, high = features.rate_range(np.array(numbers_))
    if low < -RATE_SLACK or high > 1.0 + RATE_SLACK:
        raise ScenarioError(f"contextual.theta gives conversion rates θᵀa in [{low:.4g}, {high:.4g}], outside [0, 1]")
    return theta


def _policies(value: object) -> tuple[PolicySpec, ...]:
    specs = []
    for i, entry in enumerate(_list(value, "policies")):
        where = f"policies[{i}]"
        data = _mapping(entry, where)
        _no_extra(data, POLICY_KEYS - {"feed", "exploration_floor"}, where)
        name, params = data.get("name"), _mapping(data.get("params", {}), f"{where}.params")
        try:
            make_contextual_policy(name, params)
        except ValueError as error:
            raise ScenarioError(f"{where}: {error} (a contextual scenario runs contextual policies)") from error
        label = data.get("label", name)
        if not isinstance(label, str) or not 0 < len(label) <= MAX_LABEL:
            raise ScenarioError(f"{where}.label must be a string of 1 to {MAX_LABEL} characters")
        specs.append(PolicySpec(str(name), dict(params), label))
    labels = [spec.label for spec in specs]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ScenarioError(f"policies: label {repeated[0]!r} is used twice; give each entry its own 'label'")
    return tuple(specs)


def contextual_from_mapping(data: object) -> ContextualScenario:
    """Validate a parsed contextual scenario (defaults: runs 100, seed 0, delay_start 0)."""
    data = _mapping(data, "the scenario")
    _no_extra(data, KEYS, "a contextual scenario")
    for key in ("horizon", "contextual", "delay", "window", "policies"):
        if key not in data:
            raise ScenarioError(f"a contextual scenario needs the {key!r} field")
    horizon = _integer(data["horizon"], "horizon", 1)
    block = _mapping(data["contextual"], "contextual")
    _no_extra(block, BLOCK_KEYS, "contextual")
    for key in ("d", "actions_per_round", "theta", "features"):
        if key not in block:
            raise ScenarioError(f"contextual needs the {key!r} field")
    d = _integer(block["d"], "contextual.d", 1)
    if d > MAX_D:
        raise ScenarioError(f"contextual.d must be at most {MAX_D} (got {d})")
    actions = _integer(block["actions_per_round"], "contextual.actions_per_round", 1)
    if actions > MAX_ACTIONS:
        raise ScenarioError(f"contextual.actions_per_round must be at most {MAX_ACTIONS} (got {actions})")
    features_spec = _mapping(block["features"], "contextual.features")
    _no_extra(features_spec, {"family"}, "contextual.features")
    if features_spec.get("family") not in FEATURES:
        raise ScenarioError(f"contextual.features.family must be one of {', '.join(FEATURES)}")
    features = Features(str(features_spec["family"]))
    delays, _ = _delays(data["delay"], 1)
    return ContextualScenario(
        horizon=horizon,
        runs=_integer(data.get("runs", 100), "runs", 1),
        seed=_integer(data.get("seed", 0), "seed", 0),
        d=d,
        actions_per_round=actions,
        theta=_theta(block["theta"], d, features),
        features=features,
        delay=delays[0],
        delay_start=_integer(block.get("delay_start", 0), "contextual.delay_start", 0),
        window=_integer(data["window"], "window (the censoring window m, required here)", 0),
        policies=_policies(data["policies"]),
        checkpoints=_checkpoints(data.get("checkpoints", [horizon]), horizon),
    )
