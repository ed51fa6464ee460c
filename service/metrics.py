"""Prometheus metrics. Label cardinality is bounded: at most ``MAX_CAMPAIGN_LABELS`` campaigns get their own
label values (per process, first come); the others are reported under campaign="_other" and arm="_other".

With several uvicorn workers, ``serve`` points PROMETHEUS_MULTIPROC_DIR at a fresh directory and /metrics
aggregates every worker's files (prometheus-client's multiprocess mode).
"""

from __future__ import annotations

import math
import os
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

MAX_CAMPAIGN_LABELS = 200
OTHER = "_other"

DECISIONS = Counter(
    "latebandit_decisions_total", "Decisions served", ["campaign", "arm", "outcome"]
)  # outcome: new, repeated, fallback_paused, fallback_store_down
FEEDBACK = Counter(
    "latebandit_feedback_events_total", "Accepted feedback events by outcome", ["campaign", "outcome"]
)  # outcome: counted, censored, repeat, stale, duplicate
FEEDBACK_REJECTED = Counter(
    "latebandit_feedback_rejected_total",
    "Rejected feedback events by reason (no campaign label: the ids of rejected events are untrusted input)",
    ["reason"],
)
CONVERSION_DELAY = Histogram(
    "latebandit_conversion_delay_seconds",
    "Observed delays (occurred_at - decision time) of accepted conversions",
    ["campaign"],
    buckets=(60, 600, 3600, 6 * 3600, 86_400, 3 * 86_400, 7 * 86_400, 14 * 86_400, 30 * 86_400),
)
ARM_ESTIMATE = Gauge(
    "latebandit_arm_estimate", "Policy estimate per arm", ["campaign", "arm"], multiprocess_mode="mostrecent"
)
ARM_INDEX = Gauge("latebandit_arm_index", "Policy index per arm", ["campaign", "arm"], multiprocess_mode="mostrecent")
ARM_EFFECTIVE = Gauge(
    "latebandit_arm_effective_pulls",
    "Delay-corrected pull count per arm",
    ["campaign", "arm"],
    multiprocess_mode="mostrecent",
)
ARM_PENDING = Gauge(
    "latebandit_arm_pending",
    "Pulls still inside the window without conversion",
    ["campaign", "arm"],
    multiprocess_mode="mostrecent",
)
ARM_OBSERVED_DELAYS = Gauge(
    "latebandit_arm_observed_delays",
    "First conversions of counted pulls whose delay the per-arm delay histogram holds",
    ["campaign", "arm"],
    multiprocess_mode="mostrecent",
)
ARM_DELAY_QUANTILE = Gauge(
    "latebandit_arm_delay_quantile_seconds",
    "Upper bound of a quantile of the observed conversion delays (log-spaced buckets, ratio sqrt 2)",
    ["campaign", "arm", "quantile"],
    multiprocess_mode="mostrecent",
)
ARM_DELAY_TAIL = Gauge(
    "latebandit_arm_delay_tail_alpha",
    "Tail exponent of the observed delays, P(D > x) ~ x^-alpha (grouped Hill estimate; NaN: too few delays)",
    ["campaign", "arm"],
    multiprocess_mode="mostrecent",
)
DECISION_LATENCY = Histogram(
    "latebandit_decision_seconds",
    "Time to answer /choose",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
)
FEEDBACK_LATENCY = Histogram(
    "latebandit_feedback_seconds", "Time to answer /feedback", buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5)
)
STORE_ERRORS = Counter("latebandit_store_errors_total", "State store calls that failed", ["operation"])
AUDIT_ERRORS = Counter("latebandit_audit_errors_total", "Audit drains that failed")
AUDIT_ROWS = Counter("latebandit_audit_rows_total", "Audit rows written")
AUDIT_BACKLOG = Gauge(
    "latebandit_audit_backlog", "Audit queue entries waiting for the database", multiprocess_mode="max"
)
AUDIT_LAG = Gauge(
    "latebandit_audit_lag_seconds", "Seconds since the last successful audit drain", multiprocess_mode="max"
)

_labelled: set[str] = set()


def campaign_label(campaign: str) -> str:
    if campaign in _labelled:
        return campaign
    if len(_labelled) < MAX_CAMPAIGN_LABELS:
        _labelled.add(campaign)
        return campaign
    return OTHER


def arm_label(campaign: str, arm: str) -> tuple[str, str]:
    label = campaign_label(campaign)
    return label, (arm if label != OTHER else OTHER)


def exposition() -> tuple[bytes, str]:
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST


def publish_arms(campaign: str, rows: dict[str, dict[str, float | int | None]]) -> None:
    """Per-arm gauges from the state rows (refreshed with each histogram read, and by GET /state). An
    estimate or index that is undefined (no effective pull yet, or an infinite exploration index) is NaN."""
    for arm, row in rows.items():
        labels = arm_label(campaign, arm)
        for gauge, key in ((ARM_EFFECTIVE, "effective_pulls"), (ARM_PENDING, "pending"),
                           (ARM_ESTIMATE, "estimate"), (ARM_INDEX, "index")):  # fmt: skip
            value = row[key]
            gauge.labels(*labels).set(math.nan if value is None else value)


def publish_delays(campaign: str, summaries: dict[str, dict[str, Any]]) -> None:
    """Per-arm delay gauges from the ``delays`` summaries of the state (service/delay_tail.py)."""
    for arm, summary in summaries.items():
        labels = arm_label(campaign, arm)
        ARM_OBSERVED_DELAYS.labels(*labels).set(summary["observed"])
        alpha = summary["tail_alpha"]
        ARM_DELAY_TAIL.labels(*labels).set(math.nan if alpha is None else alpha)
        for name, value in summary["quantiles"].items():
            level = f"{int(name[1:]) / 100:g}"  # "p50" → "0.5"
            ARM_DELAY_QUANTILE.labels(*labels, level).set(math.nan if value is None else value)
