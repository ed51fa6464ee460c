"""How one policy plays a round of R runs: from per-arm statistics (a feed) or from its plan of segments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from service.policies import Choice, Policy, SchedulePolicy
from service.policies.floor import with_floor
from service.sim.environment import Environment, Pull
from service.sim.feeds import Feed
from service.sim.segments import ScheduleDriver

Observer = Callable[[int, Choice, Pull], None]  # (round, the choice, the pull) after each round's pull


class Player(Protocol):
    def play(self, n: int) -> np.ndarray:
        """Play round ``n`` in every run; the arms pulled (R,)."""


class FeedPlayer:
    """Index and sampling policies: ``choose`` on the feed's statistics, then the feed learns what arrived."""

    def __init__(
        self,
        policy: Policy,
        env: Environment,
        feed: Feed,
        rng: np.random.Generator,
        floor: float = 0.0,
        observe: Observer | None = None,
    ) -> None:
        self.policy, self.env, self.feed, self.rng = policy, env, feed, rng
        self.floor, self.observe = floor, observe
        self._t = np.empty(env.runs)
        self._runs = np.arange(env.runs)

    def play(self, n: int) -> np.ndarray:
        self._t.fill(n)
        choice = with_floor(self.policy.choose(self.feed.stats(self._t), self.rng), self.floor, self.rng)
        arms = choice.arm
        pull = self.env.pull(arms)
        if self.observe is not None:
            self.observe(n, choice, pull)
        ledger = self.feed.ledger
        ledger.pulls[self._runs, arms] += 1.0
        self.feed.record(pull)
        ledger.conversions += self.env.observe(self.env.end_round())
        return arms


class SchedulePlayer:
    """Planning policies: the scheduled arm, then the round's total arrivals (attributed ones summed: an
    anonymous learner may always be given less than there is)."""

    def __init__(
        self, policy: SchedulePolicy, env: Environment, rng: np.random.Generator, observe: Observer | None = None
    ) -> None:
        self.env, self.observe = env, observe
        self.driver = ScheduleDriver(policy, env.runs, rng)

    def play(self, n: int) -> np.ndarray:
        arms = self.driver.arms().copy()
        pull = self.env.pull(arms)
        if self.observe is not None:
            self.observe(n, Choice(arms, self.driver.propensities()), pull)
        self.driver.observe(self.env.end_round().sum(axis=1))
        return arms
