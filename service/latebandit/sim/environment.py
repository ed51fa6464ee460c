"""The simulated world, vectorised over R independent runs: rewards, delays in rounds, censoring, and the
three feedback views of docs/reference/scenarios.md (attributed, anonymous per-round sums, composite spread rewards).

Conventions (docs/reference/scenarios.md): the pull of round s yields a value X ∈ [0, 1] (Bernoulli(θ),
Beta(2θ, 2(1−θ)) for ``bounded``, or a revenue arm's capped reward / max: sim/rewards.py) and a delay D ≥ 0
in rounds from the arm's delay model. A conversion with D <= m counts; it arrives at the end of round
s + ⌈D⌉, so the decision of round n sees it exactly when D <= n − 1 − s = age, with probability τ(age).
Composite feedback pays X/spread at the end of each of the rounds s + ⌈D⌉ + j, j < spread (or the fraction
w_j of X when ``spread`` lists the parts: a reward shape of Wang et al. 2021, Figs. 2–4); a part later than
the window (D + j > m) is lost.

Run r draws its world from its own generator, seeded by (seed, r), in fixed chunks of rounds: run r sees
the same world whatever the number of runs, the horizon, or the policy playing. Policies therefore meet
common random numbers, and one run simulated alone reproduces its row of a batch.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from latebandit.delays.facts import support_end
from latebandit.sim.scenario import Scenario

WORLD_STREAM = 0  # spawn keys: (WORLD_STREAM, run) for the world of a run, (POLICY_STREAM,) for policies
POLICY_STREAM = 1
PRIOR_STREAM = 2  # (PRIOR_STREAM, run): the arm means of a run drawn from the scenario's prior
VALUE_STREAM = 3  # (VALUE_STREAM, run): the basket values of a revenue scenario's conversions
CHUNK = 1024  # rounds of outcomes drawn at once per run (memory: CHUNK·R·K doubles per table)
RING_ELEMENTS = 1 << 23  # cap on the calendar ring (rounds·runs·channels doubles); later dues spill to a list
BINCOUNT_SHARE = 4  # np.bincount over the whole ring beats np.add.at from ring size / 4 amounts on
BLOCK_PARTS = 1 << 21  # cap on the composite parts scheduled by one pull_block (rounds·runs·parts)
BOUNDED_CONCENTRATION = 2.0  # bounded rewards ~ Beta(cθ, c(1−θ)): mean θ, variance θ(1−θ)/(c+1)


def world_generator(seed: int, run: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(WORLD_STREAM, run)))


def policy_generator(seed: int) -> np.random.Generator:
    """The tie-breaking stream: the same for every policy of a scenario, so that two scenarios differing
    only in the window play identically until the window matters (docs/reproductions.md, Fig. 1)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(POLICY_STREAM,)))


def one_hot(arms: np.ndarray, n_arms: int) -> np.ndarray:
    """(R, K) indicator of each run's arm; a negative arm (no pull) gives a zero row."""
    out = np.zeros((arms.shape[0], n_arms))
    present = arms >= 0
    out[np.flatnonzero(present), arms[present]] = 1.0
    return out


class Ring:
    """The values of the last ``depth`` rounds, one per run; ``push`` returns the one pushed ``depth``
    rounds before (``fill`` while there is none), which is how pulls leave a window of length depth."""

    def __init__(self, depth: int, runs: int, fill: float, dtype: type = np.float64) -> None:
        self.depth = depth
        self._fill = fill
        self._buffer: np.ndarray = np.full((depth, runs), fill, dtype=dtype)
        self._count = 0

    def push(self, values: np.ndarray) -> np.ndarray:
        if self.depth == 0:
            return values
        slot = self._count % self.depth
        leaving = self._buffer[slot].copy()
        self._buffer[slot] = values
        self._count += 1
        return leaving


class Calendar:
    """Amounts that fall due in later rounds, per run and channel: a ring over the next ``span`` rounds
    and a spill list for the rare dues beyond it, so memory is bounded by RING_ELEMENTS, not the horizon.

    ``add`` schedules at lags >= 0 from the current round; ``pop`` returns what is due in the current
    round and moves to the next one. The spill is merged every span/2 rounds, which always happens at
    least once in the last span rounds before a due round.
    """

    def __init__(self, runs: int, channels: int, reach: int) -> None:
        """``reach``: the largest lag ``add`` will be given (later ones spill)."""
        self.span = max(1, min(reach + 1, RING_ELEMENTS // (runs * channels)))
        self._ring = np.zeros((self.span, runs, channels))
        self._merge_every = max(1, self.span // 2)
        self._spill: list[tuple[np.ndarray, ...]] = []
        self._now = 0

    def add(
        self, lags: np.ndarray, runs: np.ndarray, channels: np.ndarray, amounts: np.ndarray, distinct: bool = False
    ) -> None:
        """``distinct``: no two entries share a (lag, run) pair, so a plain indexed add is exact (and much
        faster than np.add.at, which the general case needs)."""
        near = lags < self.span
        slots = (self._now + lags[near]) % self.span
        if distinct:
            self._ring[slots, runs[near], channels[near]] += amounts[near]
        elif slots.size * BINCOUNT_SHARE >= self._ring.size:  # a block's many parts: summed per cell first
            cells = np.ravel_multi_index((slots, runs[near], channels[near]), self._ring.shape)
            self._ring += np.bincount(cells, amounts[near], minlength=self._ring.size).reshape(self._ring.shape)
        else:
            np.add.at(self._ring, (slots, runs[near], channels[near]), amounts[near])
        if not near.all():
            far = ~near
            self._spill.append((self._now + lags[far], runs[far], channels[far], amounts[far]))

    @property
    def longest_block(self) -> int:
        """The most rounds ``pop_block`` may take at once: the spill must be merged at least once in every
        half span, which one merge per block containing a multiple of span/2 guarantees."""
        return self._merge_every

    def pop(self) -> np.ndarray:
        return self.pop_block(1)[0]

    def pop_block(self, rounds: int) -> np.ndarray:
        """(rounds, R, channels): what is due in the next ``rounds`` rounds (at most ``longest_block``)."""
        if self._spill and -self._now % self._merge_every < rounds:
            due, runs, channels, amounts = (np.concatenate(parts) for parts in zip(*self._spill, strict=True))
            near = due < self._now + self.span
            np.add.at(self._ring, (due[near] % self.span, runs[near], channels[near]), amounts[near])
            self._spill = [(due[~near], runs[~near], channels[~near], amounts[~near])] if not near.all() else []
        slots = (self._now + np.arange(rounds)) % self.span
        out = self._ring[slots]
        self._ring[slots] = 0.0
        self._now += rounds
        return out


@dataclass(frozen=True)
class Pull:
    """One round's pulls across runs: what each will ever yield and when it is revealed."""

    arms: np.ndarray  # (R,) int64
    values: np.ndarray  # (R,) the reward X, 0 when the pull never converts
    delays: np.ndarray  # (R,) D in rounds (inf: never observed)
    counted: np.ndarray  # (R,) bool: X > 0 and D <= window, D finite (all of X counts, in attributed feedback)
    lags: np.ndarray  # (R,) int64 ⌈D⌉ where counted, else -1: rounds from the pull to the reveal


class Environment:
    """R runs of one scenario's world. Per round: ``pull(arms)`` then ``end_round()``, which returns the
    values that arrived during the round per run and arm; ``observe`` turns them into the feedback view."""

    def __init__(self, scenario: Scenario, runs: int | None = None, first_run: int = 0) -> None:
        self.scenario = scenario
        self.runs = scenario.runs if runs is None else runs
        self.means = self._means(scenario, first_run)  # (R, K) the conversion probabilities
        revenue = scenario.revenue
        # (R, K) the expected reward per decision, in value units (sim/rewards.py); regret is measured in them
        expected = self.means if revenue is None else self.means * revenue.conversion_values
        self.gaps = expected.max(axis=1, keepdims=True) - expected
        sets = scenario.arm_sets()  # per set of arms present: its first round, the gaps to its best arm
        self._firsts = [first for first, _ in sets]
        self._gaps = [expected[:, list(arms)].max(axis=1, keepdims=True) - expected for _, arms in sets]
        self.window = scenario.window
        self._generators = [world_generator(scenario.seed, first_run + r) for r in range(self.runs)]
        self._value_generators = [
            np.random.default_rng(np.random.SeedSequence(scenario.seed, spawn_key=(VALUE_STREAM, first_run + r)))
            for r in range(self.runs if revenue else 0)
        ]
        self._delay_models = scenario.delays[:1] if scenario.shared_delay else scenario.delays
        self._run_index = np.arange(self.runs)
        longest = min(
            max(support_end(model) for model in scenario.delays), math.inf if self.window is None else self.window
        )
        parts = len(scenario.spread)
        last_lag = scenario.horizon if math.isinf(longest) else math.ceil(longest) + parts - 1
        # room for the lags of a whole block of rounds (``pull_block``) on top of the longest delay
        self._calendar = Calendar(self.runs, scenario.n_arms, min(scenario.horizon, last_lag) + CHUNK)
        self._part_lags = np.arange(parts)
        self._part_fractions = np.array(scenario.spread)
        self._equal_parts = all(part == 1.0 / parts for part in scenario.spread)  # X / n, as a single part is
        self.round = 1  # the round being played
        self._rewards = self._delays = np.empty((0, self.runs, 0))

    def gaps_at(self, n: int) -> np.ndarray:
        """(R, K) the gaps at round n: to the best arm present then (an arm that has not arrived is never
        played, so its own entry plays no part); ``gaps`` once every arm is present."""
        return self._gaps[bisect_right(self._firsts, n) - 1]

    def _means(self, scenario: Scenario, first_run: int) -> np.ndarray:
        """The arms' means per run: the scenario's, or drawn from its prior with a stream of their own (the
        outcome and delay streams stay those of the run)."""
        if scenario.prior is None:
            return np.tile(np.array(scenario.arms), (self.runs, 1))
        a, b = scenario.prior
        draws = [
            np.random.default_rng(np.random.SeedSequence(scenario.seed, spawn_key=(PRIOR_STREAM, first_run + r)))
            for r in range(self.runs)
        ]
        return np.stack([generator.beta(a, b, scenario.n_arms) for generator in draws])

    def _draw_chunk(self) -> None:
        """The next CHUNK rounds of every run: rewards (C, R, K) and delays (C, R, 1 or K)."""
        rewards, delays = [], []
        revenue = self.scenario.revenue
        for r, (generator, means) in enumerate(zip(self._generators, self.means, strict=True)):
            if self.scenario.reward == "bernoulli":  # a revenue world: the Bernoulli world of the arms' p, then values
                converted = generator.random((CHUNK, means.size)) < means
                value = None if revenue is None else revenue.draw(self._value_generators[r], CHUNK)
                rewards.append(converted if value is None else np.where(converted, value, 0.0))
            else:
                inner = (means > 0) & (means < 1)
                a = np.where(inner, BOUNDED_CONCENTRATION * means, 1.0)
                b = np.where(inner, BOUNDED_CONCENTRATION * (1.0 - means), 1.0)
                rewards.append(np.where(inner, generator.beta(a, b, (CHUNK, means.size)), means))
            delays.append(np.stack([model.sample(generator, CHUNK) for model in self._delay_models], axis=1))
        self._rewards = np.stack(rewards, axis=1).astype(np.float64)
        self._delays = np.stack(delays, axis=1)

    def pull(self, arms: np.ndarray) -> Pull:
        """Play ``arms`` (R,) in the current round and schedule what they will reveal."""
        values, delays, counted, lags = self._schedule(arms, 1)
        return Pull(arms, values[0], delays[0], counted[0], lags[0])

    def end_round(self) -> np.ndarray:
        """(R, K) the values (parts, for composite) that arrived during the current round, by arm."""
        return self.end_block(1)[0]

    def longest_block(self) -> int:
        """The most rounds ``pull_block`` may play from the current round: the rest of the world's chunk,
        the calendar's limit, and at most BLOCK_PARTS scheduled parts of composite rewards."""
        offset = (self.round - 1) % CHUNK
        parts = max(1, BLOCK_PARTS // (self.runs * self._part_lags.size))
        return min(CHUNK - offset, self._calendar.longest_block, parts)

    def pull_block(self, arms: np.ndarray, rounds: int) -> None:
        """Play ``arms`` (R,) in each of the next ``rounds`` rounds (at most ``longest_block()``): the same
        world and the same arrivals as ``rounds`` calls of ``pull``, array operations only."""
        self._schedule(arms, rounds)

    def end_block(self, rounds: int) -> np.ndarray:
        """(rounds, R, K) the arrivals of the rounds of the block just pulled, round by round."""
        self.round += rounds
        return self._calendar.pop_block(rounds)

    def _schedule(self, arms: np.ndarray, rounds: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Values, delays, counted and lags (rounds, R) of ``arms`` played in the next ``rounds`` rounds;
        every part that will be observed goes on the calendar."""
        offset = (self.round - 1) % CHUNK
        if offset == 0:
            self._draw_chunk()
        runs, rows = self._run_index, slice(offset, offset + rounds)
        values = self._rewards[rows, runs, arms]
        delays = self._delays[rows, runs, arms if self._delays.shape[2] > 1 else 0]
        limit = np.inf if self.window is None else self.window
        counted = (values > 0) & np.isfinite(delays) & (delays <= limit)
        # Clipped past the horizon before the cast: a heavy tail (Pareto α = 0.3) draws delays beyond int64.
        beyond = self.scenario.horizon + 1.0
        lags = np.where(counted, np.ceil(np.minimum(np.where(counted, delays, 0.0), beyond)), -1).astype(np.int64)
        if rounds > 1 and self._part_lags.size > 1 and self.window is None:
            self._schedule_shapes(arms, values, counted, lags)
            return values, delays, counted, lags
        step = np.arange(rounds)[:, None, None]
        remaining = self.scenario.horizon - self.round - step  # later arrivals are never seen
        part = self._part_lags
        due = counted[..., None] & (delays[..., None] + part <= limit) & (lags[..., None] + part <= remaining)
        hit_rows, hit_runs, hit_parts = np.nonzero(due)
        if self._equal_parts:
            amounts = values[hit_rows, hit_runs] / part.size
        else:
            amounts = values[hit_rows, hit_runs] * self._part_fractions[hit_parts]
        due_in = hit_rows + lags[hit_rows, hit_runs] + hit_parts
        self._calendar.add(due_in, runs[hit_runs], arms[hit_runs], amounts, distinct=rounds == 1)
        return values, delays, counted, lags

    def _schedule_shapes(self, arms: np.ndarray, values: np.ndarray, counted: np.ndarray, lags: np.ndarray) -> None:
        """A block of composite rewards without a window: per run, the totals landing at each round after
        the block's start, convolved with the shape (C speed; scheduling every part of every pull costs
        rounds·parts array elements). Parts due after the horizon are scheduled too: never observed."""
        parts = self._part_lags.size
        shape = np.full(parts, 1.0 / parts) if self._equal_parts else self._part_fractions
        for run in range(self.runs):
            hit = np.flatnonzero(counted[:, run])
            if hit.size:
                landed = np.bincount(hit + lags[hit, run], values[hit, run])
                paid = np.convolve(landed, shape)
                due = np.flatnonzero(paid)
                self._calendar.add(due, np.full(due.size, run), np.full(due.size, arms[run]), paid[due], distinct=True)

    def observe(self, arrivals: np.ndarray) -> np.ndarray:
        """What the learner sees: per-arm arrivals (attributed), or only their per-run sum (R,)."""
        return arrivals if self.scenario.feedback == "attributed" else arrivals.sum(axis=1)
