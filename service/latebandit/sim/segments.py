"""Playing the policies that plan segments (service/latebandit/policies/schedule.py) in R simulated runs at once.

The driver gives every run's arm and adds each round's anonymous observation (the sum of what arrived) to
the run's current segment, round by round in order (so sums are the same whether rounds come one at a time
or in blocks): array operations only. ``steady()`` says how many rounds every run keeps its arm, so the
runner can play that many rounds as one block. When a run's segment has been played it is
complete at once (the simulator sees every round's observation at its end, as the papers assume); when the
run's plan is exhausted, the policy plans again for that run with the segments played since its last plan.
So Python-level work happens at segment ends only.
"""

from __future__ import annotations

import numpy as np

from latebandit.policies.schedule import Next, Observed, Plan, SchedulePolicy, Segment

FOREVER = -1  # ``left`` of a run playing a plan's hold for good (Next.NEVER)


class ScheduleDriver:
    """R runs of one planning policy, all planned with the caller's generator."""

    def __init__(self, policy: SchedulePolicy, runs: int, rng: np.random.Generator) -> None:
        self.policy, self.rng = policy, rng
        self.arm = np.zeros(runs, dtype=np.int64)
        self.left = np.zeros(runs, dtype=np.int64)
        self.played = np.zeros(runs, dtype=np.int64)
        self.reward = np.zeros(runs)
        self.plays_schedule: list[Plan] = []
        self.current: list[Segment] = []
        self.queues: list[list[Segment]] = []
        self.done: list[list[Observed]] = [[] for _ in range(runs)]
        for run in range(runs):
            self.plays_schedule.append(policy.plan(None, [], [], rng))
            self.queues.append(list(self.plays_schedule[run].segments))
            self.current.append(self.plays_schedule[run].hold)
            self._next_segment(run)

    def arms(self) -> np.ndarray:
        """(R,) the arm each run plays this round."""
        return self.arm

    def propensities(self) -> np.ndarray:
        """(R,) the probability each run's policy had of playing its current segment's arm."""
        return np.array([segment.propensity for segment in self.current])

    def steady(self) -> int:
        """Rounds before the first run's segment ends (the horizon bounds it when every run holds for good)."""
        playing = self.left[self.left > 0]
        return int(playing.min()) if playing.size else np.iinfo(np.int64).max

    def observe(self, rewards: np.ndarray) -> None:
        """The round was played and ``rewards`` (R,) observed during it."""
        self.observe_block(rewards[None, :])

    def observe_block(self, rewards: np.ndarray) -> None:
        """``rewards`` (rounds, R) observed in consecutive rounds, no more than ``steady()`` of them."""
        rounds = rewards.shape[0]
        self.reward = np.cumsum(np.vstack([self.reward[None, :], rewards]), axis=0)[-1]  # round by round
        self.played += rounds
        self.left -= rounds * (self.left > 0)
        for run in np.flatnonzero(self.left == 0).tolist():
            self.done[run].append(Observed(self.current[run], int(self.played[run]), float(self.reward[run])))
            self._next_segment(run)

    def _next_segment(self, run: int) -> None:
        while not self.queues[run]:
            plan = self.plays_schedule[run]
            if plan.next == Next.NEVER:
                self._start(run, plan.hold, FOREVER)
                return
            self.plays_schedule[run] = plan = self.policy.plan(plan.state, self.done[run], [], self.rng)
            self.done[run] = []
            self.queues[run] = list(plan.segments)
        segment = self.queues[run].pop(0)
        self._start(run, segment, segment.slots)

    def _start(self, run: int, segment: Segment, slots: int) -> None:
        self.current[run] = segment
        self.arm[run], self.left[run], self.played[run], self.reward[run] = segment.arm, slots, 0, 0.0
