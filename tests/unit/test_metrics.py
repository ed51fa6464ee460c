"""Label cardinality caps (latebandit/metrics.py): campaigns and arms beyond them never get labels of their own."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from latebandit import metrics


@pytest.fixture
def small_caps(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(metrics, "caps", metrics.LabelCaps(campaigns=2, arms=2))
    monkeypatch.setattr(metrics, "_labelled", {})
    yield


def test_campaigns_and_arms_beyond_the_caps_share_the_other_label(small_caps: None) -> None:
    assert metrics.arm_label("c1", "a") == ("c1", "a")
    assert metrics.arm_label("c1", "b") == ("c1", "b")
    assert metrics.arm_label("c1", "z") == ("c1", metrics.OTHER)  # a third arm
    assert metrics.arm_label("c2", "z") == ("c2", "z")  # each campaign has its own arm budget
    assert metrics.arm_label("c3", "a") == (metrics.OTHER, metrics.OTHER)  # a third campaign
    assert metrics.arm_label("c1", "a") == ("c1", "a")  # first come, kept
    assert metrics.campaign_label("c3") == metrics.OTHER


def test_per_arm_gauges_are_not_exported_beyond_the_caps(small_caps: None) -> None:
    row = {"effective_pulls": 3.0, "pending": 1, "estimate": None, "index": 0.5, "pending_age": 12.0}
    metrics.publish_arms("capped", {"a": row, "b": row, "c": row})

    def value(arm: str) -> float | None:
        return REGISTRY.get_sample_value("latebandit_arm_effective_pulls", {"campaign": "capped", "arm": arm})

    assert (value("a"), value("b"), value("c"), value(metrics.OTHER)) == (3.0, 3.0, None, None)
    estimate = REGISTRY.get_sample_value("latebandit_arm_estimate", {"campaign": "capped", "arm": "a"})
    assert estimate is not None and math.isnan(estimate)  # undefined: NaN, not a made-up number
    pending_age = REGISTRY.get_sample_value("latebandit_arm_pending_age_seconds", {"campaign": "capped", "arm": "a"})
    assert pending_age == 12.0
