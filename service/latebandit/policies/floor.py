"""The exploration floor: a campaign option that keeps every arm's propensity at least ``floor``, so the
logs it writes stay evaluable off-policy (an inverse-propensity weight never exceeds 1/floor).

With γ = K·floor, the arm is drawn uniformly with probability γ and from the policy otherwise, so arm a
has probability (1 − γ)·π(a) + floor, where π is the policy's own distribution (``Choice.probabilities``).
The logged propensity is that mixture probability of the arm actually played, whichever branch drew it.
Pure and vectorised like the policies: the generator is an argument and a batch of R runs consumes it
like R one-run calls (two uniforms per run).
"""

from __future__ import annotations

import numpy as np

from latebandit.policies.base import Choice, Policy


def check_floor(policy: Policy, floor: float) -> None:
    """ValueError unless ``floor`` is usable with ``policy``: in [0, 1/K], and the policy reports the
    probability of every arm (needed for the propensity of an arm it did not choose)."""
    limit = 1.0 / policy.n_arms
    if not 0.0 <= floor <= limit:
        raise ValueError(f"exploration_floor must lie in [0, 1/{policy.n_arms} = {limit:.6g}] (got {floor!r})")
    if floor > 0.0 and not policy.reports_probabilities:
        raise ValueError(
            f"policy {policy.name!r} does not report the probability of the arms it does not choose, which an "
            "exploration floor needs for exact propensities; leave exploration_floor at 0 for it"
        )


def mixed_probabilities(probabilities: np.ndarray, floor: float) -> np.ndarray:
    """(R, K) the arm distribution of the floored policy, from the policy's own (R, K) distribution."""
    arms = probabilities.shape[1]
    return (1.0 - arms * floor) * probabilities + floor


def with_floor(choice: Choice, floor: float, rng: np.random.Generator) -> Choice:
    """The policy's choice mixed with uniform exploration; unchanged (and no draw) when ``floor`` is 0."""
    if floor <= 0.0:
        return choice
    if choice.probabilities is None:
        raise ValueError("an exploration floor needs a policy that reports every arm's probability")
    runs, arms = choice.probabilities.shape
    draws = rng.random((runs, 2))
    explore = draws[:, 0] < arms * floor
    uniform_arm = np.minimum((draws[:, 1] * arms).astype(np.int64), arms - 1)
    arm = np.where(explore, uniform_arm, choice.arm)
    mixed = mixed_probabilities(choice.probabilities, floor)
    return Choice(arm, mixed[np.arange(runs), arm], mixed)
