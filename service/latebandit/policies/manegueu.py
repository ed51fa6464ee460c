"""PatientBandits and Adapt-PatientBandits of Manegueu, Vernade, Carpentier & Valko (ICML 2020), as
their Algorithms 1 and 2 (docs/algorithms/manegueu.md says how the service runs them).

Arm-dependent, possibly heavy-tailed delays and no CDF: the estimate is the pessimistic S/N (a pending pull
counts as a zero) and the index adds a bound on that downward bias,

    U_i = S_i/N_i + sqrt(2κ·L/N_i) + B_i,   L = log(2K·T³)  (anytime: T = the decision count t),

or by default its multiplicative form min(1, (S_i/N_i + sqrt(2κ·L/N_i))/(1 − B_i)) (§2.7 e, PatientBandits).

Two bias bounds B_i (param ``age_aware``):

- 0, the paper's 2·N_i^−min(α, 1/2) (Theorem 1). Valid only when time counts in rounds, with one pull per
  round and the tail bound P(D > m) <= m^−α stated in rounds (§3.1): the simulator's reproductions use it.
- 1 (default), the age-aware bound min(1, W_i/N_i), W_i = Σ_{pulls of i in the window} ψ(age), with the
  envelope ψ(a) = min(1, (a/scale)^−α) (§2.7 b, §3.1). Valid in any unit, hence the service's default; the
  caller supplies W_i (ArmStats.tail_weight) for the envelope ``envelope()`` returns. Pulls older than the
  window carry no bias towards the censored target μ_i·τ_i(m) (§3.5), so only the window is summed. The sum is
  over every pull, converted or not: a pending pull's posterior missing mass can exceed ψ (§2.7 b).

Adapt-PatientBandits plugs a data-driven α_t >= α_lo into the same index (Algorithm 2). Read literally
(``estimator`` 0), α_t is the paper's lower confidence bound from the fraction of the most-pulled arm's
rewards revealed with delay in (d_t, D_t]; with the paper's constants that bound stays below α_lo at every
realistic horizon (§2.4: its correction is 5.73/log T̄, still 0.62 at T̄ = 10⁴), so the policy is exactly
PatientBandits(α_lo), the most pessimistic α allowed. That estimator also needs per-pull delays and round
ages, which the service does not keep: it runs in the simulator only (``needs_band``), where the
reproduction `manegueu2020-fig6` shows the collapse. ``estimator`` 1 (default) does what §3.6 recommends
instead: estimate the tail from the observed delays (the grouped Hill estimate of service/latebandit/delays/tail.py, per
arm), take its lower confidence bound α̂ − 2·se on the heaviest-tailed arm, and never go below α_lo. It reads
the per-arm delay histogram the service keeps anyway, so it runs in both. Its α̂ is biased upwards while long
delays are still unobserved (delays/tail.py), which is why the bound is floored at α_lo and capped at 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np

from latebandit.delays.models import DelayModel
from latebandit.delays.span import envelope_scale, reach, tightest_envelope
from latebandit.delays.tail import tail_exponent
from latebandit.policies.base import SMALL_ARGMAX, ArgmaxPolicy, ArmStats, Array, Envelope, Param, Setting

ALPHA_CAP = 1.0  # α̂ <= 1 in Algorithm 2; beyond, the paper's term no longer changes (β = min(α, 1/2))
ENVELOPE_ALPHAS = np.round(np.arange(0.05, 4.0 + 1e-9, 0.05), 2)  # the α a delay model's default envelope may take
HOEFFDING_KAPPA = 0.25  # sqrt(2κ·L/N) = sqrt(L/(2N)), Hoeffding's width for rewards in [0, 1]
LCB_Z = 2.0  # standard errors below the tail estimate (estimator 1)


@dataclass(frozen=True)
class BandQuery:
    """Algorithm 2's question about arm ``arm``: among its pulls at least ``late`` rounds old, how many, and
    how many revealed a reward with delay in (``early``, ``late``]? Arrays of one entry per run."""

    arm: np.ndarray
    early: np.ndarray  # d_t
    late: np.ndarray  # D_t


@lru_cache(maxsize=256)
def declared_envelope(model: DelayModel) -> tuple[float, float]:
    """The tightest envelope's (α, scale) for a declared delay model. Cached: it evaluates the CDF on a grid
    for every α (milliseconds), and a campaign's policy is built again at every load of its configuration,
    which the next /choose waits for."""
    return tightest_envelope(model, reach(model), ENVELOPE_ALPHAS)


@lru_cache(maxsize=1024)
def declared_scale(model: DelayModel, alpha: float) -> float:
    """``envelope_scale`` up to the model's reach, cached for the same reason."""
    return envelope_scale(model, alpha, reach(model))


class PatientBandits(ArgmaxPolicy):
    """PatientBandits (Algorithm 1): each arm once, then the argmax of the index in the module docstring.

    Params (defaults in brackets):

    - ``alpha`` [from the delay model; 0.5 without one]: a lower bound on every arm's tail exponent,
      P(D > a) <= (a/scale)^−alpha. 0.5 is the largest value the paper's term distinguishes
      (β = min(α, 1/2)); lower it for heavier tails. With a declared delay model and neither ``alpha`` nor
      ``scale`` given, alpha and scale are those of the tightest envelope the model satisfies: of the valid
      ones (``scale`` below), the least area up to the model's mean delay (delays/span.py), since the
      age-aware bound is about that area over the age of an arm's pulls. A Pareto(α0, s0) model gives
      (α0, s0), which lies under every other valid envelope; an exponential of mean m gives 0.5, m/(2e).
    - ``scale`` [from the delay model; 3600 without one]: the age, in the campaign's time unit (seconds in
      the service, rounds in a scenario), below which a pull counts as entirely pending. With a declared
      delay model (every arm's, in a scenario) the default is the smallest s for which the model satisfies
      the tail bound P(D > a) <= (a/s)^−alpha at every age up to its reach (delays/span.py): Assumption 1 of
      the paper with time counted in units of s, the constant form of §1.3. A larger s only over-states the
      bias and slows learning (with delays of about 100 rounds, 3600 cost twice the regret of 10); a smaller
      one under-states it, and the index is no longer a bound. Pareto(α0, s0) gives s0 for alpha <= α0; an
      exponential of mean m gives m·alpha/e.
    - ``age_aware`` [1]: the bias bound (module docstring); ``initial_pulls`` [1] per arm before the index.
    - ``multiplicative`` [1]: how the bias bound B enters the index. The pending pulls hide μ·B at most, not
      B (§2.7 e): on the good event S/N >= μ·(1 − B) − width, so μ <= (S/N + width)/(1 − B), capped at 1
      (1 while B >= 1); 0 is the paper's S/N + width + B. The paper's form over-states the bias by 1/μ: at
      conversion rates of a few percent, a pull's own weight ψ(0) = 1 raised its arm's index by about
      (1 − μ̂)/N, more than its width fell, so the arm just played stayed the argmax until its pulls aged
      (in the service on 5/4/3/2 % arms with Pareto delays: regret 3,852 against uniform's 3,004). Scaled,
      a fresh pull leaves S/(N − W) unchanged. The paper's reproductions set 0.
    - ``horizon`` [0: anytime, L = log(2K·t³)]; ``kappa`` [1/4]: the exploration scale of §2.7 d, the width
      sqrt(2κ·L/N). The paper's 1 (Theorem 1) is twice Hoeffding's width for rewards in [0, 1]; 1/4 is
      Hoeffding's own sqrt(log(2/δ)/(2N)) at the paper's δ = 1/(K·T³), still a confidence bound, so the
      proof's good event holds. With delays of about 100 rounds it cut the regret from 2.3x to 1.2x ucb1's
      (docs/algorithms/manegueu.md); the reproductions of the paper's figures set 1.

    >>> import numpy as np
    >>> from latebandit.policies import ArmStats, make_policy
    >>> stats = ArmStats(np.array([[100, 100, 100]]), np.array([[20.0, 50.0, 10.0]]), np.array([[80.0, 90.0, 70.0]]),
    ...                   np.array([301]), tail_weight=np.array([[5.0, 5.0, 5.0]]))  # W = Σ ψ(age)
    >>> policy = make_policy("patient-bandits", {}, 3)
    >>> policy.index(stats).round(3).tolist(), policy.choose(stats, np.random.default_rng(0)).arm.tolist()
    ([[0.534, 0.85, 0.429]], [1])
    """

    name: ClassVar[str] = "patient-bandits"
    # Its tail weight W grows with every pull: kept for 64 rounds, its law changed its regret measurably in
    # the simulator (Vernade's θH: 4 % lower), a departure from Algorithm 1 the others do not show.
    stands: ClassVar[bool] = False
    PARAMS: ClassVar[Mapping[str, Param]] = {
        "alpha": Param(float, 0.5, 1e-3, 10.0),
        "initial_pulls": Param(int, 1, 1, 1000),
        "scale": Param(float, 3600.0, 1e-6),
        "age_aware": Param(int, 1, 0, 1),
        "horizon": Param(int, 0, 0),
        "kappa": Param(float, HOEFFDING_KAPPA, 1e-3),
        "multiplicative": Param(int, 1, 0, 1),
    }

    def __init__(self, n_arms: int, setting: Setting | None = None, **params: Any) -> None:
        super().__init__(n_arms, setting, **params)
        declared = () if setting is None else setting.delays
        if params.get("scale") is not None or not declared or any(model.family == "unknown" for model in declared):
            return
        fits = [declared_envelope(model) for model in set(declared)]
        self.take_fitted_alpha(min(alpha for alpha, _ in fits), params)  # one α bounds every arm: the heaviest
        alpha = self.envelope_alpha()
        floor = self.PARAMS["scale"].minimum
        self._params["scale"] = max(floor, *(declared_scale(model, alpha) for model in set(declared)))

    def take_fitted_alpha(self, fitted: float, params: Mapping[str, Any]) -> None:
        """The tightest envelope's α for the declared delays becomes ``alpha`` unless the params give one."""
        if params.get("alpha") is None:
            self._params["alpha"] = fitted

    def envelope_alpha(self) -> float:
        """The largest tail exponent the envelope is used with: the scale derived for it holds for all smaller
        ones too (a·P(D > a)^(1/α) increases with α)."""
        return float(self._params["alpha"])

    def alpha(self, stats: ArmStats) -> np.ndarray:
        """(R,) the tail exponent used for this decision."""
        return np.full(np.shape(stats.pulls)[0], self._params["alpha"])

    def envelope(self, stats: ArmStats) -> Envelope | None:
        """ψ at α(stats) in the age-aware mode; None in the paper's mode (no ages needed)."""
        return Envelope(self.alpha(stats), self._params["scale"]) if self._params["age_aware"] else None

    def log_term(self, stats: ArmStats) -> np.ndarray:
        """(R, 1) L = log(2K·T³), T the horizon or, anytime, the round being decided."""
        return self._log_terms(stats.t)[:, None]

    def _log_terms(self, rounds: np.ndarray) -> np.ndarray:
        """(R,) L at each of these round indices t."""
        horizon = self._params["horizon"]
        t = np.full(np.shape(rounds), float(horizon)) if horizon else np.asarray(rounds, dtype=np.float64)
        return math.log(2.0 * self.n_arms) + 3.0 * np.log(np.maximum(t, 1.0))

    def bias(self, stats: ArmStats, pulls: Array) -> Array:
        """B_i: the paper's 2·N^−β, or the age-aware min(1, W/N)."""
        if not self._params["age_aware"]:
            beta = np.minimum(self.alpha(stats), 0.5)[:, None]
            return 2.0 * pulls ** (-beta)
        if stats.tail_weight is None:
            raise ValueError(f"policy {self.name!r} with age_aware = 1 needs the tail weights of its envelope")
        return np.minimum(1.0, np.asarray(stats.tail_weight, dtype=np.float64) / pulls)

    def policy_state(self, stats: ArmStats) -> dict[str, Any]:
        pulls = np.maximum(np.asarray(stats.pulls, dtype=np.float64), 1.0)
        return {"alpha": float(self.alpha(stats)[0]), "bias": self.bias(stats, pulls)[0].tolist()}

    def index(self, stats: ArmStats) -> np.ndarray:
        """+inf until an arm has its initial pulls (least-pulled first, ArgmaxPolicy.choose)."""
        raw = np.asarray(stats.pulls, dtype=np.float64)
        fresh = raw < self._params["initial_pulls"]
        pulls = np.where(raw > 0, raw, 1.0)
        estimate = np.asarray(stats.conversions, dtype=np.float64) / pulls
        width = np.sqrt(2.0 * self._params["kappa"] * self.log_term(stats) / pulls)
        bias = self.bias(stats, pulls)
        if not self._params["multiplicative"]:
            return np.where(fresh, np.inf, estimate + width + bias)
        with np.errstate(divide="ignore"):
            scaled = np.where(bias < 1.0, np.minimum(1.0, (estimate + width) / (1.0 - bias)), 1.0)
        return np.where(fresh, np.inf, scaled)

    def plain_index(self, stats: ArmStats, decisions: int) -> list[list[float]] | None:
        """Each arm's S/N + sqrt(2κ·L/N) + min(1, W/N) in Python floats (ArgmaxPolicy.plain_index), the same
        operations in the same order as ``index`` on ``successive``, and L from the same NumPy log
        (``math.log`` rounds the last bit otherwise for about one t in 17,000, which can move an index across
        TIE_RTOL's edge). Only for one run's few rows, age-aware, past the opening (no +inf); None otherwise."""
        if (
            not self._params["age_aware"]
            or stats.tail_weight is None
            or np.shape(stats.pulls)[0] != 1
            or not 0 < decisions * self.n_arms <= SMALL_ARGMAX
        ):
            return None
        ((*pulls,),), ((*conversions,),), ((*weights,),) = (
            np.asarray(stats.pulls, dtype=np.float64).tolist(),
            np.asarray(stats.conversions, dtype=np.float64).tolist(),
            np.asarray(stats.tail_weight, dtype=np.float64).tolist(),
        )
        if not all(n >= self._params["initial_pulls"] for n in pulls):  # a nan count too: the array rule decides
            return None
        exploration = 2.0 * self._params["kappa"]
        log_terms = self._log_terms(np.asarray(stats.t)[0] + np.arange(decisions)).tolist()  # successive's t
        bound = _scaled if self._params["multiplicative"] else _added
        return [[bound(s / n, math.sqrt(exploration * log_term / n), _at_most_one(w / n))
                 for n, s, w in zip(pulls, conversions, weights, strict=True)] for log_term in log_terms]  # fmt: skip


class AdaptPatientBandits(PatientBandits):
    """Adapt-PatientBandits (Algorithm 2): each arm twice, then PatientBandits with α_t (module docstring).

    Params: ``alpha_lo`` (0.1) the known lower bound on α; ``estimator`` (1: tail of the observed delays,
    §3.6; 0: the paper's band estimator, simulator only); ``c`` (0.7) and ``mu_lo`` (0.05) of Assumption 2,
    used by estimator 0; ``initial_pulls`` (2); ``scale``, ``age_aware``, ``horizon``, ``kappa`` as PatientBandits
    (the default scale is derived for the largest α_t, ``alpha_cap``, so that it holds for every α_t).

    >>> import numpy as np
    >>> from latebandit.policies import ArmStats, make_policy
    >>> stats = ArmStats(np.array([[1, 2, 2]]), np.array([[1.0, 1.0, 0.0]]), np.array([[1.0, 2.0, 2.0]]),
    ...                   np.array([6]), tail_weight=np.array([[0.5, 1.0, 1.0]]))  # arm 0 pulled once so far
    >>> policy = make_policy("adapt-patient-bandits", {}, 3)
    >>> policy.index(stats).tolist(), policy.choose(stats, np.random.default_rng(0)).arm.tolist()  # its second pull
    ([[inf, 1.0, 1.0]], [0])
    """

    name: ClassVar[str] = "adapt-patient-bandits"
    PARAMS: ClassVar[Mapping[str, Param]] = {
        "alpha_lo": Param(float, 0.1, 1e-3, 1.0),
        "estimator": Param(int, 1, 0, 1),
        "c": Param(float, 0.7, 1e-6, 1.0),
        "mu_lo": Param(float, 0.05, 1e-6, 1.0),
        **{key: spec for key, spec in PatientBandits.PARAMS.items() if key != "alpha"},
        "initial_pulls": Param(int, 2, 2, 1000),  # Algorithm 2: twice, so that T̄ >= 2 and log T̄ > 0
    }

    alpha_cap: float = ALPHA_CAP  # the largest α_t; lowered by a declared delay model (take_fitted_alpha)

    def take_fitted_alpha(self, fitted: float, params: Mapping[str, Any]) -> None:
        """With a declared delay model, α_t never exceeds its tightest envelope's α (nor ALPHA_CAP, nor goes
        below α_lo): the envelope the model itself satisfies is as bold as the policy gets, and the scale
        is derived for that α instead of 1 (with exponential delays of mean m: m/(2e) instead of m/e, the
        time every arm's index reads 1)."""
        self.alpha_cap = max(float(self._params["alpha_lo"]), min(ALPHA_CAP, fitted))

    def envelope_alpha(self) -> float:
        """α_t never exceeds ``alpha_cap``."""
        return self.alpha_cap

    def needs_band(self) -> bool:
        return bool(self._params["estimator"] == 0)

    def band_query(self, stats: ArmStats) -> BandQuery:
        """Ī = the most-pulled arm (lowest index on ties), D = ⌊T̄/2⌋, d = ⌊(c/2)^(1/α_lo)·D⌋ (§2.4)."""
        pulls = np.asarray(stats.pulls, dtype=np.float64)
        late = np.floor(pulls.max(axis=1) / 2.0)
        early = np.floor((self._params["c"] / 2.0) ** (1.0 / self._params["alpha_lo"]) * late)
        return BandQuery(pulls.argmax(axis=1), early.astype(np.int64), late.astype(np.int64))

    def estimate_alpha(self, stats: ArmStats) -> tuple[np.ndarray, np.ndarray]:
        """(α̂, its lower confidence bound), each (R,), from the chosen estimator; nan where undefined."""
        if self._params["estimator"] == 0:
            return self._band_alpha(stats)
        if stats.delay_counts is None:
            raise ValueError(f"policy {self.name!r} needs the per-arm delay histogram")
        tail = tail_exponent(stats.delay_counts, stats.delay_exposure)
        lower = np.where(np.isfinite(tail.se), tail.alpha - LCB_Z * tail.se, np.nan)
        heaviest = np.where(np.isnan(lower), np.inf, lower).argmin(axis=1)
        runs = np.arange(lower.shape[0])
        return tail.alpha[runs, heaviest], lower[runs, heaviest]

    def _band_alpha(self, stats: ArmStats) -> tuple[np.ndarray, np.ndarray]:
        """α̂ = min(−log(k/n)/log T̄, 1) (1 when k = 0), minus log(24·sqrt(L)/(c·μ_lo))/log T̄ (§2.4 steps 4–5)."""
        if stats.band is None:
            raise ValueError(f"policy {self.name!r} with estimator 0 needs the band counts of its query")
        old, hits = np.asarray(stats.band, dtype=np.float64).T
        log_most = np.log(np.maximum(np.asarray(stats.pulls, dtype=np.float64).max(axis=1), 2.0))
        with np.errstate(all="ignore"):
            fraction = np.where(old > 0, hits / np.where(old > 0, old, 1.0), 0.0)
            point = np.where(fraction > 0, np.minimum(-np.log(fraction) / log_most, ALPHA_CAP), ALPHA_CAP)
        correction = np.log(24.0 * np.sqrt(self.log_term(stats)[:, 0]) / (self._params["c"] * self._params["mu_lo"]))
        return point, point - correction / log_most

    def alpha(self, stats: ArmStats) -> np.ndarray:
        """α_t = max(α_lo, min(lower bound, 1)); α_lo while the estimator has no answer."""
        _, lower = self.estimate_alpha(stats)
        floor = self._params["alpha_lo"]
        return np.where(np.isnan(lower), floor, np.clip(lower, floor, self.alpha_cap))


def _added(estimate: float, width: float, bias: float) -> float:
    """The paper's index for one arm, as ``index`` computes it."""
    return estimate + width + bias


def _scaled(estimate: float, width: float, bias: float) -> float:
    """The multiplicative index for one arm, as ``index`` computes it (a nan bias gives nan)."""
    if bias < 1.0:
        value = (estimate + width) / (1.0 - bias)
        return 1.0 if value > 1.0 else value
    return 1.0 if bias >= 1.0 else bias


def _at_most_one(value: float) -> float:
    """np.minimum(1.0, value) for a float: a nan stays nan (the argmax then leaves it to the array rule)."""
    return 1.0 if value > 1.0 else value
