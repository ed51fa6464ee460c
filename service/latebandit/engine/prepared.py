"""A policy's next choice, computed while the worker waits for the next request instead of in it.

A policy with no standing law (patient-bandits, which does not stand; an opening; qpm-d: engine/standing.py)
pays its NumPy call on every decision, the largest part of a lone decision's time after the store's round
trip. Once a decision of one request has been recorded, the next decision's statistics are already known: the
counters this worker just wrote and the histogram read it holds. The engine then computes the next choice
after answering (a callback that runs once the response is written) and keeps it here; the next request takes
it only if it decides alone from exactly those statistics: the same campaign object (policy version, floor),
the same counters and the same histogram and delay histogram read, compared by identity. Whatever changes them
(a reply that brings another worker's writes, a new histogram read, a policy change) builds new ones, and so
discards it. The choice is the one the policy call would have made, from the same statistics and fresh
uniforms: the same law, only computed earlier. Nothing is prepared while decisions are queued: they go as one
batch, which a single prepared choice does not serve; nor where a standing choice serves the next decision,
which is renewed the same way instead, after the answer of the decision that used it up
(DecisionEngine._prepare_next).
"""

from __future__ import annotations

from dataclasses import dataclass

from latebandit.campaign import Campaign
from latebandit.store.base import StateSnapshot


@dataclass(frozen=True)
class PreparedChoice:
    campaign: Campaign  # the configuration it was computed under (compared by identity)
    state: StateSnapshot  # the statistics it was computed from: each array compared by identity
    arm: int
    propensity: float

    def serves(self, campaign: Campaign, state: StateSnapshot, decisions: int) -> bool:
        """Whether these are the statistics it was computed from: every write or read builds new arrays."""
        return (
            decisions == 1
            and campaign is self.campaign
            and state.counters is self.state.counters
            and state.histogram is self.state.histogram
            and state.delays is self.state.delays
        )
