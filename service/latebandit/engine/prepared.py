"""A policy's next choice, computed while the worker waits instead of in the next request.

A policy with no standing law (patient-bandits, which does not stand; an opening; qpm-d: engine/standing.py)
pays its NumPy call on every decision, the largest part of a lone decision's time after the store's round
trip (docs/benchmarks.md). While a lone decision is being recorded, the next decision's statistics
are known already where no one else writes meanwhile: the counters the record script will answer (those the
worker holds, with the decision's pull counted: ``recorded``) and the histogram read it holds. The engine
computes the next choice then, in a callback that runs while the worker waits for the script's reply (after
the answer is too late: a closed loop of one connection sends its next request meanwhile), and keeps it; once the
decision is answered it checks that choice against the statistics it holds now and computes it again from
those if they differ (another worker's decision, a conversion). The next request takes it only if it decides
alone from those statistics: the same campaign object (policy version, floor), the same histogram and delay
histogram read (by identity), and counters of the same values. Whatever changes them discards it. The choice
is the one the policy call would have made from those statistics, with fresh uniforms: the same law, only
computed earlier. Nothing is prepared while decisions are queued: they go as one batch, which a single
prepared choice does not serve; nor where the store holds no statistics between decisions (the embedded one);
nor where a standing choice serves the next decision, which is renewed the same way instead
(DecisionEngine._prepare_next).
"""

from __future__ import annotations

from dataclasses import dataclass

from latebandit.campaign import Campaign
from latebandit.store.base import Counters, StateSnapshot


@dataclass(frozen=True)
class PreparedChoice:
    campaign: Campaign  # the configuration it was computed under (compared by identity)
    state: StateSnapshot  # the statistics it was computed from: reads by identity, counters by value
    arm: int
    propensity: float

    def serves(self, campaign: Campaign, state: StateSnapshot, decisions: int) -> bool:
        """Whether these are the statistics it was computed from: every read builds new arrays, and every reply
        new counters, compared by value."""
        return (
            decisions == 1
            and campaign is self.campaign
            and state.histogram is self.state.histogram
            and state.delays is self.state.delays
            and same_counts(state.counters, self.state.counters)
        )


def same_counts(counters: Counters, expected: Counters) -> bool:
    return counters is expected or (
        counters.decisions == expected.decisions
        and counters.pulls.tobytes() == expected.pulls.tobytes()
        and counters.conversions.tobytes() == expected.conversions.tobytes()
        and counters.matured.tobytes() == expected.matured.tobytes()
    )


def recorded(state: StateSnapshot, arm: int) -> StateSnapshot:
    """``state`` with one more decision, of ``arm``: the counters a record script answers when no one else
    wrote since ``state`` was read, built as the store builds them (store/redis.py, ``_counters_after``)."""
    counters = state.counters.with_pulls([arm], state.counters.decisions + 1)
    return StateSnapshot(counters, state.histogram, state.delays)
