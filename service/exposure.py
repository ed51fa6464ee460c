"""The delay-corrected count Ñ_k = Σ_i F(min(age_i, m)) of Vernade et al. 2017, from the pull histogram.

Matured pulls (every pull of a bucket older than the window m) weigh F(m) each. A bucket inside the
window is evaluated

- exactly, when F is a mixture of exponentials (exponential included): the bucket keeps
  e_j = Σ_i exp(−λ_j·(end − s_i)), so Σ_i F(a_i) = c − Σ_j w_j·e_j·exp(−λ_j·(now − end)). A component
  much faster than a bucket (λ_j·w > 30) is left to the mean rule: its moments would underflow to 0 while
  exp(λ_j·w) overflows, and such a component has matured a few mean delays after each pull anyway;
- otherwise by the mean rule, c·F(min(now − s̄, m)) at the bucket's exact mean pull time s̄. For F twice
  differentiable on the bucket's ages the error is at most c·sup|F''|·w²/8 (second order: the first-order
  terms cancel at the mean), see vernade2017.md §3.4(e).

The bucket that straddles age m (some pulls older than m) uses the mean rule in every case; it adds at
most c·(F(m) − F(m − w)). With the default 64 buckets per window, w = m/64. Cost: O(cells) = O(K·B),
independent of the number of past decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.campaign import MAX_EXACT_DECAY, Campaign
from service.store.base import StateSnapshot
from service.timeutil import MICROS


@dataclass(frozen=True)
class Exposure:
    effective: np.ndarray  # (K,) Ñ
    pending: np.ndarray  # (K,) pulls younger than the window without a counted conversion
    pending_age: np.ndarray  # (K,) their mean age in seconds (at each bucket's mean pull time); NaN if none
    matured_cells: np.ndarray  # bool (n,): histogram cells whose pulls are all older than the window


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
    return Exposure(effective, pending.astype(np.int64), pending_age, matured)
