"""The contextual world and runner, vectorised over R runs: each round offers K fresh action vectors per run,
the policy picks one from LinearStats, and the pick's conversion (Bernoulli(θᵀa), delay_start + D rounds
later, counted when at most the window m) is added to b when it arrives.

Timing as for the other scenarios (docs/reference/scenarios.md): a conversion of round s with delay D
arrives at the end of round s + ⌈D⌉, so decision n sees it when D <= n − 1 − s. The window W at decision n
holds the last m decisions. Run r draws its actions, outcomes and delays from the generator seeded by
(seed, r) in chunks of rounds, and its θ from a stream of its own, so every policy meets the same worlds
(paired differences) and one run alone reproduces its row of a batch. Regret is the pseudo-regret
Σ_s (max_a θᵀa − θᵀA_s) over each round's offered set.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from latebandit.policies.linear import ContextualPolicy, LinearStats, make_contextual_policy
from latebandit.sim.contextual_scenario import ContextualScenario
from latebandit.sim.environment import CHUNK, PRIOR_STREAM, policy_generator, world_generator
from latebandit.sim.runner import PolicyResult, Progress, recording_rounds
from latebandit.sim.scenario import PolicySpec

PROGRESS_EVERY = 250  # rounds between progress callbacks


class ContextualWorld:
    """R runs' offered actions, their conversion rates, outcomes and delays, drawn a chunk at a time."""

    def __init__(self, scenario: ContextualScenario, runs: int | None = None, first_run: int = 0) -> None:
        self.scenario = scenario
        self.runs = scenario.runs if runs is None else runs
        ids = range(first_run, first_run + self.runs)
        self.theta = np.array([scenario.theta.draw(_theta_generator(scenario.seed, r), scenario.d) for r in ids])
        self._generators = [world_generator(scenario.seed, r) for r in ids]
        self._next = 0
        self._chunk: tuple[np.ndarray, ...] = ()

    def round(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Round n's (R, K, d) actions, (R, K) rates θᵀa, (R, K) conversions X and (R, K) delays in rounds."""
        if n > self._next:
            self._draw_chunk()
        offset = n - 1 - (self._next - CHUNK)
        return tuple(part[:, offset] for part in self._chunk)  # type: ignore[return-value]

    def _draw_chunk(self) -> None:
        s = self.scenario
        shape = (CHUNK, s.actions_per_round)
        per_run = []
        for rng, theta in zip(self._generators, self.theta, strict=True):
            actions = s.features.draw(rng, shape, s.d)
            rates = np.clip(actions @ theta, 0.0, 1.0)  # exact rounding only: the scenario's θ keeps rates in [0, 1]
            converts = rng.random(shape) < rates
            delays = s.delay_start + s.delay.sample(rng, shape)
            per_run.append((actions, rates, converts, delays))
        self._chunk = tuple(np.stack(parts) for parts in zip(*per_run, strict=True))
        self._next += CHUNK


def _theta_generator(seed: int, run: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(PRIOR_STREAM, run)))


class LinearLedger:
    """The sums a contextual policy decides from (LinearStats), kept as the service keeps them: additive over
    decisions and conversions, with the window's decisions in a ring of depth m."""

    def __init__(self, runs: int, d: int, window: int) -> None:
        self.gram, self.reward = np.zeros((runs, d, d)), np.zeros((runs, d))
        self.decisions = 0
        self.window = window
        self._ring = np.zeros((runs, window, d))  # the last m decisions' vectors, slot = decision index mod m
        self._footprints = np.zeros((runs, window))
        self._due = np.zeros((window + 1, runs, d))  # conversions arriving at the end of a round, by round mod m+1

    def stats(self, policy: ContextualPolicy) -> LinearStats:
        runs = self.reward.shape[0]
        filled = min(self.decisions, self.window)
        in_window = self._ring[:, :filled]
        window_gram = np.einsum("rpd,rpe->rde", in_window, in_window) if policy.needs_window_gram else None
        return LinearStats(
            self.gram, self.reward, np.full(runs, float(self.decisions)), np.full(runs, float(filled)),
            self._footprints[:, :filled].sum(axis=1), window_gram, in_window if policy.needs_window_actions else None,
        )  # fmt: skip

    def record(self, chosen: np.ndarray, footprint: np.ndarray, counted: np.ndarray, lag: np.ndarray) -> None:
        """Decision ``decisions + 1`` played ``chosen`` (R, d); where ``counted``, its conversion arrives at
        the end of the round ``lag`` (<= m) rounds later. Then the round ends: what is due joins b."""
        self.gram += np.einsum("rd,re->rde", chosen, chosen)
        if self.window:
            slot = self.decisions % self.window
            self._ring[:, slot], self._footprints[:, slot] = chosen, footprint
        runs = np.flatnonzero(counted)
        due = (self.decisions + lag[runs]) % (self.window + 1)
        self._due[due, runs] += chosen[runs]
        now = self.decisions % (self.window + 1)
        self.reward += self._due[now]
        self._due[now] = 0.0
        self.decisions += 1


def run_contextual_policy(
    scenario: ContextualScenario,
    spec: PolicySpec,
    progress: Progress | None = None,
    runs: int | None = None,
    first_run: int = 0,
) -> PolicyResult:
    """``runs`` runs (default: the scenario's) of one policy; ``weighted`` is L(T) = Σ_s Δ_s·τ(min(T − s, m)),
    the regret in conversions missed by T, as for the other scenarios."""
    started = time.perf_counter()
    policy = make_contextual_policy(spec.name, spec.params)
    world = ContextualWorld(scenario, runs, first_run)
    count, horizon = world.runs, scenario.horizon
    ledger = LinearLedger(count, scenario.d, scenario.window)
    rng = policy_generator(scenario.seed)
    grid = recording_rounds(scenario)
    curve = np.empty((grid.size, count))
    regret, weighted, run_index = np.zeros(count), np.zeros(count), np.arange(count)
    point, reported = 0, 0
    for n in range(1, horizon + 1):
        actions, rates, converts, delays = world.round(n)
        action = policy.choose_actions(ledger.stats(policy), actions, rng)
        gap = rates.max(axis=1) - rates[run_index, action.action]
        regret += gap
        age = min(horizon - n, scenario.window) - scenario.delay_start
        weighted += gap * (float(scenario.delay.cdf(age)) if age >= 0 else 0.0)
        delay = delays[run_index, action.action]
        counted = converts[run_index, action.action] & (delay <= scenario.window)
        lag = np.where(counted, np.ceil(np.where(counted, delay, 0.0)), 0).astype(np.int64)
        ledger.record(actions[run_index, action.action], action.footprint, counted, lag)
        if n == grid[point]:
            curve[point] = regret
            point += 1
        if progress is not None and (n - reported >= PROGRESS_EVERY or n == horizon):
            progress(n - reported)
            reported = n
    return PolicyResult(spec.label, grid, curve, weighted, time.perf_counter() - started)


def simulate_contextual(
    scenario: ContextualScenario, progress: Callable[[PolicySpec], Progress | None] | None = None
) -> list[PolicyResult]:
    """Every policy of the scenario; ``progress(spec)`` gives the callback for that policy's rounds."""
    return [run_contextual_policy(scenario, spec, progress(spec) if progress else None) for spec in scenario.policies]
