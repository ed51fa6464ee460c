"""The policy contract shared by the service (one campaign, R = 1) and the simulator (R runs at once).

Policies are pure: statistics and a numpy Generator in, a choice out. No clock, no I/O, no global RNG,
which is what lets the same code serve, replay and simulate (docs/architecture.md, "Policies are pure").
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from latebandit.delays.models import DelayModel
from latebandit.policies.indices import exploration

Array = np.ndarray
EPS_N = 1e-9  # Vernade et al. 2017, Algorithm 1: an effective count at or below this has no estimate (index +inf)
TIE_RTOL = 1e-12  # indices this close (relatively) to the best are ties, broken at random
SMALL_ARGMAX = 64  # indices (runs x arms) up to which the argmax runs in plain Python (a group commit's rows)


@dataclass(frozen=True)
class ArmStats:
    """Per-run, per-arm statistics at decision time; the leading axis is the run (R = 1 in the service)."""

    pulls: np.ndarray  # (R, K) N_k, raw number of past pulls
    conversions: np.ndarray  # (R, K) S_k, counted conversions (already censored at the window)
    effective: np.ndarray  # (R, K) Ñ_k = Σ τ(min(age, m)), from the delay model
    t: np.ndarray  # (R,) index of the round being decided = decisions so far + 1
    # Optional, for the policies that declare they need them (Manegueu 2020, QPM-D); None for the others.
    tail_weight: np.ndarray | None = None  # (R, K) W_k = Σ_{pulls of k in the window} ψ(age), ψ the policy's
    delay_counts: np.ndarray | None = None  # (R, K, B) observed delays per log bucket (latebandit/delays/tail.py)
    band: np.ndarray | None = None  # (R, 2) the answer to a policy's band query: pulls old enough, conversions
    delay_exposure: np.ndarray | None = None  # (R, K, B) pulls at least as old as each delay bucket's upper edge
    pending: np.ndarray | None = None  # (R, K) pulls inside the window with no conversion seen (outcome unknown)

    def __post_init__(self) -> None:
        shape = np.shape(self.pulls)
        if len(shape) != 2 or np.shape(self.conversions) != shape or np.shape(self.effective) != shape:
            raise ValueError("pulls, conversions and effective must share one (runs, arms) shape")
        if np.shape(self.t) != shape[:1]:
            raise ValueError("t must hold one round index per run")
        if self.tail_weight is not None and np.shape(self.tail_weight) != shape:
            raise ValueError("tail_weight must have the (runs, arms) shape")
        for name in ("delay_counts", "delay_exposure"):
            value = getattr(self, name)
            if value is not None and np.shape(value)[:2] != shape:
                raise ValueError(f"{name} must be (runs, arms, buckets)")
        if self.band is not None and np.shape(self.band) != (shape[0], 2):
            raise ValueError("band must be (runs, 2)")

    def successive(self, decisions: int) -> ArmStats:
        """The one-run statistics (R = 1) as ``decisions`` rows, for that many decisions taken from the same
        statistics at once (the service's group commit): row i decides round t + i. One decision's rows are
        these statistics themselves (frozen, so shared)."""
        if decisions == 1:
            return self
        rows: dict[str, Any] = {name: None if value is None else np.repeat(value, decisions, axis=0)
                for name, value in self.__dict__.items() if name != "t"}  # fmt: skip
        return ArmStats(**rows, t=self.t[0] + np.arange(decisions))

    def on_arms(self, arms: Sequence[int] | np.ndarray) -> ArmStats:
        """The statistics of ``arms`` alone, in that order: what a policy over those arms reads as its arms
        0..len(arms) − 1 (a campaign's active arms, the arms present in a simulated run). ``t`` and ``band``
        are per run, not per arm, and stay."""
        columns = np.asarray(arms, dtype=np.int64)
        return ArmStats(**{
            name: value if value is None or name in ("t", "band") else value[:, columns]
            for name, value in self.__dict__.items()
        })  # fmt: skip


@dataclass(frozen=True)
class Envelope:
    """ψ(a) = min(1, (a/scale)^−α): a tail bound on the delay, P(D > a) <= ψ(a), for every arm."""

    alpha: np.ndarray  # (R,)
    scale: float

    def weights(self, ages: np.ndarray) -> np.ndarray:
        """ψ at ``ages`` (R, ...) in the scale's unit; ages at or below the scale weigh 1."""
        a = np.asarray(ages, dtype=np.float64)
        alpha = self.alpha.reshape(self.alpha.shape + (1,) * (a.ndim - 1))
        with np.errstate(divide="ignore"):
            ratio = np.maximum(a, 0.0) / self.scale
            return np.where(ratio <= 1.0, 1.0, np.exp(-alpha * np.log(np.maximum(ratio, 1.0))))


@dataclass(frozen=True)
class Setting:
    """Where a policy runs, for the policies whose defaults depend on it (guha-bayes): the horizon in
    decisions (None in the service: no end is known), the delay model of each arm, and whether delays
    are in seconds (service) or in rounds (simulator)."""

    horizon: int | None
    delays: tuple[DelayModel, ...]
    seconds: bool


@dataclass(frozen=True)
class Choice:
    arm: np.ndarray  # (R,) int64
    propensity: np.ndarray  # (R,) probability the policy had of choosing that arm
    # (R, K) the probability of every arm, for the policies that report it (``reports_probabilities``):
    # an exploration floor and an off-policy evaluation need the chance of arms the policy did not choose.
    probabilities: np.ndarray | None = None


@dataclass(frozen=True)
class Param:
    """A policy parameter: its type, its default (None: required) and the range allowed."""

    kind: type[int] | type[float]
    default: int | float | None
    minimum: float
    maximum: float = math.inf

    def resolve(self, policy: str, name: str, value: object) -> int | float:
        if value is None and self.default is not None:
            return self.default
        if value is None:
            raise ValueError(f"policy {policy!r} needs parameter {name!r}")
        integral = self.kind is int
        what = f"{'an integer' if integral else 'a finite number'} >= {self.minimum:g}"
        what += f" and <= {self.maximum:g}" if self.maximum < math.inf else ""
        wrong_kind = integral and not isinstance(value, numbers.Integral)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or wrong_kind:
            raise ValueError(f"policy {policy!r}: {name} must be {what} (got {value!r:.60})")
        try:
            number = int(value) if integral and isinstance(value, numbers.Integral) else float(value)
        except OverflowError:
            number = math.inf
        if not (self.minimum <= number <= self.maximum and number < math.inf):
            raise ValueError(f"policy {policy!r}: {name} must be {what} (got {value!r:.60})")
        return number


def ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, nan where the denominator is at most EPS_N (no estimate yet)."""
    defined = denominator > EPS_N
    return np.where(defined, numerator / np.where(defined, denominator, 1.0), np.nan)


WORST_VARIANCE = 0.25  # the largest variance of a reward in [0, 1]: the confidence widths of the papers assume it


def variance_bound(mean_upper: np.ndarray | float) -> np.ndarray:
    """A bound on the variance of a reward in [0, 1] whose mean is at most ``mean_upper``: its variance is
    at most E[r²] <= E[r] and at most 1/4, so min(1/4, mean_upper). At conversion rates of a few percent it
    is about 1/5 of the worst case the papers' widths assume, so those need about 5 times the samples."""
    return np.minimum(WORST_VARIANCE, np.maximum(mean_upper, 0.0))


def uniform_among(candidates: np.ndarray, rng: np.random.Generator) -> Choice:
    """One True entry per row, uniformly. Always draws R·K uniforms, so a batch of R runs consumes the
    generator exactly like R successive one-run calls (batch and service agree draw for draw)."""
    keys = np.where(candidates, rng.random(candidates.shape), -1.0)
    count = candidates.sum(axis=1)
    return Choice(keys.argmax(axis=1).astype(np.int64), 1.0 / count, candidates / count[:, None])


class Policy(ABC):
    """A bandit policy over ``n_arms`` arms with validated ``params``."""

    name: ClassVar[str]
    feedback: ClassVar[str] = "attributed"
    delay_corrected: ClassVar[bool] = False
    reports_probabilities: ClassVar[bool] = False  # its Choice carries every arm's probability
    needs_pending: ClassVar[bool] = False  # reads ArmStats.pending (pulls whose outcome is not resolved yet)
    ignores_feedback: ClassVar[bool] = False  # chooses without reading any statistic: runs under every feedback
    stands: ClassVar[bool] = True  # its choice's law may be kept between decisions (``standing``)
    PARAMS: ClassVar[Mapping[str, Param]] = {}

    def __init__(self, n_arms: int, setting: Setting | None = None, **params: Any) -> None:
        """``setting`` is accepted by every policy and used by those that take defaults from it."""
        if isinstance(n_arms, bool) or not isinstance(n_arms, numbers.Integral) or n_arms < 1:
            raise ValueError(f"policy {self.name!r} needs at least one arm (got {n_arms!r})")
        unknown = sorted(set(params) - set(self.PARAMS))
        if unknown:
            known = ", ".join(self.PARAMS) or "none"
            raise ValueError(f"policy {self.name!r} has no parameter {unknown[0]!r}; its parameters: {known}")
        self.n_arms: int = int(n_arms)  # annotated: the package's import cycle defers inference
        self._params: dict[str, int | float] = {
            key: spec.resolve(self.name, key, params.get(key)) for key, spec in self.PARAMS.items()
        }

    def params(self) -> dict[str, Any]:
        """The resolved parameters, defaults included (shown to users)."""
        return dict(self._params)

    def _int_param(self, name: str) -> int:
        """A parameter declared ``Param(int, ...)``, which ``Param.resolve`` returns as an int."""
        value = self._params[name]
        assert isinstance(value, int), f"{self.name}: {name} is not an int parameter"
        return value

    def prepare(self, stats: ArmStats) -> Policy:
        """The policy ready to decide from ``stats`` on: itself, except for policies that precompute a plan
        (guha-bayes), which return a planned copy. Callers run it off the decision path."""
        return self

    def effective_pulls(self, stats: ArmStats) -> np.ndarray:
        """The count the estimate divides by: the raw pulls, for a delay-naive policy."""
        return np.asarray(stats.pulls, dtype=np.float64)

    def estimate(self, stats: ArmStats) -> np.ndarray:
        """S / effective pulls; nan while the effective count is at most EPS_N."""
        return ratio(np.asarray(stats.conversions, dtype=np.float64), self.effective_pulls(stats))

    def index(self, stats: ArmStats) -> np.ndarray:
        """The value arms are ranked by; nan for a policy that ranks by none."""
        return np.full(np.shape(stats.pulls), np.nan)

    def envelope(self, stats: ArmStats) -> Envelope | None:
        """The tail envelope ψ whose window sum Σ ψ(age) the policy reads as ``stats.tail_weight``; None when
        it reads none. ``stats`` then holds everything but ``tail_weight``."""
        return None

    def needs_band(self) -> bool:
        """Whether the policy reads ``stats.band`` (per-pull delays by round age: the simulator only)."""
        return False

    def policy_state(self, stats: ArmStats) -> dict[str, Any]:
        """What else the policy derives from the statistics, for GET /state (R = 1)."""
        return {}

    @abstractmethod
    def choose(self, stats: ArmStats, rng: np.random.Generator) -> Choice:
        """The arm for each run's next round and the probability it had of being chosen."""

    def choose_arms(self, stats: ArmStats, rng: np.random.Generator) -> np.ndarray:
        """(R,) the arms ``choose`` plays, drawing the same numbers from ``rng``, for a caller that logs no
        propensity (the simulator without an event log or a floor). A policy whose propensity costs more
        than its choice (Thompson) skips computing it here."""
        return self.choose(stats, rng).arm

    def choose_together(self, stats: ArmStats, decisions: int, rng: np.random.Generator) -> Choice:
        """``decisions`` successive decisions from the same one-run statistics (the service's group commit);
        a policy whose rows would repeat work (Thompson's propensity) shares it."""
        return self.choose(stats.successive(decisions), rng)

    def standing(self, stats: ArmStats) -> np.ndarray:
        """(R, K) the distribution ``choose`` draws each run's arm from, where it stays the same for the
        rounds that follow while the statistics do (the service then draws from it without recomputing:
        engine/choosing.py); a nan row where it does not, e.g. an opening whose turn moves with t. All nan
        here: a policy opts in by knowing its choice's law."""
        return np.full(np.shape(stats.pulls), np.nan)


class ArgmaxPolicy(Policy):
    """Policies that rank arms by an index: +inf first (forced exploration), else the argmax."""

    @abstractmethod
    def index(self, stats: ArmStats) -> np.ndarray:
        """(R, K) the index; +inf for an arm that must be explored."""

    def plain_index(self, stats: ArmStats, decisions: int) -> list[list[float]] | None:
        """``index`` of ``stats.successive(decisions)`` bit for bit in Python floats, for the service's few
        rows (at most SMALL_ARGMAX indices) of a policy that computes one; None, the default, leaves the rows
        to the array rule."""
        return None

    def choose_together(self, stats: ArmStats, decisions: int, rng: np.random.Generator) -> Choice:
        """Where ``plain_index`` computes the rows' index, it and the argmax run in Python floats: a policy
        that does not stand pays this call on every batch, and at a few arms NumPy's per-call overhead is
        most of it (benchmarks.policy_call_bench)."""
        rows = self.plain_index(stats, decisions)
        if rows is not None and (plain := plain_argmax(rows, rng)) is not None:
            return plain
        return super().choose_together(stats, decisions, rng)

    def choose(self, stats: ArmStats, rng: np.random.Generator) -> Choice:
        """Infinite indices first: the least-pulled of them, the first at or after arm (t − 1) mod K in
        cyclic order, so the opening plays arm n at round n as Algorithm 1 of Vernade et al. 2017 does (and
        the rows of one group commit, rounds t, t+1, ... from the same statistics, open different arms).
        Else the argmax within TIE_RTOL, ties uniform, propensity 1/#tied (our tie rule: the paper leaves ties open).

        The opening order is the paper's, not a random one (Vernade et al. 2017, Alg. 1: ``A_n = arm n``): with
        a delay CDF that starts near 0, the first pulls' ages set the early exploration bonuses for hundreds of
        rounds, and a random opening measured DelayedUCB's regret 4-9 % off the paper's curves."""
        index = self.index(stats)
        if 0 < index.size <= SMALL_ARGMAX and (plain := plain_argmax(index.tolist(), rng)) is not None:
            return plain  # the service's rows, past their opening: the argmax in plain Python
        forced = np.isposinf(index)
        if not forced.any():  # past every opening: the argmax alone (the same draws as the full rule below)
            return uniform_among(_best(index, forced), rng)
        pulls = np.where(forced, np.asarray(stats.pulls, dtype=np.float64), np.inf)
        least = forced & (pulls == pulls.min(axis=1, keepdims=True))
        arms = index.shape[1]
        distance = (np.arange(arms) - (np.asarray(stats.t, dtype=np.int64)[:, None] - 1)) % arms
        turn = np.where(least, distance, arms).argmin(axis=1)
        opening = np.arange(arms) == turn[:, None]
        return uniform_among(np.where(forced.any(axis=1, keepdims=True), opening, _best(index, forced)), rng)

    def standing(self, stats: ArmStats) -> np.ndarray:
        """The best arms' uniform distribution; nan while an arm must be explored (its turn moves with t), and
        for a policy that does not stand."""
        if not self.stands:
            return super().standing(stats)
        index = self.index(stats)
        forced = np.isposinf(index)
        best = _best(index, forced)
        count = best.sum(axis=1, keepdims=True)
        law = best / np.maximum(count, 1)
        return np.where(forced.any(axis=1, keepdims=True) | (count == 0), np.nan, law)


def plain_argmax(rows: list[list[float]], rng: np.random.Generator) -> Choice | None:
    """``uniform_among(_best(...))`` for rows with no arm forced, without NumPy's per-call overhead (at a
    few arms most of a decision's policy call is the dozen array operations of those two):
    the same ties (TIE_RTOL, in the same float arithmetic), the same R·K uniforms, the same arms. None, and
    nothing drawn, where the array rule must decide: an arm to explore (+inf) or a nan index."""
    if not all(value < math.inf for row in rows for value in row):
        return None
    arms, propensities, probabilities = [], [], []
    for row, keys in zip(rows, rng.random((len(rows), len(rows[0]))).tolist(), strict=True):
        top = max(row)
        floor = top - TIE_RTOL * abs(top)
        best = [value >= floor for value in row]
        count = sum(best)
        arms.append(max(range(len(row)), key=lambda k: keys[k] if best[k] else -1.0))  # the first, as argmax
        propensities.append(1.0 / count)
        probabilities.append([1.0 / count if chosen else 0.0 for chosen in best])
    return Choice(np.array(arms, dtype=np.int64), np.array(propensities), np.array(probabilities))


def _best(index: np.ndarray, forced: np.ndarray) -> np.ndarray:
    """(R, K) the finite indices within TIE_RTOL of each row's best."""
    finite = np.where(forced, -np.inf, index)
    top = finite.max(axis=1, keepdims=True)
    return finite >= top - TIE_RTOL * np.abs(top)


class IndexPolicy(ArgmaxPolicy):
    """Optimistic index policies: forced exploration first, then the argmax of the index (Vernade et al., Alg. 1)."""

    reports_probabilities: ClassVar[bool] = True
    PARAMS: ClassVar[Mapping[str, Param]] = {"epsilon": Param(float, 0.0, 0.0)}

    @abstractmethod
    def bound(self, estimate: Array, stats: ArmStats, effective: Array, beta: Array) -> Array:
        """The index of explored arms (inputs of unexplored ones are placeholders, overwritten by +inf)."""

    def index(self, stats: ArmStats) -> np.ndarray:
        """+inf where an arm was never pulled or its effective count is at most EPS_N (never clamp Ñ)."""
        effective = self.effective_pulls(stats)
        fresh = (np.asarray(stats.pulls) <= 0) | (effective <= EPS_N)
        estimate = np.where(fresh, 0.0, self.estimate(stats))
        beta = exploration(stats.t, self._params["epsilon"])[:, None]
        values = self.bound(estimate, stats, np.where(fresh, 1.0, effective), beta)
        return np.where(fresh, np.inf, values)
