"""Delay-naive baselines: A/B allocation (uniform, fixed) and the classical UCB1, KL-UCB and Thompson
sampling on S/N, which read not-yet-converted pulls as failures (docs/algorithms/baselines.md)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from scipy import special

from latebandit.policies.base import ArmStats, Array, Choice, IndexPolicy, Param, Policy, Setting, uniform_among
from latebandit.policies.indices import klucb_bernoulli

MC_CHUNK = 1 << 20  # posterior draws held in memory at once by Thompson's propensity estimate beyond STANDING_ARMS
STANDING_ARMS = 10  # the most arms Thompson's exact law is computed for (cost ~K²: 0.13 ms at 3, 1.3 at 10)
TAIL = 1e-12  # posterior mass left out on each side of an arm's interval by the quadrature
NODES, WEIGHTS = np.polynomial.legendre.leggauss(24)  # Gauss-Legendre nodes on [-1, 1], per piece


class Uniform(Policy):
    """Every arm with probability 1/K, for A/B tests and as the logging policy of unbiased backtests.

    >>> import numpy as np
    >>> from latebandit.policies import ArmStats, make_policy
    >>> stats = ArmStats(np.array([[10, 10, 10]]), np.array([[2.0, 5.0, 1.0]]), np.array([[10.0] * 3]), np.array([31]))
    >>> choice = make_policy("uniform", {}, 3).choose(stats, np.random.default_rng(0))
    >>> choice.arm.tolist(), choice.propensity.tolist()
    ([0], [0.3333333333333333])
    """

    name: ClassVar[str] = "uniform"
    reports_probabilities: ClassVar[bool] = True
    ignores_feedback: ClassVar[bool] = True

    def choose(self, stats: ArmStats, rng: np.random.Generator) -> Choice:
        return uniform_among(np.ones(np.shape(stats.pulls), dtype=bool), rng)

    def standing(self, stats: ArmStats) -> np.ndarray:
        return np.full(np.shape(stats.pulls), 1.0 / self.n_arms)


class Fixed(Policy):
    """Always the arm at index ``arm`` (the service maps an arm id to its index first).

    >>> import numpy as np
    >>> from latebandit.policies import ArmStats, make_policy
    >>> stats = ArmStats(np.array([[10, 10, 10]]), np.array([[2.0, 5.0, 1.0]]), np.array([[10.0] * 3]), np.array([31]))
    >>> choice = make_policy("fixed", {"arm": 2}, 3).choose(stats, np.random.default_rng(0))
    >>> choice.arm.tolist(), choice.propensity.tolist()
    ([2], [1.0])
    """

    name: ClassVar[str] = "fixed"
    reports_probabilities: ClassVar[bool] = True
    ignores_feedback: ClassVar[bool] = True
    PARAMS: ClassVar[Mapping[str, Param]] = {"arm": Param(int, None, 0)}

    def __init__(self, n_arms: int, setting: Setting | None = None, **params: Any) -> None:
        super().__init__(n_arms, setting, **params)
        if self._params["arm"] >= self.n_arms:
            raise ValueError(f"policy 'fixed': arm must be an index below {self.n_arms} (got {self._params['arm']})")

    def choose(self, stats: ArmStats, rng: np.random.Generator) -> Choice:
        runs = np.shape(stats.pulls)[0]
        return Choice(np.full(runs, self._params["arm"], dtype=np.int64), np.ones(runs), self.standing(stats))

    def standing(self, stats: ArmStats) -> np.ndarray:
        probabilities = np.zeros(np.shape(stats.pulls))
        probabilities[:, self._int_param("arm")] = 1.0
        return probabilities


class UCB1(IndexPolicy):
    """UCB1 of Auer et al. 2002: S/N + sqrt(2β/N), with β = (1+ε)·log t as for every index policy here
    (ε = 0 gives the textbook sqrt(2 log t / N)).

    >>> import numpy as np
    >>> from latebandit.policies import ArmStats, make_policy
    >>> stats = ArmStats(np.array([[10, 10, 10]]), np.array([[2.0, 5.0, 1.0]]), np.array([[10.0] * 3]), np.array([31]))
    >>> policy = make_policy("ucb1", {}, 3)
    >>> policy.index(stats).round(3).tolist(), policy.choose(stats, np.random.default_rng(0)).arm.tolist()
    ([[1.029, 1.329, 0.929]], [1])
    """

    name: ClassVar[str] = "ucb1"

    def bound(self, estimate: Array, stats: ArmStats, effective: Array, beta: Array) -> Array:
        return estimate + np.sqrt(2.0 * beta / effective)


class KLUCB(IndexPolicy):
    """Bernoulli KL-UCB: max{q : N·kl(S/N, q) <= β}. ε plays the role of SMPyBandits' c = 1 + ε.

    >>> import numpy as np
    >>> from latebandit.policies import ArmStats, make_policy
    >>> stats = ArmStats(np.array([[10, 10, 10]]), np.array([[2.0, 5.0, 1.0]]), np.array([[10.0] * 3]), np.array([31]))
    >>> policy = make_policy("klucb", {}, 3)
    >>> policy.index(stats).round(3).tolist(), policy.choose(stats, np.random.default_rng(0)).arm.tolist()
    ([[0.605, 0.852, 0.484]], [1])
    """

    name: ClassVar[str] = "klucb"

    def bound(self, estimate: Array, stats: ArmStats, effective: Array, beta: Array) -> Array:
        return klucb_bernoulli(estimate, beta / effective)


class Thompson(Policy):
    """Beta-Bernoulli Thompson sampling on the posterior Beta(1 + S, 1 + N − S).

    With rewards in [0, 1] (a campaign's values divided by its ``reward.max``) S is fractional and the posterior
    is a Beta on the scaled mean, not a Bernoulli draw of each scaled reward (Agrawal and Goyal's trick, which
    updates the Beta with a coin of probability r): the draw would make the state depend on a random number at
    each conversion, which neither the stores' counters nor a replay of the audit log could repeat, while the
    Beta on S is a deterministic function of the counters, equal to today's posterior on 0/1 rewards and with
    the same mean for any rewards in [0, 1] (its variance is at most the Bernoulli trick's).

    The arm is the argmax of one posterior draw from the decision's generator. Its propensity (the chance
    that arm is the posterior argmax) is a function of the posterior alone, so the same state logs the same
    propensity in the service and the simulator whatever the generator did (``win_chances``), and it draws
    nothing from the decision's generator: ``choose`` and ``choose_arms`` consume it alike.

    >>> import numpy as np
    >>> from latebandit.policies import ArmStats, make_policy
    >>> stats = ArmStats(np.array([[10, 10, 10]]), np.array([[2.0, 5.0, 1.0]]), np.array([[10.0] * 3]), np.array([31]))
    >>> choice = make_policy("thompson", {}, 3).choose(stats, np.random.default_rng(0))
    >>> choice.arm.tolist(), round(float(choice.propensity[0]), 1)  # the chance this arm is the posterior argmax
    ([1], 0.9)
    """

    name: ClassVar[str] = "thompson"
    reports_probabilities: ClassVar[bool] = True
    PARAMS: ClassVar[Mapping[str, Param]] = {"propensity_samples": Param(int, 1000, 1, 1_000_000)}

    def posterior(self, stats: ArmStats) -> tuple[Array, Array]:
        """Beta(1 + S, 1 + N − S): every pull not converted yet reads as a failure."""
        conversions = np.asarray(stats.conversions, dtype=np.float64)
        return 1.0 + conversions, 1.0 + np.asarray(stats.pulls, dtype=np.float64) - conversions

    def choose(self, stats: ArmStats, rng: np.random.Generator) -> Choice:
        alpha, beta = self.posterior(stats)
        arm = rng.beta(alpha, beta).argmax(axis=1)
        return _with_probabilities(arm, self.win_chances(alpha, beta))

    def choose_arms(self, stats: ArmStats, rng: np.random.Generator) -> np.ndarray:
        """One posterior draw's argmax per run, the arms ``choose`` plays, without their propensities (at 10
        arms these cost 6 times the draw in the simulator)."""
        alpha, beta = self.posterior(stats)
        return rng.beta(alpha, beta).argmax(axis=1).astype(np.int64)

    def choose_together(self, stats: ArmStats, decisions: int, rng: np.random.Generator) -> Choice:
        """The decisions draw their arms one by one; their posteriors are one, so are their propensities."""
        alpha, beta = self.posterior(stats.successive(decisions))
        arm = rng.beta(alpha, beta).argmax(axis=1)
        return _with_probabilities(arm, np.repeat(self.win_chances(alpha[:1], beta[:1]), decisions, axis=0))

    def standing(self, stats: ArmStats) -> np.ndarray:
        """The exact law of the posterior argmax (``win_probabilities``), for at most STANDING_ARMS arms; nan
        otherwise (the decision then samples, as ``choose``)."""
        if self.n_arms > STANDING_ARMS:
            return super().standing(stats)
        return win_probabilities(*self.posterior(stats))

    def win_chances(self, alpha: Array, beta: Array) -> Array:
        """(R, K) each arm's chance of being the posterior argmax, deterministically. Up to STANDING_ARMS arms
        exactly, by the quadrature the standing law uses (``win_probabilities``: a service decision logs the
        same number whether a standing law or this call served it). Its cost grows as K² (0.7 ms at 10 arms,
        21 ms at 50, 0.7 s at 256), so beyond, a Monte Carlo estimate from ``propensity_samples`` draws M of a
        generator seeded by the posterior itself (``posterior_generator``; 1.8 ms at 50 arms), as
        (hits + 1/K)/(M + 1): it sums to 1 and is never 0, which inverse-propensity replays divide by."""
        if alpha.shape[1] <= STANDING_ARMS:
            return win_probabilities(alpha, beta)
        samples = self._int_param("propensity_samples")
        chances = np.empty(alpha.shape)
        for r in range(alpha.shape[0]):
            hits = posterior_hits(alpha[r], beta[r], samples, posterior_generator(alpha[r], beta[r]))
            chances[r] = (hits + 1.0 / alpha.shape[1]) / (samples + 1.0)
        return chances


def posterior_generator(alpha: Array, beta: Array) -> np.random.Generator:
    """A generator seeded by the posterior's parameters: the same posterior, the same draws (no global RNG)."""
    digest = hashlib.blake2b(np.concatenate([alpha, beta]).astype(np.float64).tobytes(), digest_size=16).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


def posterior_hits(alpha: Array, beta: Array, samples: int, rng: np.random.Generator) -> Array:
    """(K,) how often each arm is the argmax of ``samples`` draws from the posteriors Beta(α_k, β_k)."""
    per_chunk = max(1, MC_CHUNK // alpha.size)
    hits = np.zeros(alpha.shape)
    for start in range(0, samples, per_chunk):
        draws = rng.beta(alpha, beta, size=(min(per_chunk, samples - start), alpha.size))
        hits += np.bincount(draws.argmax(axis=1), minlength=alpha.size)
    return hits


def _with_probabilities(arm: Array, probabilities: Array) -> Choice:
    return Choice(arm.astype(np.int64), probabilities[np.arange(arm.size), arm], probabilities)


def win_probabilities(alpha: Array, beta: Array) -> Array:
    """(R, K) P(X_k > X_j for every j ≠ k) for independent X_j ~ Beta(α_j, β_j) (α, β >= 1): the law of
    Thompson sampling's arm, ∫ f_k(x)·Π_{j≠k} F_j(x) dx, deterministically (docs/algorithms/guha.md leaves it to Monte
    Carlo). Composite Gauss-Legendre on the pieces between every arm's quantiles TAIL and 1 − TAIL, so that each
    density and each CDF's rise lies across whole pieces however narrow one posterior is beside another; the
    exclusive products are prefix and suffix sums of log F, never a division by an F that underflowed to 0."""
    alpha, beta = np.asarray(alpha, dtype=np.float64), np.asarray(beta, dtype=np.float64)
    bounds = np.concatenate(
        [special.betaincinv(alpha, beta, TAIL), special.betaincinv(alpha, beta, 1.0 - TAIL)], axis=1
    )
    edges = np.sort(bounds, axis=1)
    low, high = edges[:, :-1, None], edges[:, 1:, None]  # (R, pieces, 1)
    x = ((low + high) / 2 + (high - low) / 2 * NODES).reshape(len(edges), -1)[:, None, :]  # (R, 1, N)
    w = ((high - low) / 2 * WEIGHTS).reshape(len(edges), -1)  # (R, N)
    a, b = alpha[:, :, None], beta[:, :, None]
    with np.errstate(divide="ignore"):
        log_cdf = np.log(special.betainc(a, b, x))  # (R, K, N)
    log_pdf = special.xlogy(a - 1, x) + special.xlog1py(b - 1, -x) - special.betaln(a, b)
    zeros = np.zeros_like(log_cdf[:, :1])
    before = np.cumsum(np.concatenate([zeros, log_cdf[:, :-1]], axis=1), axis=1)
    after = np.cumsum(np.concatenate([zeros, log_cdf[:, :0:-1]], axis=1), axis=1)[:, ::-1]
    wins = (np.exp(log_pdf + before + after) * w[:, None, :]).sum(axis=2)
    return wins / wins.sum(axis=1, keepdims=True)


class DelayedThompson(Thompson):
    """Thompson sampling on the posterior of matured outcomes, Beta(1 + S, 1 + max(Ñ − S, 0)) (docs/algorithms/guha.md,
    issue 8): a pending pull counts as a failure only by its probability τ(age) of having converted by now,
    which is the delay-corrected count Ñ = Σ τ(min(age, m)) of Vernade 2017.

    >>> import numpy as np
    >>> from latebandit.policies import ArmStats, make_policy
    >>> stats = ArmStats(np.array([[100, 100, 100]]), np.array([[20.0, 50.0, 10.0]]),  # N, S
    ...                   np.array([[80.0, 90.0, 70.0]]), np.array([301]))  # Ñ = Σ τ(age), t
    >>> choice = make_policy("delayed-thompson", {}, 3).choose(stats, np.random.default_rng(0))
    >>> choice.arm.tolist(), round(float(choice.propensity[0]), 1)
    ([1], 1.0)
    """

    name: ClassVar[str] = "delayed-thompson"
    delay_corrected: ClassVar[bool] = True

    def effective_pulls(self, stats: ArmStats) -> np.ndarray:
        return np.asarray(stats.effective, dtype=np.float64)

    def posterior(self, stats: ArmStats) -> tuple[Array, Array]:
        conversions = np.asarray(stats.conversions, dtype=np.float64)
        return 1.0 + conversions, 1.0 + np.maximum(self.effective_pulls(stats) - conversions, 0.0)
