"""A campaign's standing choice: the distribution its policy draws arms from, kept while the statistics it
was computed from stand, so that a decision costs one uniform draw instead of the policy's NumPy work (at 10 arms
more than all the rest of a request: docs/benchmarks.md).

An index policy's arm is the argmax of indices that read S, Ñ, N and t; Thompson sampling's a draw from a
posterior of S and Ñ (or N): Ñ only changes with a histogram read (at most every ``snapshot_interval``), S
with a counted conversion, N and t with each decision. The distribution is kept while the histogram read and
S are the ones it was computed from, for at most ``limit`` decisions: the pulls and rounds those decisions
add are ignored meanwhile, the staleness a full batch of the group commit has always had. Policies say
whether they have such a distribution (``Policy.standing``): not during an opening (its turn moves with t),
not for the policies that do not stand. The simulator plays the same rule (``FeedPlayer(standing_rounds=...)``)
and measured no regret moved; docs/design-notes.md has the figures.

A draw is an inverse-CDF lookup on one uniform: the same law as ``choose`` (ties uniform) and, with an
exploration floor, as ``with_floor`` (the mixture of the policy's distribution with the uniform one).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from latebandit.campaign import Campaign
from latebandit.policies.floor import mixed_probabilities
from latebandit.store.base import Histogram, StateSnapshot


@dataclass
class StandingChoice:
    campaign: Campaign  # the configuration (policy version, floor) it was computed under
    histogram: Histogram  # the histogram read it was computed from (compared by identity)
    conversions: bytes  # S per arm when computed
    remaining: int  # decisions it may still serve
    arms: list[int]  # the arms of positive probability
    bounds: list[float]  # their cumulative probabilities, the last one +inf
    propensity: list[float]  # each arm's probability (by arm index)

    @classmethod
    def of(cls, campaign: Campaign, state: StateSnapshot, law: np.ndarray, limit: int) -> StandingChoice | None:
        """From a policy's one-run ``standing`` row, with the campaign's exploration floor mixed in; None
        when the row is nan (no standing distribution)."""
        if np.isnan(law).any():
            return None
        if campaign.exploration_floor > 0:
            law = mixed_probabilities(law[None, :], campaign.exploration_floor)[0]
        propensity = law.tolist()
        arms = [arm for arm, p in enumerate(propensity) if p > 0]
        bounds = list(accumulate(propensity[arm] for arm in arms))
        bounds[-1] = float("inf")  # rounding never leaves a uniform draw past the last arm
        return cls(campaign, state.histogram, state.counters.conversions.tobytes(), limit, arms, bounds, propensity)

    def serves(self, campaign: Campaign, state: StateSnapshot, decisions: int) -> bool:
        return (
            decisions <= self.remaining
            and campaign is self.campaign
            and state.histogram is self.histogram
            and state.counters.conversions.tobytes() == self.conversions
        )

    def draw(self, decisions: int, rng: np.random.Generator) -> list[tuple[int, float]]:
        """``decisions`` arms and their propensities, one uniform each."""
        self.remaining -= decisions
        chosen = [self.arms[bisect_right(self.bounds, u)] for u in rng.random(decisions).tolist()]
        return [(arm, self.propensity[arm]) for arm in chosen]
