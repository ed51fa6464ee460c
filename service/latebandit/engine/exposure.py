"""The delay-corrected count Ñ_k = Σ_i F(min(age_i, m)) of Vernade et al. 2017, from the pull histogram.

Matured pulls (every pull of a bucket older than the window m) weigh F(m) each. A bucket inside the
window is evaluated

- exactly, when F is a mixture of exponentials (exponential included): the bucket keeps
  e_j = Σ_i exp(−λ_j·(end − s_i)), so Σ_i F(a_i) = c − Σ_j w_j·e_j·exp(−λ_j·(now − end)). A component
  much faster than a bucket (λ_j·w > 30) is left to the mean rule: its moments would underflow to 0 while
  exp(λ_j·w) overflows, and such a component has matured a few mean delays after each pull anyway;
- otherwise by the mean rule, c·F(min(now − s̄, m)) at the bucket's exact mean pull time s̄. For F twice
  differentiable on the bucket's ages the error is at most c·sup|F''|·w²/8 (second order: the first-order
  terms cancel at the mean), see docs/design-notes.md, "How Ñ is computed".

The bucket that straddles age m (some pulls older than m) uses the mean rule in every case; it adds at
most c·(F(m) − F(m − w)). With the default 64 buckets per window, w = m/64. Cost: O(cells) = O(K·B),
independent of the number of past decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from latebandit.campaign import MAX_EXACT_DECAY, Campaign
from latebandit.delays.tail import BUCKETS, upper_edges
from latebandit.policies.base import ArmStats, Envelope
from latebandit.store.base import Histogram, StateSnapshot
from latebandit.timeutil import MICROS


@dataclass(frozen=True)
class Exposure:
    effective: np.ndarray  # (K,) Ñ
    pending: np.ndarray  # (K,) pulls younger than the window without a counted conversion
    pending_age: np.ndarray  # (K,) their mean age in seconds (at each bucket's mean pull time); NaN if none
    matured_cells: np.ndarray  # bool (n,): histogram cells whose pulls are all older than the window
    pulls_seen: np.ndarray  # (K,) pulls the histogram read holds (matured included)
    delay_exposure: np.ndarray  # (K, delay_tail.BUCKETS) pulls at least as old as each delay bucket's upper edge
    tail_weight: np.ndarray | None = None  # (K,) W = Σ ψ(age) over the window, for a policy with an envelope
    reward_max: float = 1.0  # the campaign's reward.max: policies see S / reward_max, in [0, 1] a decision


def delay_exposure(campaign: Campaign, hist: Histogram, matured: np.ndarray, now: int) -> np.ndarray:
    """Per arm and delay bucket, the pulls old enough to have shown a delay anywhere in the bucket: a cell
    counts once its youngest edge is that old (a lower bound), matured pulls for edges within the window
    (their exact age is gone, so beyond the window nothing is known and the tail fit stops there)."""
    arms = len(campaign.arms)
    edges = upper_edges()
    youngest = (now - (hist.bucket + 1) * campaign.bucket_width_us) / MICROS
    reached = np.zeros((arms, BUCKETS + 1))
    np.add.at(reached, (hist.arm, np.searchsorted(edges, youngest, side="right")), hist.count)
    old_enough = np.cumsum(reached[:, ::-1], axis=1)[:, ::-1][:, 1:]  # cells with youngest age >= edge j
    return old_enough + matured[:, None] * (edges <= campaign.window)


def window_tail_weight(
    campaign: Campaign, hist: Histogram, matured: np.ndarray, now: int, envelope: Envelope
) -> np.ndarray:
    """W_k >= Σ_{pulls of k younger than the window} ψ(age): each cell at its youngest edge, which bounds every
    pull in it for a non-increasing ψ (docs/design-notes.md). Matured cells weigh 0; the cell
    straddling the window edge counts whole, which only widens the bound."""
    youngest = (now - (hist.bucket + 1) * campaign.bucket_width_us) / MICROS
    weight = np.where(matured, 0.0, hist.count * envelope.weights(youngest[None, :])[0])
    return np.bincount(hist.arm, weight, minlength=len(campaign.arms))


def bucket_moments(campaign: Campaign, decided_at: int) -> tuple[int, int, tuple[float, ...]]:
    """Where a pull at ``decided_at`` lands: its bucket, its offset in it (whole milliseconds, so that a
    bucket's sum of offsets stays far from int64 overflow), and its exponential moments."""
    width = campaign.bucket_width_us
    bucket, offset = divmod(decided_at, width)
    to_end = (width - offset) / MICROS
    return bucket, offset // 1000, tuple(float(np.exp(-rate * to_end)) for _, rate in campaign.exact_components)


def exposure(campaign: Campaign, state: StateSnapshot, now: int) -> Exposure:
    delay, window = campaign.delay_model, campaign.window
    arms = len(campaign.arms)
    hist = state.histogram
    width = campaign.bucket_width_us
    end_age = (now - (hist.bucket + 1) * width) / MICROS
    matured = end_age >= window
    inside = end_age + width / MICROS <= window
    count = hist.count.astype(np.float64)
    mean_time = hist.bucket * width + 1000.0 * hist.offset / np.maximum(hist.count, 1)
    mean_age = np.clip((now - mean_time) / MICROS, 0.0, window)
    weight = count * delay.cdf(mean_age) if delay.family != "unknown" else count
    exact = campaign.exact_components
    if exact and len(hist.count):
        weights, rates = np.array(exact).T
        inside_weight = count * weights.sum() - (hist.moments * np.exp(-np.outer(end_age, rates))) @ weights
        for share, rate in delay.exponential_components() or ():  # too fast to keep exactly: mean rule
            if rate * width / MICROS > MAX_EXACT_DECAY:
                inside_weight += share * count * -np.expm1(-rate * mean_age)
        weight = np.where(inside, np.maximum(inside_weight, 0.0), weight)
    at_window = float(delay.cdf(window)) if delay.family != "unknown" else 1.0
    weight = np.where(matured, count * at_window, weight)
    effective = at_window * state.counters.matured + np.bincount(hist.arm, weight, minlength=arms)
    open_cells = ~matured
    waiting = (hist.count - hist.converted)[open_cells]
    pending = np.bincount(hist.arm[open_cells], waiting, minlength=arms)
    age_sum = np.bincount(hist.arm[open_cells], waiting * mean_age[open_cells], minlength=arms)
    pending_age = np.divide(age_sum, pending, out=np.full(arms, np.nan), where=pending > 0)
    seen = state.counters.matured + np.bincount(hist.arm, hist.count, minlength=arms)
    exposed = delay_exposure(campaign, hist, state.counters.matured, now)
    most = campaign.reward.max
    stats = campaign_stats(state, effective, exposed, reward_max=most)
    envelope = campaign.policy_impl.envelope(campaign.on_active_arms(stats))
    weight = None if envelope is None else window_tail_weight(campaign, hist, matured, now, envelope)
    pending_count, seen_count = pending.astype(np.int64), seen.astype(np.int64)
    return Exposure(effective, pending_count, pending_age, matured, seen_count, exposed, weight, most)


def scaled_sums(conversions: np.ndarray, reward_max: float) -> np.ndarray:
    """S in the policies' units: value / reward.max (the same array at the default max of 1)."""
    return conversions if reward_max == 1.0 else conversions / reward_max


def campaign_stats(
    state: StateSnapshot,
    effective: np.ndarray,
    exposed: np.ndarray,
    tail_weight: np.ndarray | None = None,
    pending: np.ndarray | None = None,
    reward_max: float = 1.0,
) -> ArmStats:
    """One campaign's statistics as the policies take them: a batch of one run, t = decisions + 1, and S in the
    policies' units, value / ``reward_max`` (the bounded-reward forms of their indices and posteriors need
    rewards in [0, 1]; at the default max of 1, S itself)."""
    counters = state.counters
    return ArmStats(
        pulls=counters.pulls[None, :].astype(np.float64),
        conversions=scaled_sums(counters.conversions, reward_max)[None, :],
        effective=effective[None, :],
        t=np.array([counters.decisions + 1]),
        pending=None if pending is None else pending[None, :].astype(np.float64),
        tail_weight=None if tail_weight is None else tail_weight[None, :],
        delay_counts=state.delay_counts()[None],
        delay_exposure=exposed[None],
    )
