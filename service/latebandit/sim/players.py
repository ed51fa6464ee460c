"""How one policy plays the rounds of R runs: from per-arm statistics (a feed) round by round, or from its
plan of segments in blocks of rounds during which no run changes arm."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from latebandit.policies import Choice, SchedulePolicy
from latebandit.sim.accounting import weighted_regret
from latebandit.sim.arrivals import Roster
from latebandit.sim.environment import Environment, Pull
from latebandit.sim.feeds import Feed
from latebandit.sim.segments import ScheduleDriver

Observer = Callable[[int, Choice, Pull], None]  # (round, the choice, the pull) after each round's pull


class Player(Protocol):
    def longest_block(self) -> int:
        """How many rounds, from the current one, every run keeps its arm (1 for a policy deciding each round)."""

    def play_block(self, rounds: int) -> np.ndarray:
        """Play the next ``rounds`` rounds (at most ``longest_block()``) in every run; the arms pulled (R,)."""

    def weighted(self) -> np.ndarray:
        """(R,) L(T), the τ-weighted regret Σ_s Δ_{A_s}·τ(min(T − s, m)), once the horizon has been played."""


class History:
    """The arms played, as (first round, rounds, arms (R,)) blocks: what L(T) is computed from at the end,
    each block with the gaps of its round (they change when an arm arrives; a block never spans an arrival)."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self._blocks: list[tuple[int, int, np.ndarray]] = []

    def append(self, first: int, rounds: int, arms: np.ndarray) -> None:
        self._blocks.append((first, rounds, arms))

    def weighted(self) -> np.ndarray:
        scenario = self.env.scenario
        firsts = [first for first, _ in scenario.arm_sets()]
        total = np.zeros(self.env.runs)
        for first, end in zip(firsts, [*firsts[1:], scenario.horizon + 1], strict=True):
            blocks = [block for block in self._blocks if first <= block[0] < end]
            if blocks:
                gaps = self.env.gaps_at(first)
                total += weighted_regret(scenario.delays, scenario.window, scenario.horizon, gaps, blocks)
        return total


class FeedPlayer:
    """Index and sampling policies: ``choose`` on the feed's statistics, then the feed learns what arrived."""

    def __init__(
        self,
        roster: Roster,
        env: Environment,
        feed: Feed,
        rng: np.random.Generator,
        floor: float = 0.0,
        observe: Observer | None = None,
        standing_rounds: int = 1,
    ) -> None:
        """``standing_rounds`` > 1 plays the service's standing choice (engine/choosing.py): a run whose
        policy reports a standing distribution draws its arms from it for up to that many rounds, until the S
        its policy reads changes, its other statistics meanwhile ignored; 1 asks the policy every round.
        The service also keeps Ñ for a whole histogram read; here Ñ is held only while the law stands, and
        no longer than until an arm arrives. ``roster``: the policy of each round over the arms present."""
        self.roster, self.env, self.feed, self.rng = roster, env, feed, rng
        self.floor, self.observe = floor, observe
        self._reads_feedback = not roster.policy.ignores_feedback
        self._t = np.empty(env.runs)
        self._runs = np.arange(env.runs)
        self._blocks = History(env)
        self._standing_rounds = standing_rounds
        self._law = np.full((env.runs, env.scenario.n_arms), np.nan)  # (R, K) each run's standing law, nan: none
        self._left = np.zeros(env.runs, dtype=np.int64)  # rounds each run's standing law may still serve
        self._seen = np.zeros((env.runs, env.scenario.n_arms))  # the S each run's law was computed from

    def longest_block(self) -> int:
        return 1

    def play_block(self, rounds: int) -> np.ndarray:
        n = self.env.round
        self._t.fill(n)
        if self.observe is None and self.floor <= 0.0 and self._standing_rounds == 1:  # no propensity needed
            arms = self.roster.choose_arms(n, self.feed.stats(self._t), self.rng)
            pull = self.env.pull(arms)
        else:
            choice = self._choose(n)
            arms = choice.arm
            pull = self.env.pull(arms)
            if self.observe is not None:
                self.observe(n, choice, pull)
        ledger = self.feed.ledger
        ledger.pulls[self._runs, arms] += 1.0
        self.feed.record(pull)
        self._blocks.append(self.env.round, 1, arms)
        arrived = self.env.observe(self.env.end_round())
        if self._reads_feedback:  # which may be sums only (anonymous feedback): nothing to count
            ledger.conversions += arrived
        return arms

    def weighted(self) -> np.ndarray:
        return self._blocks.weighted()

    def _choose(self, n: int) -> Choice:
        """The policy's choice, or in runs whose standing law still serves, a draw from it (as the service)."""
        stats = self.feed.stats(self._t)
        if self._standing_rounds == 1:  # the policy's own call, draw for draw as the papers' figures were made
            return self.roster.choose(n, stats, self.rng, self.floor)
        if self.roster.arrives(n):  # a new arm set: as after the service's arm change, every law is renewed
            self._left.fill(0)
        serving = (self._left > 0) & (np.asarray(stats.conversions) == self._seen).all(axis=1)  # S unchanged
        if not serving.all():
            law = self.roster.standing(n, stats, self.floor)
            renew = ~serving & ~np.isnan(law).any(axis=1)
            self._law[renew] = law[renew]
            self._seen[renew] = np.asarray(stats.conversions)[renew]
            self._left[renew] = self._standing_rounds
            serving |= renew
        bounds = np.cumsum(np.nan_to_num(self._law), axis=1)
        below = bounds < self.rng.random(self.env.runs)[:, None] * bounds[:, -1:]  # within the law's support
        drawn = np.minimum(below.sum(axis=1), self._law.shape[1] - 1)
        self._left[serving] -= 1
        if serving.all():  # the policy is asked only for runs without a law (an opening, or one that never stands)
            return Choice(drawn, self._law[self._runs, drawn])
        fresh = self.roster.choose(n, stats, self.rng, self.floor)
        return Choice(
            np.where(serving, drawn, fresh.arm), np.where(serving, self._law[self._runs, drawn], fresh.propensity)
        )


class SchedulePlayer:
    """Planning policies: the scheduled arms for as many rounds as no segment ends, then each round's total
    arrivals (attributed ones summed: an anonymous learner may always be given less than there is)."""

    def __init__(
        self, policy: SchedulePolicy, env: Environment, rng: np.random.Generator, observe: Observer | None = None
    ) -> None:
        self.env, self.observe = env, observe
        self.driver = ScheduleDriver(policy, env.runs, rng)
        self._blocks = History(env)

    def longest_block(self) -> int:
        return 1 if self.observe is not None else min(self.driver.steady(), self.env.longest_block())

    def play_block(self, rounds: int) -> np.ndarray:
        arms = self.driver.arms().copy()
        self._blocks.append(self.env.round, rounds, arms)
        if self.observe is not None:  # an event log wants every round's pull: one round at a time
            self.observe(self.env.round, Choice(arms, self.driver.propensities()), self.env.pull(arms))
            self.driver.observe(self.env.end_round().sum(axis=1))
            return arms
        self.env.pull_block(arms, rounds)
        self.driver.observe_block(self.env.end_block(rounds).sum(axis=2))
        return arms

    def weighted(self) -> np.ndarray:
        return self._blocks.weighted()
