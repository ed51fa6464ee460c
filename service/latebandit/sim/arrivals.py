"""Arms that arrive during a run (the scenario's ``arrivals``): which policy decides each round, over which arms.

The service plays a campaign's active arms alone: its policy is built over them (Campaign.policy_impl) and
reads their statistics alone (Campaign.on_active_arms), and its choices are named back by the campaign's
arm indices. The simulator does the same for the arms present at a round: one policy per set of arms
present (built once, by scenario.policy_on_arms), fed ``ArmStats.on_arms`` of the statistics of every arm.
An arm that has not arrived has no pulls and no conversions, so when it arrives it is opened as every arm
is (an index policy's +inf until pulled) or starts at the prior (a Bayesian one), as an added arm does in
the service. Every run sees the same arrivals, so one policy call per round still serves all runs.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np

from latebandit.policies import ArmStats, Choice, Policy
from latebandit.policies.floor import mixed_probabilities, with_floor
from latebandit.sim.scenario import PolicySpec, Scenario, policy_on_arms


class Roster:
    """The policy of each round and the arms it plays; with every arm present, ``policy`` itself."""

    def __init__(self, policy: Policy, scenario: Scenario, spec: PolicySpec) -> None:
        """``policy``: the one over every arm (the last set; it is also what the feeds are built for)."""
        self.policy = policy
        sets = scenario.arm_sets()
        self._firsts = [first for first, _ in sets]
        self._players: list[tuple[Policy, np.ndarray | None]] = [
            (policy, None)
            if len(arms) == scenario.n_arms
            else (policy_on_arms(spec.name, spec.params, scenario.delays, scenario.horizon, arms), np.array(arms))
            for _, arms in sets
        ]
        self.n_arms = scenario.n_arms

    def arrives(self, n: int) -> bool:
        """Whether an arm arrives at round n (> 1): the policy, and any law standing for it, change."""
        return n > 1 and n in self._firsts

    def _at(self, n: int) -> tuple[Policy, np.ndarray | None]:
        return self._players[bisect_right(self._firsts, n) - 1]

    def choose_arms(self, n: int, stats: ArmStats, rng: np.random.Generator) -> np.ndarray:
        """(R,) the arms chosen at round n (no propensities: the fast path)."""
        policy, present = self._at(n)
        if present is None:
            return policy.choose_arms(stats, rng)
        return present[policy.choose_arms(stats.on_arms(present), rng)]

    def choose(self, n: int, stats: ArmStats, rng: np.random.Generator, floor: float) -> Choice:
        """The choice of round n with its propensities, the exploration floor mixed over the arms present
        (as the service mixes it over the active arms)."""
        policy, present = self._at(n)
        if present is None:
            return with_floor(policy.choose(stats, rng), floor, rng)
        choice = with_floor(policy.choose(stats.on_arms(present), rng), floor, rng)
        probabilities = None if choice.probabilities is None else self._every_arm(choice.probabilities, present)
        return Choice(present[choice.arm], choice.propensity, probabilities)

    def standing(self, n: int, stats: ArmStats, floor: float) -> np.ndarray:
        """(R, K) each run's standing law at round n with the floor mixed in (0 on an arm not present; a nan
        row: none), as engine/choosing.py's NextChoice.standing builds it over the active arms."""
        policy, present = self._at(n)
        law = policy.standing(stats if present is None else stats.on_arms(present))
        if floor > 0:
            law = mixed_probabilities(law, floor)
        return law if present is None else self._every_arm(law, present)

    def _every_arm(self, probabilities: np.ndarray, present: np.ndarray) -> np.ndarray:
        """(R, K) from (R, len(present)): 0 for the arms not present."""
        out = np.zeros((probabilities.shape[0], self.n_arms))
        out[:, present] = probabilities
        return out
