"""Rewards beyond 0/1 in a scenario (docs/reference/scenarios.md, "Revenue scenarios"): per arm, a decision
converts with probability ``converts``, then its orders' basket values make its reward, capped at the campaign
field's ``reward.max`` per decision as the service caps it (``first``: the first order's value; ``sum``: the
orders' values added up). The learners see reward / max through the service's own scaling, in [0, 1]; regret
and L(T) are in value units.

A numeric arm θ is the Bernoulli arm it always was: converts with θ, one order worth 1.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from latebandit.campaign import MAX_ATTRIBUTED_REWARD, RewardSpec
from latebandit.engine.exposure import scaled_sums

BASKETS = ("lognormal", "fixed")
PER_DECISION = ("first", "sum")
MAX_ORDERS = 1000.0  # the largest mean number of orders per conversion
MAX_LOG_VALUE = 700.0  # |mu| and sigma beyond this overflow a float's exponent
MONTE_CARLO_DRAWS = 1 << 20  # conversions drawn for E[min(orders' sum, max)] of an arm with several orders
MONTE_CARLO_BATCH = 1 << 16
MONTE_CARLO_SEED = 20_240_531


class RewardError(ValueError):
    """A reward field or value arm that cannot be simulated; the message names the field."""


@dataclass(frozen=True)
class Basket:
    """The value of one order: ``lognormal`` (the log of the value ~ N(mu, sigma²)) or ``fixed`` (``value``)."""

    family: str
    mu: float = 0.0
    sigma: float = 0.0
    value: float = 0.0

    def to_json(self) -> dict[str, Any]:
        if self.family == "fixed":
            return {"family": "fixed", "value": self.value}
        return {"family": "lognormal", "mu": self.mu, "sigma": self.sigma}

    def capped_mean(self, cap: float) -> float:
        """E[min(value, cap)], exactly: for the lognormal, e^{mu + sigma²/2}·Φ((ln cap − mu − sigma²)/sigma)
        + cap·(1 − Φ((ln cap − mu)/sigma))."""
        if self.family == "fixed":
            return min(self.value, cap)
        if self.sigma == 0.0:
            return min(math.exp(self.mu), cap)
        z = (math.log(cap) - self.mu) / self.sigma
        below = math.exp(self.mu + self.sigma**2 / 2) * _normal_cdf(z - self.sigma)
        return below + cap * _normal_cdf(-z)


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


@dataclass(frozen=True)
class ValueArm:
    """An arm's reward: converts with ``converts``, then 1 + Poisson(``orders`` − 1) orders of ``basket``."""

    converts: float
    basket: Basket
    orders: float = 1.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"converts": self.converts, "basket": self.basket.to_json()}
        if self.orders != 1.0:
            out["orders"] = self.orders
        return out


BERNOULLI_BASKET = Basket("fixed", value=1.0)


@dataclass(frozen=True)
class Revenue:
    """A scenario's campaign field ``reward`` and its arms' reward distributions."""

    spec: RewardSpec
    arms: tuple[ValueArm, ...]

    def to_json(self) -> dict[str, Any]:
        return {"max": self.spec.max, "per_decision": self.spec.per_decision}

    def arms_json(self) -> list[Any]:
        return [arm.converts if arm.basket == BERNOULLI_BASKET else arm.to_json() for arm in self.arms]

    @cached_property
    def conversion_values(self) -> np.ndarray:
        """(K,) E[a converted decision's reward] in value units: exact for one order per conversion, Monte
        Carlo (MONTE_CARLO_DRAWS conversions, fixed seed) for several."""
        cap = self.spec.max
        values = []
        for k, arm in enumerate(self.arms):
            if arm.orders == 1.0:
                values.append(arm.basket.capped_mean(cap))
                continue
            rng = np.random.default_rng(np.random.SeedSequence(MONTE_CARLO_SEED, spawn_key=(k,)))
            batches = MONTE_CARLO_DRAWS // MONTE_CARLO_BATCH
            total = sum(float(np.minimum(self._totals(rng, MONTE_CARLO_BATCH, k), cap).sum()) for _ in range(batches))
            values.append(total / MONTE_CARLO_DRAWS)
        return np.array(values)

    def draw(self, rng: np.random.Generator, rounds: int) -> np.ndarray:
        """(rounds, K) what each arm's conversion would earn, in the learners' units: reward / max in [0, 1]."""
        totals = np.stack([self._totals(rng, rounds, k) for k in range(len(self.arms))], axis=1)
        return scaled_sums(np.minimum(totals, self.spec.max), self.spec.max)

    def _totals(self, rng: np.random.Generator, rounds: int, k: int) -> np.ndarray:
        """(rounds,) the value of ``rounds`` conversions of arm k (their orders added up), before the cap."""
        arm = self.arms[k]
        orders = np.ones(rounds, dtype=np.int64) if arm.orders == 1.0 else 1 + rng.poisson(arm.orders - 1.0, rounds)
        count = int(orders.sum())
        if arm.basket.family == "fixed":
            values = np.full(count, arm.basket.value)
        else:
            values = np.exp(arm.basket.mu + arm.basket.sigma * rng.standard_normal(count))
        return values if count == rounds else np.bincount(np.repeat(np.arange(rounds), orders), values, rounds)


def _number(value: object, where: str, low: float, high: float, low_open: bool = False) -> float:
    number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    if not (low < number if low_open else low <= number) or not number <= high:  # nan fails both
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise RewardError(f"{where} must be a number in {interval} (got {value!r})")
    return number


def _positive(value: object, where: str) -> float:
    return _number(value, where, 0.0, MAX_ATTRIBUTED_REWARD, low_open=True)


def _fields(value: object, where: str, allowed: set[str], required: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise RewardError(f"{where} must be an object (got {value!r})")
    extra = sorted(str(key) for key in set(value) - allowed)
    if extra:
        raise RewardError(f"{where}: unknown field {extra[0]!r}; fields: {', '.join(sorted(allowed))}")
    missing = sorted(required - set(value))
    if missing:
        raise RewardError(f"{where} needs the {missing[0]!r} field")
    return value


def reward_spec(value: object) -> RewardSpec:
    """The scenario's ``reward`` object, the campaign field: ``max`` is required (it is the scale of every value)."""
    data = _fields(value, "reward", {"max", "per_decision"}, {"max"})
    cap = _positive(data["max"], "reward.max")
    per_decision = data.get("per_decision", "first")
    if per_decision not in PER_DECISION:
        raise RewardError(f"reward.per_decision must be one of first, sum (got {per_decision!r})")
    return RewardSpec(max=cap, per_decision=per_decision)


def value_arm(value: object, where: str, spec: RewardSpec | None) -> ValueArm:
    """A value arm ``{"converts": p, "basket": {...}, "orders": mean}``, or a number (Bernoulli)."""
    if not isinstance(value, Mapping):
        return ValueArm(_number(value, where, 0.0, 1.0), BERNOULLI_BASKET)
    if spec is None:
        raise RewardError(
            f"{where} is a value distribution: the scenario needs the campaign field "
            'reward: {"max": M, "per_decision": "first" | "sum"} (max: the most one decision earns)'
        )
    data = _fields(value, where, {"converts", "basket", "orders"}, {"converts", "basket"})
    orders = _number(data.get("orders", 1.0), f"{where}.orders", 1.0, MAX_ORDERS)
    if orders != 1.0 and not spec.sums:
        raise RewardError(f"{where}.orders: with reward.per_decision 'first' only the first order counts; use 'sum'")
    return ValueArm(_number(data["converts"], f"{where}.converts", 0.0, 1.0), _basket(data["basket"], where), orders)


def _basket(value: object, where: str) -> Basket:
    where = f"{where}.basket"
    family = value.get("family") if isinstance(value, Mapping) else None
    if family not in BASKETS:
        raise RewardError(f"{where} needs a family, one of {', '.join(BASKETS)} (got {family!r})")
    if family == "fixed":
        data = _fields(value, where, {"family", "value"}, {"value"})
        return Basket("fixed", value=_positive(data["value"], f"{where}.value"))
    data = _fields(value, where, {"family", "mu", "sigma"}, {"mu", "sigma"})
    mu = _number(data["mu"], f"{where}.mu", -MAX_LOG_VALUE, MAX_LOG_VALUE)
    return Basket("lognormal", mu=mu, sigma=_number(data["sigma"], f"{where}.sigma", 0.0, MAX_LOG_VALUE))
