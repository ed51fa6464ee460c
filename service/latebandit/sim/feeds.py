"""What each simulated policy is shown: the (N, S, Ñ, t) statistics of ArmStats, built per round.

The policies are the service's own objects (service/latebandit/policies); a feed only decides which counts they
receive, which is how the simulator runs the baselines and variants of Vernade et al. 2017 without copying
any index code:

- ``naive``: N and S (delay-naive reading: a pending pull looks like a failure), Ñ = N;
- ``delayed``: Ñ = Σ τ(min(age, m)) with the true delay model (DelayedUCB / DelayedKLUCB);
- ``discarding`` (the paper's Discarding baseline): only matured pulls (age >= m), N_old and S_old, with
  Ñ = τ_m·N_old. Fed to delayed-ucb this is θ̂^m + sqrt(β/(2·τ_m²·N_old)), fed to delayed-klucb it is Discarding KL-UCB;
- ``discarding-literal``: as above but N = τ_m·N_old, which turns delayed-ucb's width into the printed
  sqrt(β/(2·τ_m·N_old));
- ``plugin`` (App. D): Ñ from a delay CDF estimated online from the delays seen so far — the
  censored histogram τ̂_s = δ_s/n_d, or, without a window, the geometric μ̂ of stochastic approximation.
  Before the first observed delay the plug-in assumes none (τ̂ ≡ 1, Ñ = N) [ours: App. D gives no start].
- ``resolution`` (QPM-D, Joulani et al. 2013): N and S with ``pending``, the pulls whose outcome has not
  been resolved. In the paper's model every reward, zeros included, reports after its delay, so a pull
  resolves at the end of round s + ⌈D⌉; with a window m, at s + ⌈min(D, m)⌉ (a conversion arrives by
  then or never counts). Resolved pulls are usable from the next decision, like conversions.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np

from latebandit.delays.facts import support_end
from latebandit.policies import ArmStats, Policy
from latebandit.sim.accounting import Exposure, exposure_for
from latebandit.sim.environment import Calendar, Environment, Pull, Ring, one_hot
from latebandit.sim.scenario import Feed as FeedSpec


class Ledger:
    """The raw per-run counts every feed starts from: pulls N and counted revealed conversions S."""

    def __init__(self, runs: int, n_arms: int) -> None:
        self.pulls = np.zeros((runs, n_arms))
        self.conversions = np.zeros((runs, n_arms))


class Feed(ABC):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    @abstractmethod
    def stats(self, t: np.ndarray) -> ArmStats:
        """The statistics of the decision of round t (R,). The arrays may be the feed's own, updated in
        place later: a policy uses them at once."""

    @abstractmethod
    def record(self, pull: Pull) -> None:
        """End of the round: update what the feed keeps beyond the ledger."""


class Naive(Feed):
    def stats(self, t: np.ndarray) -> ArmStats:
        return ArmStats(self.ledger.pulls, self.ledger.conversions, self.ledger.pulls, t)

    def record(self, pull: Pull) -> None:
        """Nothing: the ledger holds N and S."""


class Delayed(Naive):
    """Ñ from the run's exact exposure accounting, advanced with every round's pulls."""

    def __init__(self, ledger: Ledger, exposure: Exposure) -> None:
        super().__init__(ledger)
        self._exposure = exposure

    def stats(self, t: np.ndarray) -> ArmStats:
        return ArmStats(self.ledger.pulls, self.ledger.conversions, self._exposure.effective(), t)

    def record(self, pull: Pull) -> None:
        self._exposure.push(pull.arms)


class Discarding(Feed):
    """Matured pulls only: everything they will ever reveal has been revealed (Discarding)."""

    def __init__(self, ledger: Ledger, env: Environment, literal: bool) -> None:
        super().__init__(ledger)
        window = env.window or 0
        self._tau_m = np.array([model.cdf(window) for model in env.scenario.delays])
        self._literal = literal
        self._arms = Ring(window, env.runs, fill=-1, dtype=np.int64)
        self._values = Ring(window, env.runs, fill=0.0)
        self._old_pulls = np.zeros(ledger.pulls.shape)
        self._old_conversions = np.zeros(ledger.pulls.shape)

    def stats(self, t: np.ndarray) -> ArmStats:
        effective = self._tau_m * self._old_pulls
        pulls = effective if self._literal else self._old_pulls
        return ArmStats(pulls, self._old_conversions, effective, t)

    def record(self, pull: Pull) -> None:
        leaving = one_hot(self._arms.push(pull.arms), self._old_pulls.shape[1])
        self._old_pulls += leaving
        self._old_conversions += leaving * self._values.push(np.where(pull.counted, pull.values, 0.0))[:, None]


class PluginWindow(Feed):
    """Censored plug-in: τ̂(a) = C(a)/n_d, with C(a) the number of delays <= a among the n_d conversions
    seen so far, estimates τ(a)/τ_m (nothing beyond m is ever seen); matured pulls weigh τ̂(m) = 1.

    The pulls of the last m + 1 rounds sit in a ring (slot s mod (m + 1) holds round s) with one 0/1
    mask per arm, so Ñ_k = matured_k + Σ_slots mask_k·C(age)/n_d is one contraction, O(K·R·m) per
    round; each newly seen delay d adds 1 to C(d..m) of its run.
    """

    def __init__(self, ledger: Ledger, env: Environment) -> None:
        super().__init__(ledger)
        runs, n_arms = ledger.pulls.shape
        self._depth = depth = (env.window or 0) + 1
        self._masks = np.zeros((n_arms, depth, runs))
        self._lags = np.full((depth, runs), -1, dtype=np.int64)  # -1: no conversion that counts
        self._slot_round = np.full(depth, -depth, dtype=np.int64)
        self._cumulative = np.zeros((depth, runs))  # C(a) for a = 0..m
        self._observed = np.zeros(runs)
        self._matured = np.zeros((runs, n_arms))  # pulls that left the ring: weight 1
        self._in_ring = np.zeros((runs, n_arms))
        self._run_index = np.arange(runs)
        self._round = 0

    def _observe(self, runs: np.ndarray, delays: np.ndarray) -> None:
        """C(delay..m) += 1 per newly seen delay; a run seeing several in one round takes them in turns."""
        self._observed += np.bincount(runs, minlength=self._observed.size)
        grid = np.arange(self._depth)[:, None]
        while runs.size:
            _, first = np.unique(runs, return_index=True)
            self._cumulative[:, runs[first]] += grid >= delays[first]
            rest = np.ones(runs.size, dtype=bool)
            rest[first] = False
            runs, delays = runs[rest], delays[rest]

    def stats(self, t: np.ndarray) -> ArmStats:
        ages = np.minimum(int(t[0]) - 1 - self._slot_round, self._depth - 1)  # an empty slot has no pull
        hits = np.flatnonzero(self._lags == ages[:, None])  # revealed at the end of the previous round
        slots, runs = np.divmod(hits, self._lags.shape[1])
        self._observe(runs, ages[slots])
        weighted = np.einsum("kdr,dr->rk", self._masks, self._cumulative[ages])
        seen = self._observed > 0
        in_ring = np.where(seen[:, None], weighted / np.where(seen, self._observed, 1.0)[:, None], self._in_ring)
        return ArmStats(self.ledger.pulls, self.ledger.conversions, self._matured + in_ring, t)

    def record(self, pull: Pull) -> None:
        self._round += 1
        slot = self._round % self._depth
        leaving = self._masks[:, slot, :].T.copy()
        self._matured += leaving
        self._in_ring += one_hot(pull.arms, self._in_ring.shape[1]) - leaving
        self._masks[:, slot, :] = 0.0
        self._masks[pull.arms, slot, self._run_index] = 1.0
        self._lags[slot], self._slot_round[slot] = pull.lags, self._round


class PluginGeometric(Feed):
    """Uncensored plug-in for geometric delays: μ̂ ← (1 − α)·μ̂ + α·D with α = n_d^{−γ} per observed delay
    (γ = 1: the sample mean), then p̂ = 1/(1 + μ̂) (support from 0, E[D] = (1 − p)/p) plugged into the
    geometric recursion of Vernade et al. 2017, §7, O ← ρ̂·(O + 1{A = k}), Ñ = N − O. Delays revealed in the
    same round enter as their mean with the steps of their count [ours], which is exact for γ = 1."""

    def __init__(self, ledger: Ledger, env: Environment, gamma: float) -> None:
        super().__init__(ledger)
        runs, n_arms = ledger.pulls.shape
        self._gamma = gamma
        self._calendar = Calendar(runs, 2, env.scenario.horizon)  # channels: count, sum of delays
        self._run_index = np.arange(runs)
        self._mean = np.zeros(runs)
        self._observed = np.zeros(runs)
        self._decayed = np.zeros((runs, n_arms))

    def stats(self, t: np.ndarray) -> ArmStats:
        return ArmStats(self.ledger.pulls, self.ledger.conversions, self.ledger.pulls - self._decayed, t)

    def record(self, pull: Pull) -> None:
        runs = self._run_index[pull.counted]
        lags = pull.lags[pull.counted]
        for channel, amount in ((0, np.ones(lags.size)), (1, lags.astype(np.float64))):
            self._calendar.add(lags, runs, np.full(lags.size, channel), amount)
        count, total = self._calendar.pop().T
        batch_mean = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
        for step in range(int(count.max())):
            active = count > step
            alpha = (self._observed + 1.0) ** -self._gamma
            self._mean = np.where(active, (1.0 - alpha) * self._mean + alpha * batch_mean, self._mean)
            self._observed += active
        survival = np.where(self._observed > 0, self._mean / (1.0 + self._mean), 0.0)
        self._decayed = survival[:, None] * (self._decayed + one_hot(pull.arms, self._decayed.shape[1]))


class Resolution(Naive):
    """N, S and the pulls not resolved yet: each pull's resolution is scheduled on a calendar when it is made."""

    def __init__(self, ledger: Ledger, env: Environment) -> None:
        super().__init__(ledger)
        runs, n_arms = ledger.pulls.shape
        self._limit = np.inf if env.window is None else float(env.window)
        longest = min(max(support_end(model) for model in env.scenario.delays), self._limit)
        horizon = env.scenario.horizon
        self._calendar = Calendar(runs, n_arms, horizon if np.isinf(longest) else min(horizon, math.ceil(longest)))
        self._run_index = np.arange(runs)
        self._resolved = np.zeros((runs, n_arms))

    def stats(self, t: np.ndarray) -> ArmStats:
        ledger = self.ledger
        return ArmStats(ledger.pulls, ledger.conversions, ledger.pulls, t, pending=ledger.pulls - self._resolved)

    def record(self, pull: Pull) -> None:
        """Schedule this round's resolutions (never, for an infinite delay without a window), then take
        those due at the end of this round."""
        resolves = np.minimum(pull.delays, self._limit)
        due = np.isfinite(resolves)
        lags = np.ceil(resolves[due]).astype(np.int64)
        self._calendar.add(lags, self._run_index[due], pull.arms[due], np.ones(lags.size))
        self._resolved += self._calendar.pop()


def default_feed(policy: Policy) -> str:
    """The feed a policy gets when its scenario entry names none."""
    if policy.needs_pending:
        return "resolution"
    return "delayed" if policy.delay_corrected else "naive"


def make_feed(spec: FeedSpec, policy: Policy, ledger: Ledger, env: Environment) -> Feed:
    """The feed a scenario entry asks for (validated by the scenario loader)."""
    kind = spec.kind or default_feed(policy)
    if kind == "resolution":
        return Resolution(ledger, env)
    if kind == "naive":
        return Naive(ledger)
    if kind == "delayed":
        scenario = env.scenario
        return Delayed(ledger, exposure_for(scenario.delays, env.window, scenario.horizon, env.runs))
    if kind.startswith("discarding"):
        return Discarding(ledger, env, literal=kind == "discarding-literal")
    if env.window is not None:
        return PluginWindow(ledger, env)
    return PluginGeometric(ledger, env, 1.0 if spec.gamma is None else spec.gamma)
