"""The engine's prepared contextual models (engine/contextual.py ``PreparedModels``): a lone decision's successor
serves exactly the statistics right after that decision, once the store counted it, and nothing else."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from latebandit.campaign import Campaign
from latebandit.engine.contextual import PreparedModels
from latebandit.policies.linear import FRESH_EVERY, PreparedIndex
from latebandit.store.base import Counters, Histogram, LinearSums, Pull, StateSnapshot, StateVersion

SPEC = {"id": "ctx", "policy": {"name": "otf-linucb"}, "features": 3, "window": 600.0}
V = StateVersion(policy=1, read=7, stamp=b"5", decisions=10)


def snapshot(campaign: Campaign, version: StateVersion) -> StateSnapshot:
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(10, 3)) / 3
    model = LinearSums((rows.T @ rows)[None], rows[:4].sum(axis=0)[None])
    counters = Counters.zeros(1).with_pulls([0] * 10, 10)
    return StateSnapshot(counters, Histogram.empty(len(campaign.exact_components)), version=version, model=model)


def decision(features: list[float], footprint: float, decision_id: str = "id") -> Pull:
    return Pull(0, 0, 0, (), decision_id, 1.0, {}, np.array(features), footprint)


def test_a_successor_serves_the_statistics_right_after_its_decision() -> None:
    campaign = Campaign(**SPEC)
    models = PreparedModels()
    model = models.prepare(campaign, snapshot(campaign, V), 0)
    assert isinstance(model, PreparedIndex)
    assert models.kept("ctx", V) is model
    models.follow(campaign, V, decision([0.3, -0.2, 0.1], 0.25))
    models.counted("ctx", "id")
    after = replace(V, decisions=11)
    successor = models.kept("ctx", after)
    assert isinstance(successor, PreparedIndex) and successor is not model
    assert successor.decisions.tolist() == [11.0] and successor.window_footprint.tolist() == [0.25]
    assert models.kept("ctx", after) is successor  # kept: it serves that version from now on
    assert models.kept("ctx", V) is None


def test_a_successor_serves_only_once_the_store_counted_its_decision() -> None:
    """A retried request is answered with its earlier decision: the one just chosen was never recorded, and the
    version one decision on may be another worker's decision's. Its successor never serves."""
    campaign = Campaign(**SPEC)
    models = PreparedModels()
    model = models.prepare(campaign, snapshot(campaign, V), 0)
    after = replace(V, decisions=11)
    models.follow(campaign, V, decision([0.3, -0.2, 0.1], 0.25, "retried"))
    models.counted("ctx", "an earlier one")
    assert models.kept("ctx", after) is None
    assert models.kept("ctx", V) is model
    models.counted("ctx", "retried")  # the decision the successor adds
    assert models.kept("ctx", after) is not None


def test_no_successor_across_a_write_a_read_or_another_decision_count() -> None:
    campaign = Campaign(**SPEC)
    for other in (replace(V, stamp=b"6", decisions=11), replace(V, read=8, decisions=11), replace(V, decisions=12)):
        models = PreparedModels()
        models.prepare(campaign, snapshot(campaign, V), 0)
        models.follow(campaign, V, decision([0.3, -0.2, 0.1], 0.25))
        models.counted("ctx", "id")
        assert models.kept("ctx", other) is None


def test_a_chain_of_successors_is_cut_after_fresh_every_decisions() -> None:
    """Each successor adds a Sherman–Morrison rounding: after FRESH_EVERY the next model is prepared afresh."""
    campaign = Campaign(**SPEC)
    models = PreparedModels()
    models.prepare(campaign, snapshot(campaign, V), 0)
    version = V
    for _ in range(FRESH_EVERY):
        models.follow(campaign, version, decision([0.01, 0.02, 0.0], 0.0))
        models.counted("ctx", "id")
        version = replace(version, decisions=version.decisions + 1)
        assert models.kept("ctx", version) is not None
    models.follow(campaign, version, decision([0.01, 0.02, 0.0], 0.0))
    models.counted("ctx", "id")
    assert models.kept("ctx", replace(version, decisions=version.decisions + 1)) is None
