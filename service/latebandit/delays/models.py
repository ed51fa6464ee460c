"""Conversion-delay distributions: the CDF τ that weighs each pull in Ñ = Σ τ(min(age, m)).

Unit-agnostic: the service uses seconds, the simulator rounds. Every family reads and writes the
JSON form of the API (``delay_from_spec`` / ``to_spec``) and rejects a bad spec with a ValueError whose
message names the field, because these messages reach API users unchanged.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike

WEIGHT_SUM_TOLERANCE = 1e-9
Size = int | tuple[int, ...]
ExponentialTerms = tuple[tuple[float, float], ...]


def _show(value: object) -> str:
    """A bounded repr, so that a huge bad value does not flood an error message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _require(ok: bool, family: str, field: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{family} delay: {field} must be {rule} (got {_show(value)})")


def _number(value: object, family: str, field: str) -> float:
    """A finite float from a JSON number; bools, strings and overflowing integers are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{family} delay: {field} must be a number (got {_show(value)})")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    _require(math.isfinite(number), family, field, "finite", value)
    return number


def _items(value: object, family: str, field: str) -> Sequence[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or not value:
        raise ValueError(f"{family} delay: {field} must be a non-empty list (got {_show(value)})")
    return value


@dataclass(frozen=True)
class DelayModel(ABC):
    """A delay distribution on [0, ∞]. ``family`` and ``fields`` name its JSON spec. Every family is a
    frozen dataclass of its fields (what ``to_spec`` reads)."""

    family: ClassVar[str]
    fields: ClassVar[tuple[str, ...]]

    @abstractmethod
    def cdf(self, age: ArrayLike) -> np.ndarray:
        """P(D <= age), elementwise, float64, 0 for negative ages."""

    @abstractmethod
    def sample(self, rng: np.random.Generator, size: Size) -> np.ndarray:
        """Delays drawn with the caller's generator (float64; inf for a conversion never observed)."""

    @abstractmethod
    def mean(self) -> float:
        """E[D]; math.inf when infinite."""

    def exponential_components(self) -> ExponentialTerms | None:
        """((weight, rate), ...) when F(a) = Σ w_j (1 − exp(−rate_j·a)) exactly for a >= 0, else None.

        The exposure code keeps exact decayed sums for such F (docs/design-notes.md, "How Ñ is computed").
        """
        return None

    def to_spec(self) -> dict[str, Any]:
        """The JSON form of the campaign body; ``delay_from_spec`` rebuilds an equal model from it."""
        return {"family": self.family, **dict(zip(self.fields, astuple(self), strict=True))}

    @classmethod
    def from_fields(cls, spec: Mapping[str, Any]) -> DelayModel:
        """Build from a spec whose field names were checked; the default takes numeric fields in order."""
        return cls(*(_number(spec[field], cls.family, field) for field in cls.fields))


@dataclass(frozen=True)
class Exponential(DelayModel):
    family: ClassVar[str] = "exponential"
    fields: ClassVar[tuple[str, ...]] = ("mean",)
    mu: float

    def __post_init__(self) -> None:
        _require(0 < self.mu < math.inf, self.family, "mean", "a positive finite number", self.mu)

    def cdf(self, age: ArrayLike) -> np.ndarray:
        return -np.expm1(-np.maximum(np.asarray(age, dtype=np.float64), 0.0) / self.mu)

    def sample(self, rng: np.random.Generator, size: Size) -> np.ndarray:
        return rng.exponential(self.mu, size)

    def mean(self) -> float:
        return self.mu

    def exponential_components(self) -> ExponentialTerms:
        return ((1.0, 1.0 / self.mu),)


@dataclass(frozen=True)
class Geometric(DelayModel):
    """Support 0, 1, 2, …: P(D <= d) = 1 − (1−p)^(⌊d⌋+1), i.e. numpy's geometric(p) − 1 (Vernade et al. 2017, §7)."""

    family: ClassVar[str] = "geometric"
    fields: ClassVar[tuple[str, ...]] = ("p",)
    p: float

    def __post_init__(self) -> None:
        _require(0 < self.p <= 1, self.family, "p", "in (0, 1]", self.p)

    def cdf(self, age: ArrayLike) -> np.ndarray:
        a = np.asarray(age, dtype=np.float64)
        with np.errstate(divide="ignore"):  # p = 1: log1p(-1) = -inf, times a count >= 1
            tail = (np.floor(np.maximum(a, 0.0)) + 1.0) * np.log1p(-self.p)
        return np.where(a >= 0, -np.expm1(tail), 0.0)

    def sample(self, rng: np.random.Generator, size: Size) -> np.ndarray:
        return (rng.geometric(self.p, size) - 1).astype(np.float64)

    def mean(self) -> float:
        return (1.0 - self.p) / self.p


@dataclass(frozen=True)
class Fixed(DelayModel):
    family: ClassVar[str] = "fixed"
    fields: ClassVar[tuple[str, ...]] = ("value",)
    value: float

    def __post_init__(self) -> None:
        _require(0 <= self.value < math.inf, self.family, "value", "a finite number >= 0", self.value)

    def cdf(self, age: ArrayLike) -> np.ndarray:
        return (np.asarray(age, dtype=np.float64) >= self.value).astype(np.float64)

    def sample(self, rng: np.random.Generator, size: Size) -> np.ndarray:
        return np.full(size, self.value, dtype=np.float64)

    def mean(self) -> float:
        return self.value


@dataclass(frozen=True)
class Uniform(DelayModel):
    """low < high is required: a point mass is the ``fixed`` family and would divide by zero here."""

    family: ClassVar[str] = "uniform"
    fields: ClassVar[tuple[str, ...]] = ("low", "high")
    low: float
    high: float

    def __post_init__(self) -> None:
        _require(0 <= self.low < math.inf, self.family, "low", "a finite number >= 0", self.low)
        _require(self.low < self.high < math.inf, self.family, "high", f"finite and > low = {self.low}", self.high)

    def cdf(self, age: ArrayLike) -> np.ndarray:
        a = np.asarray(age, dtype=np.float64)
        return np.clip((a - self.low) / (self.high - self.low), 0.0, 1.0)

    def sample(self, rng: np.random.Generator, size: Size) -> np.ndarray:
        return rng.uniform(self.low, self.high, size)

    def mean(self) -> float:
        return 0.5 * (self.low + self.high)


@dataclass(frozen=True)
class Pareto(DelayModel):
    """Pareto type I: P(D > x) = (x/scale)^−alpha for x >= scale. numpy's ``pareto`` is Lomax, hence
    scale·(1 + pareto(alpha)) when sampling."""

    family: ClassVar[str] = "pareto"
    fields: ClassVar[tuple[str, ...]] = ("alpha", "scale")
    alpha: float
    scale: float

    def __post_init__(self) -> None:
        _require(0 < self.alpha < math.inf, self.family, "alpha", "a positive finite number", self.alpha)
        _require(0 < self.scale < math.inf, self.family, "scale", "a positive finite number", self.scale)

    def cdf(self, age: ArrayLike) -> np.ndarray:
        ratio = np.maximum(np.asarray(age, dtype=np.float64), self.scale) / self.scale
        return -np.expm1(-self.alpha * np.log(ratio))

    def sample(self, rng: np.random.Generator, size: Size) -> np.ndarray:
        return self.scale * (1.0 + rng.pareto(self.alpha, size))

    def mean(self) -> float:
        return self.alpha * self.scale / (self.alpha - 1.0) if self.alpha > 1 else math.inf


@dataclass(frozen=True)
class Mixture(DelayModel):
    """Σ_j w_j F_j. Weights must be positive and sum to 1 within 1e-9: a vector that does not is more
    likely a mistake (a forgotten component) than a ratio to rescale, so it is refused, not normalised.
    The CDF and sampler divide by the sum so that F(∞) is exactly 1."""

    family: ClassVar[str] = "mixture"
    fields: ClassVar[tuple[str, ...]] = ("weights", "components")
    weights: tuple[float, ...]
    components: tuple[DelayModel, ...]

    def __post_init__(self) -> None:
        family = self.family
        _require(len(self.components) > 0, family, "components", "a non-empty list", self.components)
        _require(
            len(self.weights) == len(self.components),
            family,
            "weights",
            f"one per component ({len(self.components)})",
            self.weights,
        )
        for i, weight in enumerate(self.weights):
            _require(0 < weight < math.inf, family, f"weights[{i}]", "a positive finite number", weight)
        total = math.fsum(self.weights)
        _require(abs(total - 1.0) <= WEIGHT_SUM_TOLERANCE, family, "weights", "summing to 1", total)
        for i, component in enumerate(self.components):
            _require(component.family != "unknown", family, f"components[{i}]", "a known distribution", "unknown")

    @cached_property
    def _probabilities(self) -> np.ndarray:
        weights = np.array(self.weights)
        return weights / weights.sum()

    @classmethod
    def from_fields(cls, spec: Mapping[str, Any]) -> Mixture:
        raw_weights = _items(spec["weights"], cls.family, "weights")
        weights = tuple(_number(w, cls.family, f"weights[{i}]") for i, w in enumerate(raw_weights))
        components = []
        for i, component in enumerate(_items(spec["components"], cls.family, "components")):
            try:
                components.append(delay_from_spec(component))
            except ValueError as error:
                raise ValueError(f"mixture delay: components[{i}]: {error}") from error
        return cls(weights, tuple(components))

    def to_spec(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "weights": list(self.weights),
            "components": [component.to_spec() for component in self.components],
        }

    def cdf(self, age: ArrayLike) -> np.ndarray:
        a = np.asarray(age, dtype=np.float64)
        return sum(
            (w * c.cdf(a) for w, c in zip(self._probabilities, self.components, strict=True)),
            np.zeros(a.shape),
        )

    def sample(self, rng: np.random.Generator, size: Size) -> np.ndarray:
        shape = tuple(int(n) for n in np.atleast_1d(size))
        labels = rng.choice(len(self.components), size=math.prod(shape), p=self._probabilities)
        out = np.empty(labels.shape)
        for j, component in enumerate(self.components):
            chosen = labels == j
            out[chosen] = component.sample(rng, int(chosen.sum()))
        return out.reshape(shape)

    def mean(self) -> float:
        return math.fsum(w * c.mean() for w, c in zip(self._probabilities, self.components, strict=True))

    def exponential_components(self) -> ExponentialTerms | None:
        flat: list[tuple[float, float]] = []
        for weight, component in zip(self._probabilities, self.components, strict=True):
            inner = component.exponential_components()
            if inner is None:
                return None
            flat.extend((float(weight) * w, rate) for w, rate in inner)
        return tuple(flat)


@dataclass(frozen=True)
class Empirical(DelayModel):
    """A right-continuous step CDF through sorted points (delay, P(D <= delay)).

    If the last probability is below 1, the remaining mass is delays never observed: sampling returns
    inf for it and the mean is inf. Sampling is by inverse CDF.
    """

    family: ClassVar[str] = "empirical"
    fields: ClassVar[tuple[str, ...]] = ("quantiles",)
    quantiles: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        family = self.family
        _require(len(self.quantiles) > 0, family, "quantiles", "a non-empty list", self.quantiles)
        for i, (delay, probability) in enumerate(self.quantiles):
            _require(0 <= delay < math.inf, family, f"quantiles[{i}] delay", "a finite number >= 0", delay)
            _require(0 <= probability <= 1, family, f"quantiles[{i}] probability", "in [0, 1]", probability)
            if i:
                before, before_p = self.quantiles[i - 1]
                _require(delay > before, family, f"quantiles[{i}] delay", f"greater than {before}", delay)
                _require(
                    probability >= before_p,
                    family,
                    f"quantiles[{i}] probability",
                    f">= {before_p}",
                    probability,
                )
        last = self.quantiles[-1][1]
        _require(last > 0, family, "quantiles", "reaching a probability above 0", last)

    @cached_property
    def _delays(self) -> np.ndarray:
        return np.array([delay for delay, _ in self.quantiles])

    @cached_property
    def _probs(self) -> np.ndarray:
        return np.array([probability for _, probability in self.quantiles])

    @classmethod
    def from_fields(cls, spec: Mapping[str, Any]) -> Empirical:
        points = []
        for i, point in enumerate(_items(spec["quantiles"], cls.family, "quantiles")):
            pair = _items(point, cls.family, f"quantiles[{i}]")
            _require(len(pair) == 2, cls.family, f"quantiles[{i}]", "a [delay, probability] pair", point)
            points.append(
                (
                    _number(pair[0], cls.family, f"quantiles[{i}] delay"),
                    _number(pair[1], cls.family, f"quantiles[{i}] probability"),
                )
            )
        return cls(tuple(points))

    def to_spec(self) -> dict[str, Any]:
        return {"family": self.family, "quantiles": [list(point) for point in self.quantiles]}

    def cdf(self, age: ArrayLike) -> np.ndarray:
        steps = np.concatenate(([0.0], self._probs))
        return steps[np.searchsorted(self._delays, np.asarray(age, dtype=np.float64), side="right")]

    def sample(self, rng: np.random.Generator, size: Size) -> np.ndarray:
        u = 1.0 - rng.random(size)  # in (0, 1], so P(u <= F(d)) = F(d) exactly
        delays = np.concatenate((self._delays, [np.inf]))
        return delays[np.searchsorted(self._probs, u, side="left")]

    def mean(self) -> float:
        if self._probs[-1] < 1:
            return math.inf
        return float(self._delays @ np.diff(self._probs, prepend=0.0))


@dataclass(frozen=True)
class Unknown(DelayModel):
    """No CDF: for the policies that never weigh pulls by age (uniform, ucb1, …)."""

    family: ClassVar[str] = "unknown"
    fields: ClassVar[tuple[str, ...]] = ()

    def _missing(self) -> ValueError:
        return ValueError("the delay model is 'unknown': give a delay family to use a delay-corrected policy")

    def cdf(self, age: ArrayLike) -> np.ndarray:
        raise self._missing()

    def sample(self, rng: np.random.Generator, size: Size) -> np.ndarray:
        raise self._missing()

    def mean(self) -> float:
        return math.nan


FAMILIES: dict[str, type[DelayModel]] = {
    cls.family: cls for cls in (Exponential, Geometric, Fixed, Uniform, Pareto, Mixture, Empirical, Unknown)
}


def delay_from_spec(spec: Mapping[str, Any]) -> DelayModel:
    """The model a campaign body's delay spec describes; ValueError with a user-facing message otherwise."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"a delay spec must be an object with a 'family' field (got {_show(spec)})")
    family = spec.get("family")
    cls = FAMILIES.get(family) if isinstance(family, str) else None
    if cls is None:
        raise ValueError(f"unknown delay family {_show(family)}; known: {', '.join(FAMILIES)}")
    extra = sorted(str(key) for key in spec if key != "family" and key not in cls.fields)
    if extra:
        raise ValueError(
            f"{family} delay: unexpected field {extra[0]!r}; its fields: {', '.join(cls.fields) or 'none'}"
        )
    missing = [field for field in cls.fields if field not in spec]
    if missing:
        raise ValueError(f"{family} delay: missing field {missing[0]!r}")
    return cls.from_fields(spec)
