"""The vectorised runner: each policy of a scenario plays R independent runs at once, on the same world.

Per round there is one ``policy.choose`` call on (R, K) statistics and a fixed number of array operations:
no Python loop over runs. Policies that play planned segments are played in blocks of rounds during which
no run changes arm (one set of array operations per block); the regret is still added round by round.
Policies run one after the other, each on a fresh Environment with the same
seed, so they meet the same rewards and delays (common random numbers) and each gets its own timing.
Regret is the pseudo-regret Σ_{s<=t} Δ_{A_s}, the gap to the best arm present at round s
(docs/reference/scenarios.md); the τ-weighted L(T) of Vernade et al. 2017
(the expected conversions missed by T, Σ_s Δ_{A_s}·τ(min(T − s, m)) = Σ_k Δ_k·Ñ_k(T + 1)) is kept too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from latebandit.policies import Policy, SchedulePolicy
from latebandit.sim.arrivals import Roster
from latebandit.sim.environment import Environment, policy_generator
from latebandit.sim.feeds import Ledger
from latebandit.sim.patient import make_feed
from latebandit.sim.players import FeedPlayer, Observer, Player, SchedulePlayer
from latebandit.sim.scenario import PolicySpec, Scenario, ScenarioError, scenario_policy

CURVE_POINTS = 200  # rounds recorded for curves, on top of the checkpoints (linear and geometric grids)
PROGRESS_EVERY = 250  # rounds between progress callbacks
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)

Progress = Callable[[int], None]


@dataclass(frozen=True)
class PolicyResult:
    label: str
    rounds: np.ndarray  # (G,) increasing rounds at which the regret was recorded; the last is the horizon
    regret: np.ndarray  # (G, R) cumulative pseudo-regret of every run at those rounds
    weighted: np.ndarray  # (R,) L(T), the τ-weighted regret at the horizon
    seconds: float

    def at(self, rounds: Iterable[int]) -> np.ndarray:
        """(len(rounds), R) regret at recorded rounds (every checkpoint is recorded)."""
        return self.regret[np.searchsorted(self.rounds, list(rounds))]

    @property
    def final(self) -> np.ndarray:
        return self.regret[-1]


def spread(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Sample standard deviation across runs (0 for a single run)."""
    return np.std(values, axis=axis, ddof=1 if values.shape[axis] > 1 else 0)


def mean_and_error(values: np.ndarray) -> tuple[float, float]:
    """The mean of per-run values (R,) and its standard error."""
    return float(values.mean()), float(spread(values) / np.sqrt(values.size))


def summary(result: PolicyResult) -> dict[str, float]:
    """Final regret: mean, std and quantiles across runs, and the mean L(T)."""
    final = result.final
    out = {"mean": float(final.mean()), "std": float(spread(final))}
    out.update(
        {f"q{round(q * 100):02d}": float(v) for q, v in zip(QUANTILES, np.quantile(final, QUANTILES), strict=True)}
    )
    out["weighted"] = float(result.weighted.mean())
    return out


class Planned(Protocol):
    """What recording and reporting read of a scenario, arm-based or contextual."""

    @property
    def horizon(self) -> int: ...
    @property
    def checkpoints(self) -> tuple[int, ...]: ...
    def to_json(self) -> dict[str, Any]: ...


def recording_rounds(scenario: Planned) -> np.ndarray:
    horizon = scenario.horizon
    linear = np.linspace(1, horizon, CURVE_POINTS)
    geometric = np.geomspace(1, horizon, CURVE_POINTS // 2)
    return np.unique(np.concatenate([np.rint(linear), np.rint(geometric), scenario.checkpoints, [horizon]])).astype(int)


def check_runnable(scenario: Scenario) -> None:
    """Refuse, with the reason, policies that cannot consume the scenario's feedback (rather than fake it),
    before any policy runs: a run that fails at its fourth policy has lost the first three's time and writes
    no results. Each policy is built with the scenario's setting and, when it reads a feed, so is that feed
    (on a one-run environment: a feed may refuse a policy's parameters, e.g. the Manegueu feed).
    Attributed conversions can always be summed into anonymous observations (docs/architecture.md), not the reverse; a
    policy that reads no feedback at all (uniform, fixed: the first baselines anyone draws) runs under any."""
    for i, spec in enumerate(scenario.policies):
        policy = make_policy_for(scenario, spec)
        if policy.feedback == "attributed" and not policy.ignores_feedback and scenario.feedback != "attributed":
            raise ScenarioError(
                f"policies[{i}] {spec.label!r} learns from attributed conversions, but this scenario's feedback "
                f"is {scenario.feedback!r}: only sums are observed. Use a policy for anonymous feedback (odaaf, "
                "odaaf-b, odaaf-v, ars-ucb, ars-exp3, clw) or feedback 'attributed'."
            )
        if not isinstance(policy, SchedulePolicy):
            try:
                make_feed(spec.feed, policy, Ledger(1, scenario.n_arms), Environment(scenario, runs=1))
            except (ScenarioError, ValueError) as error:
                raise ScenarioError(f"policies[{i}] {spec.label!r}: {error} (no policy was run)") from error


def make_policy_for(scenario: Scenario, spec: PolicySpec) -> Policy:
    return scenario_policy(spec.name, spec.params, scenario.delays, scenario.horizon)


def run_policy(
    scenario: Scenario,
    spec: PolicySpec,
    progress: Progress | None = None,
    runs: int | None = None,
    first_run: int = 0,
    observe: Observer | None = None,
    standing_rounds: int = 1,
) -> PolicyResult:
    """``runs`` runs (default: the scenario's) of one policy, starting at run index ``first_run``;
    ``observe`` sees every round's choices and pulls (to write event logs, service/latebandit/sim/logs.py). A
    policy that precomputes a plan (guha-bayes) solves it first; its time counts in ``seconds``.
    ``standing_rounds``: how long a standing choice serves, as in the service (FeedPlayer)."""
    started = time.perf_counter()
    policy = make_policy_for(scenario, spec)
    env = Environment(scenario, runs, first_run)
    count = env.runs
    rng = policy_generator(scenario.seed)
    player: Player
    if isinstance(policy, SchedulePolicy):
        player = SchedulePlayer(policy, env, rng, observe)
    else:
        feed = make_feed(spec.feed, policy, Ledger(count, scenario.n_arms), env)
        roster = Roster(policy.prepare(feed.stats(np.ones(count))), scenario, spec)  # guha-bayes plans here
        player = FeedPlayer(roster, env, feed, rng, spec.exploration_floor, observe, standing_rounds)
    grid = recording_rounds(scenario)
    curve = np.empty((grid.size, count))
    regret, run_index = np.zeros(count), np.arange(count)
    point, reported, n = 0, 0, 1
    while n <= scenario.horizon:
        rounds = min(player.longest_block(), grid[point] - n + 1)
        arms = player.play_block(rounds)
        gaps = env.gaps_at(n)[run_index, arms]  # a block never spans an arrival: one round, or no arrivals
        regret = np.cumsum(np.vstack([regret[None, :], np.tile(gaps, (rounds, 1))]), axis=0)[-1]
        n += rounds
        if n - 1 == grid[point]:
            curve[point] = regret
            point += 1
        if progress is not None and (n - 1 - reported >= PROGRESS_EVERY or n > scenario.horizon):
            progress(n - 1 - reported)
            reported = n - 1
    weighted = player.weighted()
    return PolicyResult(spec.label, grid, curve, weighted, time.perf_counter() - started)


def simulate(scenario: Scenario, progress: Callable[[PolicySpec], Progress | None] | None = None) -> list[PolicyResult]:
    """Every policy of the scenario; ``progress(spec)`` gives the callback for that policy's rounds."""
    check_runnable(scenario)
    return [run_policy(scenario, spec, progress(spec) if progress else None) for spec in scenario.policies]


def contract_json(scenario: Planned, results: list[PolicyResult]) -> dict[str, Any]:
    """Exactly the ``--json`` document of docs/reference/ (standard deviations are across runs, ddof = 1)."""
    policies = {}
    for result in results:
        at = result.at(scenario.checkpoints)
        policies[result.label] = {
            "regret_mean": at.mean(axis=1).tolist(),
            "regret_std": spread(at, axis=1).tolist(),
            "final_regret_mean": float(result.final.mean()),
            "final_regret_std": float(spread(result.final)),
            "seconds": round(result.seconds, 3),
        }
    return {"scenario": scenario.to_json(), "policies": policies}
