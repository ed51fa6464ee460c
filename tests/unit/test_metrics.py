"""latebandit/metrics.py: label cardinality caps (campaigns and arms beyond them never get labels of their own),
the batch observation, and how several workers' metrics are merged."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from latebandit import metrics


@pytest.fixture
def small_caps(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(metrics, "caps", metrics.LabelCaps(campaigns=2, arms=2))
    monkeypatch.setattr(metrics, "_labelled", {})
    metrics.decision_counter.cache_clear()  # its series were looked up under the caps replaced here
    yield
    metrics.decision_counter.cache_clear()


def test_campaigns_and_arms_beyond_the_caps_share_the_other_label(small_caps: None) -> None:
    assert metrics.arm_label("c1", "a") == ("c1", "a")
    assert metrics.arm_label("c1", "b") == ("c1", "b")
    assert metrics.arm_label("c1", "z") == ("c1", metrics.OTHER)  # a third arm
    assert metrics.arm_label("c2", "z") == ("c2", "z")  # each campaign has its own arm budget
    assert metrics.arm_label("c3", "a") == (metrics.OTHER, metrics.OTHER)  # a third campaign
    assert metrics.arm_label("c1", "a") == ("c1", "a")  # first come, kept
    assert metrics.campaign_label("c3") == metrics.OTHER


def test_per_arm_gauges_are_not_exported_beyond_the_caps(small_caps: None) -> None:
    row = {"effective_pulls": 3.0, "pending": 1, "estimate": None, "index": 0.5, "pending_age": 12.0, "reward": 250.5}
    metrics.publish_arms("capped", {"a": row, "b": row, "c": row})

    def value(arm: str) -> float | None:
        return REGISTRY.get_sample_value("latebandit_arm_effective_pulls", {"campaign": "capped", "arm": arm})

    assert (value("a"), value("b"), value("c"), value(metrics.OTHER)) == (3.0, 3.0, None, None)
    estimate = REGISTRY.get_sample_value("latebandit_arm_estimate", {"campaign": "capped", "arm": "a"})
    assert estimate is not None and math.isnan(estimate)  # undefined: NaN, not a made-up number
    pending_age = REGISTRY.get_sample_value("latebandit_arm_pending_age_seconds", {"campaign": "capped", "arm": "a"})
    assert pending_age == 12.0
    assert REGISTRY.get_sample_value("latebandit_arm_reward", {"campaign": "capped", "arm": "a"}) == 250.5


def test_observe_all_exports_what_observing_one_by_one_exports() -> None:
    """The batch observation of /feedback against prometheus-client's own ``observe``: the same bucket
    counts, count and (to rounding) sum, including values on a bound and beyond the last one."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    values = [0.0, 59.9, 60.0, 60.1, 3599.0, 3600.0, 1e9, 42.0, 42.0]

    def exported(batch: bool) -> dict[tuple[str, str], float]:
        registry = CollectorRegistry()
        histogram = Histogram("delay_seconds", "d", ["campaign"], buckets=metrics.DELAY_BUCKETS, registry=registry)
        child = histogram.labels("c")
        if batch:
            metrics.observe_all(child, values)
            metrics.observe_all(child, [])
        else:
            for value in values:
                child.observe(value)
        families = text_string_to_metric_families(generate_latest(registry).decode())
        return {
            (s.name, s.labels.get("le", "")): s.value for f in families for s in f.samples if "created" not in s.name
        }

    one_by_one, together = exported(False), exported(True)
    assert one_by_one.keys() == together.keys()
    for key, value in one_by_one.items():
        assert together[key] == pytest.approx(value, rel=1e-12), key


def test_delay_gauges_are_not_exported_beyond_the_caps(small_caps: None) -> None:
    """Per-arm delay gauges follow the same rule as the others: never under "_other" (they cannot be summed,
    so arms beyond the cap would overwrite each other there)."""
    summary = {"observed": 7, "tail_alpha": None, "quantiles": {"p50": 60.0, "p90": None, "p99": None}}
    metrics.publish_delays("delays-capped", {"a": summary, "b": summary, "c": summary})

    def observed(arm: str) -> float | None:
        labels = {"campaign": "delays-capped", "arm": arm}
        return REGISTRY.get_sample_value("latebandit_arm_observed_delays", labels)

    assert (observed("a"), observed("b"), observed("c"), observed(metrics.OTHER)) == (7.0, 7.0, None, None)
    quantile = {"campaign": "delays-capped", "arm": metrics.OTHER, "quantile": "0.5"}
    assert REGISTRY.get_sample_value("latebandit_arm_delay_quantile_seconds", quantile) is None


WORKER = """
import sys
from latebandit import metrics
for name, value in {gauges!r}.items():
    getattr(metrics, name).set(value)
metrics.AUDIT_ROWS.inc({rows})
print(metrics.exposition()[0].decode() if {scrape} else "ready", flush=True)
sys.stdin.read()  # alive until the test closes its input
"""


def test_several_workers_sum_their_counters_and_merge_their_gauges_as_each_means(tmp_path) -> None:
    """prometheus-client's multiprocess mode, in three worker processes: one that died (its counts stay, its
    live gauges go), one alive and one scraped. The audit backlog is the freshest read of the shared queue,
    the lag the worst live writer's, the spool the sum over live workers."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}

    def worker(gauges: dict[str, float], rows: int, scrape: bool = False) -> subprocess.Popen[str]:
        script = WORKER.format(gauges=gauges, rows=rows, scrape=scrape)
        return subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)  # fmt: skip

    dead = worker({"AUDIT_LAG": 400, "AUDIT_BACKLOG": 5000, "SPOOL_RECORDS": 7}, rows=3)
    dead.communicate("", timeout=60)
    alive = worker({"AUDIT_LAG": 2, "AUDIT_BACKLOG": 20, "SPOOL_RECORDS": 1}, rows=5)
    assert alive.stdout is not None and alive.stdout.readline() == "ready\n"
    scraped = worker({"AUDIT_LAG": 1, "AUDIT_BACKLOG": 10, "SPOOL_RECORDS": 2}, rows=4, scrape=True)
    text, _ = scraped.communicate("", timeout=60)
    alive.communicate("", timeout=60)
    values = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}
    assert values["latebandit_audit_rows_total"] == 3 + 5 + 4
    assert values["latebandit_audit_backlog"] == 10
    assert values["latebandit_audit_lag_seconds"] == 2
    assert values["latebandit_audit_spool_records"] == 1 + 2


ARCHIVING_WORKER = """
import sys
from latebandit import metrics
metrics.FEEDBACK.labels("kept", "counted").inc()
metrics.FEEDBACK.labels("ended", "counted").inc()  # a worker that never learns of the archive
metrics.CAMPAIGN_WINDOW.labels("gone").set(60)
metrics.CAMPAIGN_WINDOW.labels("kept").set(60)
metrics.forget_campaign("gone")  # this worker archived it
print(metrics.exposition(["ended"])[0].decode(), flush=True)
"""


def test_archived_campaigns_series_are_left_out_of_the_multiprocess_exposition(tmp_path) -> None:
    """prometheus-client cannot remove series from its multiprocess files: the exposition leaves out those of
    the campaigns the store lists as archived and those this worker archived, and keeps the others'."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", ARCHIVING_WORKER], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    labels = {s.labels.get("campaign") for family in text_string_to_metric_families(run.stdout) for s in family.samples}
    assert "kept" in labels and not {"gone", "ended"} & labels


def test_an_archived_campaigns_series_are_removed_and_its_label_given_back(small_caps: None) -> None:
    metrics.FEEDBACK.labels(metrics.campaign_label("ends"), "counted").inc()
    metrics.decision_counter("ends", "a", "new").inc()
    metrics.forget_campaign("ends")
    exported = {s.labels.get("campaign") for family in REGISTRY.collect() for s in family.samples}
    assert "ends" not in exported
    assert metrics.campaign_label("ends") == metrics.OTHER  # its late feedback counts under "_other"
    assert metrics.campaign_label("next") == "next"  # the label it held is free for another campaign
