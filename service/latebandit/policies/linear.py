"""Delayed linear (contextual) bandits: OTFLinUCB and OTFLinTS of Vernade et al. (ICML 2020) and the
delay-naive LinUCB (docs/algorithms/linear.md).

Each round offers K action vectors in R^d (per run: shape (R, K, d)); one is played and converts with
probability θᵀa, revealed after a random delay, censored at the window m. All three policies share the
pending-as-0 ridge estimate θ̂ = V⁻¹b, V = λI + Σ AAᵀ over every decision, b = Σ A over counted conversions,
which estimates τ_m·θ (τ_m = P(D <= m) scales every action alike, so the argmax needs no delay model).
OTFLinUCB only widens LinUCB's interval by the window term S (the bias the still-pending decisions can
cause); OTFLinTS inflates a Gaussian posterior by the window's leverages.

What is kept, as sums that commute (so replicas, replays and Redis can add them in any order):
- per campaign: Σ AAᵀ (d² floats), b (d), the decision count, and over the decisions inside the window
  their count and the sum of each one's ``footprint`` (one float), plus Σ AAᵀ over the window (d²) for
  the ``cs`` correction; the ``exact`` correction needs the window's vectors themselves (simulator only);
- per decision, until it leaves the window: its features A (d floats, what its conversion adds to b) and
  its footprint (the number ``choose`` returns; what it adds to the window sum, removed when it leaves).

What a decision needs from those sums and not from its actions can be computed ahead (``prepare``: θ̂, V⁻¹
and an index's width coefficient, PreparedIndex), once for every decision at the same sums: the service
keeps it per state version, so that a decision computes only its own actions' products.
"""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from latebandit.policies.base import TIE_RTOL, Array, Param, _best, uniform_among

# Rank-one updates an inverse takes (Inverses.with_decisions) before it is inverted afresh: each adds rounding of
# order d·ε, so that an updated V⁻¹ still scores as a fresh one does to about 1e-12.
FRESH_EVERY = 256


def sherman_morrison(inverse: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, float]:
    """In place, V⁻¹ (d, d) becomes (V + aaᵀ)⁻¹ = V⁻¹ − uuᵀ/(1 + aᵀu), O(d²) (uuᵀ is symmetric to the last bit,
    so V⁻¹ stays so); returns u = V⁻¹a and 1 + aᵀu, which θ̂'s own update needs."""
    u = inverse @ a
    scale = 1.0 + float(a @ u)
    update = u[:, None] * u
    update /= scale
    inverse -= update
    return u, scale


class Inverses:
    """V⁻¹ = (λI + gram)⁻¹ of every run, memoised per λ beside the gram it inverts (LinearStats, and the store's
    LinearSums, whose gram is never changed in place): a policy call inverts V once per state read, not once
    per decision, and each decision added since updates it by Sherman–Morrison, O(d²) instead of O(d³)."""

    def __init__(self, entries: dict[float, tuple[np.ndarray, int]] | None = None) -> None:
        self._entries = entries if entries is not None else {}  # λ -> (V⁻¹ (R, d, d), updates since inverted)
        self._factors: dict[float, np.ndarray] = {}  # λ -> L, LLᵀ = V⁻¹ (Thompson sampling's draw and propensity)

    def of(self, gram: np.ndarray, ridge: float) -> np.ndarray:
        """V⁻¹ for ``gram``, the one this memo sits beside (computed at the first call for ``ridge``)."""
        entry = self._entries.get(ridge)
        if entry is not None:
            return entry[0]
        gram = np.asarray(gram, dtype=np.float64)
        inverse = np.linalg.inv(gram + ridge * np.eye(gram.shape[-1]))
        inverse = 0.5 * (inverse + np.swapaxes(inverse, 1, 2))  # symmetric to the last bit: Cholesky-safe
        self._entries[ridge] = (inverse, 0)
        return inverse

    def factor(self, gram: np.ndarray, ridge: float) -> np.ndarray:
        """The Cholesky factor of V⁻¹, once per gram: a Thompson decision's draw and its propensity share it."""
        factor = self._factors.get(ridge)
        if factor is None:
            factor = self._factors[ridge] = np.linalg.cholesky(self.of(gram, ridge))
        return factor

    def with_decisions(self, decisions: Iterable[tuple[int, Array]]) -> Inverses:
        """The memo of the gram plus a·aᵀ in run r for each (r, a) in turn: each inverse held updated by
        Sherman–Morrison, V⁻¹ − uuᵀ/(1 + aᵀu) with u = V⁻¹a (symmetric to the last bit as V⁻¹ is), or dropped
        once it has taken FRESH_EVERY updates, or when more than d/8 come at once (the next call inverts afresh:
        measured, an update costs 7 µs at d = 20 and 10 µs at d = 50, an inversion 17 and 59 µs)."""
        added = [(run, np.asarray(features, dtype=np.float64)) for run, features in decisions]
        entries = {}
        for ridge, (inverse, updates) in self._entries.items():
            if updates + len(added) <= FRESH_EVERY and len(added) <= max(1, inverse.shape[-1] // 8):
                updated = inverse.copy()
                for run, a in added:
                    sherman_morrison(updated[run], a)
                entries[ridge] = (updated, updates + len(added))
        return Inverses(entries)

    def on_runs(self, runs: Sequence[int]) -> Inverses:
        """The memo of these runs' grams alone, in that order (LinearStats.on_runs)."""
        index = list(runs)
        return Inverses({ridge: (inverse[index], n) for ridge, (inverse, n) in self._entries.items()})


@dataclass(frozen=True)
class LinearStats:
    """The sums a linear policy decides from; the leading axis is the run (R = 1 in the service). The arrays
    are never changed in place (``inverses`` holds what is computed from ``gram``)."""

    gram: np.ndarray  # (R, d, d) Σ A_s A_sᵀ over every recorded decision (no ridge: λ is the policy's)
    reward: np.ndarray  # (R, d) b = Σ A_s over decisions whose conversion counted (delay <= m, seen)
    decisions: np.ndarray  # (R,) decisions recorded: t − 1 at decision t
    window_count: np.ndarray  # (R,) decisions inside the window (the last m rounds)
    window_footprint: np.ndarray  # (R,) Σ over the window of each decision's footprint (LinearChoice)
    window_gram: np.ndarray | None = None  # (R, d, d) Σ A_s A_sᵀ over the window: correction "cs"
    window_actions: np.ndarray | None = None  # (R, P, d) the window's vectors: correction "exact" (simulator)
    inverses: Inverses = field(default_factory=Inverses, compare=False, repr=False)

    def __post_init__(self) -> None:
        runs, d = np.shape(self.reward)
        if np.shape(self.gram) != (runs, d, d):
            raise ValueError("gram must be (runs, d, d) beside a (runs, d) reward")
        for name in ("decisions", "window_count", "window_footprint"):
            if np.shape(getattr(self, name)) != (runs,):
                raise ValueError(f"{name} must hold one number per run")
        if self.window_gram is not None and np.shape(self.window_gram) != (runs, d, d):
            raise ValueError("window_gram must be (runs, d, d)")
        if self.window_actions is not None and np.shape(self.window_actions)[::2] != (runs, d):
            raise ValueError("window_actions must be (runs, decisions in the window, d)")

    @classmethod
    def empty(cls, runs: int, d: int) -> LinearStats:
        """Nothing recorded yet, with every optional sum present (zero)."""
        zeros = np.zeros(runs)
        return cls(np.zeros((runs, d, d)), np.zeros((runs, d)), zeros, zeros, zeros, np.zeros((runs, d, d)),
                   np.zeros((runs, 0, d)))  # fmt: skip

    @property
    def d(self) -> int:
        return int(np.shape(self.reward)[1])

    def with_decision(self, run: int, features: Array, footprint: float) -> LinearStats:
        """These sums with one more decision of ``run`` inside the window (the service's next decision of a
        group sees the ones before it), their inverses updated; the window's vectors and Σ AAᵀ are not kept."""
        gram, one = self.gram.copy(), np.zeros(len(self.decisions))
        gram[run] += np.outer(features, features)
        one[run] = 1.0
        return LinearStats(
            gram, self.reward, self.decisions + one, self.window_count + one, self.window_footprint + footprint * one,
            inverses=self.inverses.with_decisions([(run, features)]),
        )  # fmt: skip

    def on_runs(self, runs: Sequence[int]) -> LinearStats:
        """These runs' sums alone, in that order: one arm's (R = 1), or a context campaign's active arms (the
        blocks its policy chooses among)."""
        index = list(runs)
        window_gram, window_actions = (None if part is None else part[index]
                                       for part in (self.window_gram, self.window_actions))  # fmt: skip
        return LinearStats(
            self.gram[index], self.reward[index], self.decisions[index], self.window_count[index],
            self.window_footprint[index], window_gram, window_actions, self.inverses.on_runs(index),
        )  # fmt: skip


@dataclass(frozen=True)
class LinearChoice:
    action: np.ndarray  # (R,) int64, the index of the chosen action among the round's K
    propensity: np.ndarray  # (R,) its probability (1/#ties for UCB; an estimate for Thompson sampling)
    # (R,) what this decision adds to ``window_footprint`` while it is inside the window: a number frozen at
    # decision time from the V it was scored against (0 for a policy that reads no window sum)
    footprint: np.ndarray


@dataclass(frozen=True)
class Ridge:
    """θ̂ = V⁻¹b with V = ridge·I + Σ AAᵀ, for every run."""

    inverse: np.ndarray  # (R, d, d) V⁻¹
    theta: np.ndarray  # (R, d) θ̂

    @classmethod
    def of(cls, stats: LinearStats, ridge: float) -> Ridge:
        inverse = stats.inverses.of(stats.gram, ridge)
        return cls(inverse, np.matmul(inverse, np.asarray(stats.reward, dtype=np.float64)[:, :, None])[:, :, 0])

    def leverage(self, actions: Array) -> Array:
        """(R, K) aᵀV⁻¹a, the squared V⁻¹-norm of each action (products, not einsum: a policy call is a few
        small array operations, where einsum's setup costs more than the arithmetic)."""
        return np.maximum(np.einsum("rkd,rkd->rk", np.matmul(actions, self.inverse), actions), 0.0)

    def estimate(self, actions: Array) -> Array:
        """(R, K) θ̂ᵀa: the within-window conversion rate τ_m·θᵀa, as of now (biased low by pending ones)."""
        return np.matmul(actions, self.theta[:, :, None])[:, :, 0]


def radius(decisions: Array, d: int, ridge: float, delta: float) -> Array:
    """f_{t,δ} = sqrt(λ) + sqrt(2 log(1/δ) + d log(1 + t/(dλ))), t = decisions already in V (the
    self-normalised radius of Abbasi-Yadkori et al., with the sqrt(λ) the regularised proof needs)."""
    t = np.asarray(decisions, dtype=np.float64)
    return math.sqrt(ridge) + np.sqrt(2.0 * math.log(1.0 / delta) + d * np.log1p(t / (d * ridge)))


def released_beta(decisions: Array, d: int, ridge: float, delta: float) -> Array:
    """β_t = 2 log(1/δ) + d log(1 + t/(λd)), the authors' released code's squared radius."""
    t = np.asarray(decisions, dtype=np.float64)
    return 2.0 * math.log(1.0 / delta) + d * np.log1p(t / (ridge * d))


def _on_every_block(stats: LinearStats, context: Array) -> Array:
    """(K, 1, d): the context as the one action of each block (arm) of ``stats``."""
    context = np.asarray(context, dtype=np.float64)
    return np.broadcast_to(context, (len(stats.decisions), 1, context.size))


def _argmax(values: Array, rng: np.random.Generator) -> tuple[Array, Array]:
    """(R,) each row's argmax, ties (within TIE_RTOL of the best) broken at random, and (R,) its chance, 1/#ties:
    the choice ``uniform_among`` makes among ``_best``'s candidates, from the same R·K uniforms, without the
    (R, K) probabilities that a linear choice does not report. One run (a service decision) is compared on
    Python floats, the same IEEE operations at a third of the cost of NumPy's on a few numbers; a row with a
    nan (whose Python max would depend on its order) takes the array path."""
    keys = rng.random(values.shape)
    if len(values) == 1 and not math.isnan(sum(row := values[0].tolist())):
        top = max(row)
        floor = top - TIE_RTOL * abs(top)
        tied = [k for k, value in enumerate(row) if value >= floor]
        if tied:
            drawn = keys[0].tolist()
            return np.array([max(tied, key=drawn.__getitem__)]), np.array([1.0 / len(tied)])
    ties = _best(values, np.zeros(values.shape, dtype=bool))
    return np.where(ties, keys, -1.0).argmax(axis=1), 1.0 / ties.sum(axis=1)


def _chosen(values: Array, action: Array) -> Array:
    return values[np.arange(action.size), action]


class ContextualPolicy(ABC):
    """A policy over each round's offered action vectors, from LinearStats and an injected generator.

    ``PARAMS`` are numbers (validated as the other policies' are); ``OPTIONS`` are named forms, the first
    of each tuple the default.
    """

    name: ClassVar[str]
    PARAMS: ClassVar[Mapping[str, Param]] = {}
    OPTIONS: ClassVar[Mapping[str, tuple[str, ...]]] = {}

    def __init__(self, **params: Any) -> None:
        known = {**self.PARAMS, **self.OPTIONS}
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise ValueError(
                f"policy {self.name!r} has no parameter {unknown[0]!r}; its parameters: {', '.join(known)}"
            )
        self._params: dict[str, Any] = {
            key: spec.resolve(self.name, key, params.get(key)) for key, spec in self.PARAMS.items()
        }
        for key, forms in self.OPTIONS.items():
            value = params.get(key, forms[0])
            if value not in forms:
                raise ValueError(f"policy {self.name!r}: {key} must be one of {', '.join(forms)} (got {value!r:.60})")
            self._params[key] = value

    def params(self) -> dict[str, Any]:
        """The resolved parameters, defaults included."""
        return dict(self._params)

    @property
    def needs_window_gram(self) -> bool:
        """Whether ``stats.window_gram`` must be given."""
        return False

    @property
    def needs_window_actions(self) -> bool:
        """Whether ``stats.window_actions`` must be given (the exact correction: not servable at scale)."""
        return False

    @abstractmethod
    def ridge(self) -> float:
        """λ of V = λI + Σ AAᵀ."""

    @abstractmethod
    def choose(self, stats: LinearStats, actions: Array, rng: np.random.Generator) -> LinearChoice:
        """The action of each run among ``actions`` (R, K, d), with its propensity and footprint."""

    def choose_actions(self, stats: LinearStats, actions: Array, rng: np.random.Generator) -> LinearChoice:
        """``choose`` drawing the same numbers, for a caller that logs no propensity (the simulator)."""
        return self.choose(stats, actions, rng)

    @abstractmethod
    def choose_arm(self, stats: LinearStats, context: Array, rng: np.random.Generator) -> LinearChoice:
        """The disjoint form (a parameter per arm, as LinUCB's of Li et al. 2010): ``stats`` holds one block
        per arm on its leading axis (each with its own V, b, decision count and window), ``context`` (d,) is
        every arm's features; the chosen action is an arm index (shape (1,)), its footprint the one its block's
        window adds."""

    def prepare(self, stats: LinearStats) -> PreparedModel:
        """What a decision at ``stats`` needs, computed once for every decision at them (PreparedModel); this
        default keeps the stats whole and calls the policy on them."""
        return PreparedStats(self, stats)

    def estimate(self, stats: LinearStats, actions: Array) -> Array:
        """(R, K) θ̂ᵀa, the within-window conversion rate of each action, as of now."""
        return Ridge.of(stats, self.ridge()).estimate(np.asarray(actions, dtype=np.float64))

    def policy_state(self, stats: LinearStats) -> dict[str, Any]:
        """The model for GET /state (R = 1)."""
        ridge = Ridge.of(stats, self.ridge())
        return {"theta": ridge.theta[0].tolist(), "decisions": int(stats.decisions[0]),
                "pending": int(stats.window_count[0])}  # fmt: skip


class LinUCBFamily(ContextualPolicy):
    """Optimistic indices on the pending-as-0 ridge estimate: argmax over the round's actions, ties at random."""

    PARAMS: ClassVar[Mapping[str, Param]] = {
        "alpha": Param(float, 1.0, 0.0),  # exploration scale; 1 = the paper's width
        "lam": Param(float, 1.0, 1e-12),  # ridge λ
        "delta": Param(float, 0.1, 1e-300, 1.0 - 1e-12),  # confidence δ of f_{t,δ}
    }

    def ridge(self) -> float:
        return float(self._params["lam"])

    @property
    def on_leverage(self) -> bool:
        """Whether the width is linear in aᵀV⁻¹a (the authors' released forms) rather than in ‖a‖_{V⁻¹}."""
        return False

    def released_offset(self) -> float:
        """What the released forms add to β_t under the square root (the authors' two codes differ)."""
        return math.sqrt(self.ridge())

    def confidence(self, decisions: Array, d: int) -> Array:
        """(R,) the width's coefficient before the window term and α: 2f_{t,δ}, or the released sqrt(β_t + …)."""
        lam, delta = self._params["lam"], self._params["delta"]
        if self.on_leverage:
            return np.sqrt(released_beta(decisions, d, lam, delta) + self.released_offset())
        return 2.0 * radius(decisions, d, lam, delta)

    def window_sum(self, stats: LinearStats, ridge: Ridge) -> Array:
        """(R,) S_t, the window term of the width (read from the window's footprint sum unless overridden)."""
        return self.footprint_sum(stats.window_footprint)

    def footprint_sum(self, window_footprint: Array) -> Array:
        """(R,) S_t from the window's footprint sum alone: 0 for a delay-naive index."""
        return np.zeros(np.shape(window_footprint))

    def coefficient(self, decisions: Array, d: int, window_sum: Array) -> Array:
        """(R,) c = α·(confidence + S_t): the width of an action is c·‖a‖_{V⁻¹}, or c·aᵀV⁻¹a ``on_leverage``.
        It does not depend on the actions, so a prepared model computes it once (PreparedIndex)."""
        return self._params["alpha"] * (self.confidence(decisions, d) + window_sum)

    def width(self, coefficient: Array, leverage: Array) -> Array:
        """(R, K) the exploration bonus added to θ̂ᵀa, from the (R,) coefficient and each action's aᵀV⁻¹a."""
        return coefficient[:, None] * (leverage if self.on_leverage else np.sqrt(leverage))

    def footprint(self, leverage: Array) -> Array:
        """(R,) the chosen action's window number, from its leverage q = aᵀV⁻¹a before it enters V."""
        return np.zeros(leverage.shape)

    @property
    def reads_window_vectors(self) -> bool:
        """Whether S_t reads the window's vectors (their Σ AAᵀ or themselves) beside V: not servable."""
        return self.needs_window_gram or self.needs_window_actions

    def prepare(self, stats: LinearStats) -> PreparedModel:
        """θ̂, V⁻¹ and the width's coefficient (PreparedIndex); the stats kept whole where S_t reads the
        window's vectors, which a decision added to a prepared model would not carry."""
        return PreparedStats(self, stats) if self.reads_window_vectors else PreparedIndex.of(self, stats)

    def index(self, stats: LinearStats, actions: Array) -> Array:
        """(R, K) θ̂ᵀa + the width."""
        return PreparedIndex.of(self, stats).index(actions)

    def choose(self, stats: LinearStats, actions: Array, rng: np.random.Generator) -> LinearChoice:
        return PreparedIndex.of(self, stats).choose(actions, rng)

    def choose_arm(self, stats: LinearStats, context: Array, rng: np.random.Generator) -> LinearChoice:
        return PreparedIndex.of(self, stats).choose_arm(context, rng)

    def policy_state(self, stats: LinearStats) -> dict[str, Any]:
        """Adds f_{t,δ}, the radius every width starts from."""
        f = radius(stats.decisions, stats.d, self.ridge(), self._params["delta"])
        return super().policy_state(stats) | {"f": float(f[0])}


class LinUCB(LinUCBFamily):
    """The delay-naive baseline: pending decisions read as 0, no correction. Paper form
    U(a) = θ̂ᵀa + α·2f_{t,δ}·‖a‖_{V⁻¹}; ``form: "released"`` is the authors' code's ablation (their
    ``OTFLinUCB-wrong``), α·sqrt(β_t + sqrt(λ))·aᵀV⁻¹a, kept to reproduce their numbers.

    >>> import numpy as np
    >>> from latebandit.policies.linear import LinearStats, make_contextual_policy
    >>> gram, reward = np.array([[[2.0, 0.0], [0.0, 1.0]]]), np.array([[1.0, 0.0]])  # e1, e2, e1 played
    >>> stats = LinearStats(gram, reward, np.array([3.0]), np.array([0.0]), np.array([0.0]))
    >>> actions = np.array([[[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]])
    >>> policy = make_contextual_policy("linucb", {})
    >>> policy.index(stats, actions).round(6).tolist(), policy.choose(stats, actions, np.random.default_rng(0)).action
    ([[4.417824, 5.002459, 4.892722]], array([1]))
    """

    name: ClassVar[str] = "linucb"
    OPTIONS: ClassVar[Mapping[str, tuple[str, ...]]] = {"form": ("paper", "released")}

    @property
    def on_leverage(self) -> bool:
        return self._params["form"] == "released"


class OTFLinUCB(LinUCBFamily):
    """OTFLinUCB: U(a) = θ̂ᵀa + α·(2f_{t,δ} + S_t)·‖a‖_{V⁻¹}, the UCB over the paper's Theorem 1 ellipsoid;
    S_t bounds the downward bias of the decisions still inside the window. ``correction`` is S's form:

    - ``frozen`` (default, servable): Σ_W n_s with n_s = ‖A_s‖_{V_{s+1}⁻¹} frozen when s was decided, an
      upper bound of the exact sum (V only grows) that costs one float per decision;
    - ``exact`` (the paper's): Σ_W ‖A_s‖_{V_t⁻¹}, O(P·d²) per decision: the simulator only;
    - ``cs``: sqrt(P·tr(V⁻¹M)), M = Σ_W A_sA_sᵀ (Cauchy–Schwarz), O(d²) per decision;
    - ``none``: S = 0, i.e. ``linucb``;
    - ``released``: the authors' code (kept to reproduce their numbers): width
      α·(sqrt(β_t + λ) + Σ_W q_s)·aᵀV⁻¹a, q_s = A_sᵀV_s⁻¹A_s frozen before A_s entered V.

    >>> import numpy as np
    >>> from latebandit.policies.linear import LinearStats, make_contextual_policy
    >>> gram, reward = np.array([[[2.0, 0.0], [0.0, 1.0]]]), np.array([[1.0, 0.0]])  # e1, e2, e1 played
    >>> window = np.array([[[0.0, 1.0], [1.0, 0.0]]])  # m = 2: the last two decisions, e2 and e1
    >>> stats = LinearStats(gram, reward, np.array([3.0]), np.array([2.0]), np.array([0.0]), window_actions=window)
    >>> actions = np.array([[[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]])
    >>> policy = make_contextual_policy("otf-linucb", {"correction": "exact"})
    >>> policy.index(stats, actions).round(6).tolist(), policy.choose(stats, actions, np.random.default_rng(0)).action
    ([[5.159405, 5.910707, 5.744735]], array([1]))
    """

    name: ClassVar[str] = "otf-linucb"
    OPTIONS: ClassVar[Mapping[str, tuple[str, ...]]] = {"correction": ("frozen", "exact", "cs", "none", "released")}

    @property
    def needs_window_gram(self) -> bool:
        return self._params["correction"] == "cs"

    @property
    def needs_window_actions(self) -> bool:
        return self._params["correction"] == "exact"

    @property
    def on_leverage(self) -> bool:
        return self._params["correction"] == "released"

    def released_offset(self) -> float:
        return self.ridge()

    def window_sum(self, stats: LinearStats, ridge: Ridge) -> Array:
        """(R,) S_t in the configured form (the released form's Σq for ``released``)."""
        correction = self._params["correction"]
        if correction == "exact":
            if stats.window_actions is None:
                raise ValueError("correction 'exact' needs the window's actions (LinearStats.window_actions)")
            return np.sqrt(ridge.leverage(np.asarray(stats.window_actions, dtype=np.float64))).sum(axis=1)
        if correction == "cs":
            if stats.window_gram is None:
                raise ValueError("correction 'cs' needs the window's Σ AAᵀ (LinearStats.window_gram)")
            trace = np.einsum("rde,red->r", ridge.inverse, np.asarray(stats.window_gram, dtype=np.float64))
            return np.sqrt(np.asarray(stats.window_count, dtype=np.float64) * np.maximum(trace, 0.0))
        return self.footprint_sum(stats.window_footprint)

    def footprint_sum(self, window_footprint: Array) -> Array:
        """The frozen and released forms' S_t is the footprint sum itself; ``none``'s 0 (``exact`` and ``cs``
        read the window's vectors instead: ``window_sum``)."""
        if self._params["correction"] in ("frozen", "released"):
            return np.asarray(window_footprint, dtype=np.float64)
        return super().footprint_sum(window_footprint)

    def footprint(self, leverage: Array) -> Array:
        """n_s = ‖A‖_{V_{s+1}⁻¹} = sqrt(q/(1+q)) by Sherman–Morrison (frozen); q itself for ``released``."""
        correction = self._params["correction"]
        if correction == "released":
            return leverage
        if correction == "frozen":
            return np.sqrt(leverage / (1.0 + leverage))
        return np.zeros(leverage.shape)

    def policy_state(self, stats: LinearStats) -> dict[str, Any]:
        """Adds S_t, whose ratio to 2f is the correction's share of the width (spec: alert above 3)."""
        return super().policy_state(stats) | {
            "window_sum": float(self.window_sum(stats, Ridge.of(stats, self.ridge()))[0]),
            "correction": self._params["correction"],
        }


class OTFLinTS(ContextualPolicy):
    """OTFLinTS: play argmax θ̃ᵀa with θ̃ ~ N(θ̂, c_t·V⁻¹), V = σ0²I + Σ AAᵀ, c_t = σ0 + Σ_W n_s, where
    n_s = ‖A_s‖²_{V_{s+1}⁻¹} is frozen when s was decided (the window's leverages: the information whose
    outcomes are still partly missing). ``form: "released"`` divides each n_s by the c in force when it was
    played, as the authors' code does (up to its one-decision shift of the window). The inflation is
    unit-scale: at conversion rates of a few percent it makes the posterior many times too wide.

    The propensity is an estimate from ``propensity_samples`` draws of a generator seeded by the posterior
    and the actions (so the same state logs the same number, and the decision's generator is not touched).

    >>> import numpy as np
    >>> from latebandit.policies.linear import LinearStats, make_contextual_policy
    >>> gram, reward = np.array([[[2.0, 0.0], [0.0, 1.0]]]), np.array([[1.0, 0.0]])  # e1, e2, e1 played
    >>> window = np.array([0.8 + 0.444444])  # m = 2: frozen ‖A_s‖² of the last two decisions
    >>> stats = LinearStats(gram, reward, np.array([3.0]), np.array([2.0]), window)
    >>> actions = np.array([[[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]])
    >>> choice = make_contextual_policy("otf-lints", {}).choose(stats, actions, np.random.default_rng(0))
    >>> choice.action.tolist(), round(float(choice.propensity[0]), 1), choice.footprint.round(6).tolist()
    ([0], 0.6, [0.307692])
    """

    name: ClassVar[str] = "otf-lints"
    PARAMS: ClassVar[Mapping[str, Param]] = {
        "sigma0": Param(float, 0.5, 1e-6),  # ridge σ0² and the inflation's base σ0
        "propensity_samples": Param(int, 1000, 1, 1_000_000),
    }
    OPTIONS: ClassVar[Mapping[str, tuple[str, ...]]] = {"form": ("normalised", "released")}

    def ridge(self) -> float:
        return float(self._params["sigma0"]) ** 2

    def prepare(self, stats: LinearStats) -> PreparedModel:
        """The stats kept whole, V⁻¹'s Cholesky factor computed now (memoised beside the gram): the draw and
        the propensity need it, and a decision prepared ahead of its request need not wait for it."""
        stats.inverses.factor(stats.gram, self.ridge())
        return PreparedStats(self, stats)

    def inflation(self, stats: LinearStats) -> Array:
        """(R,) c_t = σ0 + the window's footprints."""
        return self._params["sigma0"] + np.asarray(stats.window_footprint, dtype=np.float64)

    def _sample(self, stats: LinearStats, actions: Array, rng: np.random.Generator) -> tuple[Ridge, Array, Array]:
        """The posterior, c_t and (R, K) the scores θ̃ᵀa of one draw θ̃ = θ̂ + sqrt(c)·L·z, LLᵀ = V⁻¹."""
        ridge = Ridge.of(stats, self.ridge())
        c = self.inflation(stats)
        z = rng.standard_normal(ridge.theta.shape)
        factor = stats.inverses.factor(stats.gram, self.ridge())
        theta = ridge.theta + np.sqrt(c)[:, None] * np.einsum("rde,re->rd", factor, z)
        return ridge, c, np.einsum("rkd,rd->rk", actions, theta)

    def _decide(self, stats: LinearStats, actions: Array, rng: np.random.Generator) -> tuple[Array, Array]:
        """(R,) the actions of one posterior draw, and their footprints."""
        actions = np.asarray(actions, dtype=np.float64)
        ridge, c, scores = self._sample(stats, actions, rng)
        action, _ = _argmax(scores, rng)
        leverage = _chosen(ridge.leverage(actions), action)
        footprint = leverage / (1.0 + leverage)  # ‖A‖²_{V_{s+1}⁻¹} by Sherman–Morrison
        return action, footprint / c if self._params["form"] == "released" else footprint

    def choose(self, stats: LinearStats, actions: Array, rng: np.random.Generator) -> LinearChoice:
        action, footprint = self._decide(stats, actions, rng)
        return LinearChoice(action, self.propensity(stats, actions, action), footprint)

    def choose_actions(self, stats: LinearStats, actions: Array, rng: np.random.Generator) -> LinearChoice:
        """The same draws and actions as ``choose``; propensity nan (not estimated)."""
        action, footprint = self._decide(stats, actions, rng)
        return LinearChoice(action, np.full(action.shape, np.nan), footprint)

    def choose_arm(self, stats: LinearStats, context: Array, rng: np.random.Generator) -> LinearChoice:
        """Each arm's score θ̃_kᵀx is a normal draw N(θ̂_kᵀx, c_k·q_k): the propensity is estimated from
        ``propensity_samples`` draws of those K normals (seeded by them, as ``propensity`` is)."""
        actions = _on_every_block(stats, context)
        ridge, c, scores = self._sample(stats, actions, rng)
        arm, _ = _argmax(scores[:, 0][None, :], rng)
        leverage = ridge.leverage(actions)[:, 0]
        mean, spread = ridge.estimate(actions)[:, 0], np.sqrt(c * leverage)
        digest = hashlib.blake2b(np.concatenate([mean, spread]).tobytes(), digest_size=16).digest()
        draws = np.random.default_rng(int.from_bytes(digest, "little")).standard_normal(
            (self._params["propensity_samples"], len(c))
        )
        hits = np.count_nonzero((mean + spread * draws).argmax(axis=1) == arm[0])
        propensity = (hits + 1.0 / len(c)) / (self._params["propensity_samples"] + 1.0)
        footprint = leverage[arm] / (1.0 + leverage[arm])
        released = self._params["form"] == "released"
        return LinearChoice(arm, np.array([propensity]), footprint / c[arm] if released else footprint)

    def propensity(self, stats: LinearStats, actions: Array, action: Array) -> Array:
        """(R,) the chance of each run's ``action`` under the sampling law, estimated as (hits + 1/K)/(M + 1)
        from M = propensity_samples draws (never 0, which inverse-propensity replays divide by)."""
        actions = np.asarray(actions, dtype=np.float64)
        samples = self._params["propensity_samples"]
        ridge = Ridge.of(stats, self.ridge())
        c = self.inflation(stats)
        factor = stats.inverses.factor(stats.gram, self.ridge())
        out = np.empty(action.shape)
        for r in range(action.size):
            digest = hashlib.blake2b(
                np.concatenate([ridge.theta[r], ridge.inverse[r].ravel(), c[r : r + 1], actions[r].ravel()]).tobytes(),
                digest_size=16,
            ).digest()
            z = np.random.default_rng(int.from_bytes(digest, "little")).standard_normal((samples, stats.d))
            draws = ridge.theta[r] + math.sqrt(c[r]) * z @ factor[r].T
            hits = np.count_nonzero((draws @ actions[r].T).argmax(axis=1) == action[r])
            out[r] = (hits + 1.0 / actions.shape[1]) / (samples + 1.0)
        return out

    def policy_state(self, stats: LinearStats) -> dict[str, Any]:
        """Adds c_t, the posterior's inflation."""
        return super().policy_state(stats) | {"inflation": float(self.inflation(stats)[0])}


class UniformActions(ContextualPolicy):
    """Every offered action with probability 1/K: the scale of a simulation (its regret is the average gap).

    >>> import numpy as np
    >>> from latebandit.policies.linear import LinearStats, make_contextual_policy
    >>> actions = np.array([[[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]])
    >>> policy = make_contextual_policy("uniform", {})
    >>> choice = policy.choose(LinearStats.empty(1, 2), actions, np.random.default_rng(0))
    >>> choice.action.tolist(), choice.propensity.tolist()
    ([0], [0.3333333333333333])
    """

    name: ClassVar[str] = "uniform"

    def ridge(self) -> float:
        return 1.0

    def choose(self, stats: LinearStats, actions: Array, rng: np.random.Generator) -> LinearChoice:
        picked = uniform_among(np.ones(np.shape(actions)[:2], dtype=bool), rng)
        return LinearChoice(picked.arm, picked.propensity, np.zeros(picked.arm.shape))

    def choose_arm(self, stats: LinearStats, context: Array, rng: np.random.Generator) -> LinearChoice:
        picked = uniform_among(np.ones((1, len(stats.decisions)), dtype=bool), rng)
        return LinearChoice(picked.arm, picked.propensity, np.zeros(1))


class PreparedModel(ABC):
    """What a contextual policy decides from at one LinearStats, everything that does not depend on the
    request's actions computed ahead (``ContextualPolicy.prepare``): the service keeps one per campaign and
    state version, so that a decision costs its actions' few products (engine/contextual.py). Its calls give
    what the policy's own give on those stats, drawing the same numbers from ``rng``."""

    @abstractmethod
    def choose(self, actions: Array, rng: np.random.Generator) -> LinearChoice:
        """``policy.choose(stats, actions, rng)``: the action of each run among ``actions`` (R, K, d)."""

    @abstractmethod
    def choose_arm(self, context: Array, rng: np.random.Generator) -> LinearChoice:
        """``policy.choose_arm(stats, context, rng)``: the arm (block) for ``context`` (d,)."""

    @abstractmethod
    def with_decision(self, block: int, features: Array, footprint: float) -> PreparedModel:
        """The model prepared from ``stats.with_decision(block, features, footprint)``: the next decision of a
        group sees the ones before it."""


@dataclass(frozen=True)
class PreparedStats(PreparedModel):
    """The stats kept whole and the policy called on them: Thompson sampling (its draw and propensity read V⁻¹
    and its Cholesky factor, both memoised beside the gram), the corrections that read the window's vectors,
    the uniform policy."""

    policy: ContextualPolicy
    stats: LinearStats

    def choose(self, actions: Array, rng: np.random.Generator) -> LinearChoice:
        return self.policy.choose(self.stats, actions, rng)

    def choose_arm(self, context: Array, rng: np.random.Generator) -> LinearChoice:
        return self.policy.choose_arm(self.stats, context, rng)

    def with_decision(self, block: int, features: Array, footprint: float) -> PreparedStats:
        return PreparedStats(self.policy, self.stats.with_decision(block, features, footprint))


@dataclass(frozen=True)
class PreparedIndex(PreparedModel):
    """An optimistic index's decision state: per block θ̂ and V⁻¹ (Ridge) and the width's coefficient c
    (LinUCBFamily.coefficient), so that an index is θ̂ᵀa + c·‖a‖_{V⁻¹} (c·aᵀV⁻¹a on leverage) and a decision
    computes only its actions' products. The decision count and the window's footprint sum, which c is
    computed from, are kept to recompute it as decisions are added. The stats-based calls of LinUCBFamily go
    through it too: one formula, whether prepared ahead or at the call."""

    policy: LinUCBFamily
    ridge: Ridge
    decisions: np.ndarray  # (R,) the stats' decision count
    window_footprint: np.ndarray  # (R,) their window's footprint sum
    coefficient: np.ndarray  # (R,) c

    @classmethod
    def of(cls, policy: LinUCBFamily, stats: LinearStats) -> PreparedIndex:
        ridge = Ridge.of(stats, policy.ridge())
        coefficient = policy.coefficient(stats.decisions, stats.d, policy.window_sum(stats, ridge))
        decisions = np.asarray(stats.decisions, dtype=np.float64)
        return cls(policy, ridge, decisions, np.asarray(stats.window_footprint, dtype=np.float64), coefficient)

    def index(self, actions: Array) -> Array:
        """(R, K) θ̂ᵀa + the width of ``actions`` (R, K, d)."""
        actions = np.asarray(actions, dtype=np.float64)
        return self.ridge.estimate(actions) + self.policy.width(self.coefficient, self.ridge.leverage(actions))

    def choose(self, actions: Array, rng: np.random.Generator) -> LinearChoice:
        """The argmax of the index, ties at random (R·K uniforms)."""
        actions = np.asarray(actions, dtype=np.float64)
        leverage = self.ridge.leverage(actions)
        action, propensity = _argmax(self.ridge.estimate(actions) + self.policy.width(self.coefficient, leverage), rng)
        return LinearChoice(action, propensity, self.policy.footprint(_chosen(leverage, action)))

    def choose_arm(self, context: Array, rng: np.random.Generator) -> LinearChoice:
        """The context scored in every block: each arm's index with its own θ̂, V⁻¹ and c."""
        x = np.asarray(context, dtype=np.float64)
        leverage = np.maximum(np.matmul(self.ridge.inverse, x) @ x, 0.0)
        index = self.ridge.theta @ x + self.policy.width(self.coefficient, leverage[:, None])[:, 0]
        arm, propensity = _argmax(index[None, :], rng)
        return LinearChoice(arm, propensity, self.policy.footprint(leverage[arm]))

    def with_decision(self, block: int, features: Array, footprint: float) -> PreparedIndex:
        """Sherman–Morrison on the block's V⁻¹ and θ̂ (u = V⁻¹a: V⁻¹ − uuᵀ/(1 + aᵀu), θ̂ − u·aᵀθ̂/(1 + aᵀu),
        the same b), O(d²); its decision count and footprint sum grow, and c is recomputed from them."""
        assert not self.policy.reads_window_vectors, "prepare() keeps such a policy's stats whole (PreparedStats)"
        a = np.asarray(features, dtype=np.float64)
        inverse, theta = self.ridge.inverse.copy(), self.ridge.theta.copy()
        u, scale = sherman_morrison(inverse[block], a)
        theta[block] -= u * (float(a @ theta[block]) / scale)
        decisions, window_footprint = self.decisions.copy(), self.window_footprint.copy()
        decisions[block] += 1.0
        window_footprint[block] += footprint
        coefficient = self.policy.coefficient(decisions, a.size, self.policy.footprint_sum(window_footprint))
        return PreparedIndex(self.policy, Ridge(inverse, theta), decisions, window_footprint, coefficient)


# The policies a contextual campaign serves; ``uniform`` is also accepted where contextual policies are made.
CONTEXTUAL_POLICIES: dict[str, type[ContextualPolicy]] = {cls.name: cls for cls in (LinUCB, OTFLinUCB, OTFLinTS)}


def make_contextual_policy(name: object, params: Mapping[str, Any]) -> ContextualPolicy:
    """The named contextual policy with validated params; ValueError naming what is wrong."""
    known: dict[str, type[ContextualPolicy]] = {**CONTEXTUAL_POLICIES, UniformActions.name: UniformActions}
    cls = known.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"unknown contextual policy {name!r}; known: {', '.join(sorted(known))}")
    if not isinstance(params, Mapping) or not all(isinstance(key, str) for key in params):
        raise ValueError(f"policy {name!r}: params must be an object with string keys")
    return cls(**params)
