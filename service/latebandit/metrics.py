"""Prometheus metrics: what an operator asks of a running service (docs/operators.md, "Metrics", lists them all).

Label cardinality is bounded: per worker process, the first ``caps.campaigns`` campaigns seen get their own
``campaign`` label (LATEBANDIT_METRICS_CAMPAIGNS, default 200) and, within each, the first ``caps.arms`` arms
their own ``arm`` label (LATEBANDIT_METRICS_ARMS, default 50). Counters report the rest under "_other";
per-arm gauges, which cannot be summed, are not exported beyond the caps. Other labels take a fixed set of
values (outcomes, rejection reasons, store operations, histogram bounds).

An archived campaign's series are removed (``forget_campaign``), not left at their last value, and its label
is given back to the cap; the late conversions it still records count under "_other". With several workers
a worker may still hold series of a campaign another one archived, and prometheus-client cannot remove
series from its multiprocess files: the exposition leaves out the archived campaigns' series instead.

With several uvicorn workers, ``serve`` points PROMETHEUS_MULTIPROC_DIR at a fresh directory and /metrics
aggregates every worker's files (prometheus-client's multiprocess mode): counters and histograms are summed
over every worker that ever ran (a dead worker's counts stay: a counter never goes down), each gauge is
merged as its ``multiprocess_mode`` says, and the ``live*`` modes leave out workers that have died
(``exposition`` forgets them: uvicorn tells no one when it replaces a worker).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import warnings
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from latebandit.campaign import Campaign

OTHER = "_other"
DELAY_BUCKETS = (60, 600, 3600, 6 * 3600, 86_400, 3 * 86_400, 7 * 86_400, 14 * 86_400, 30 * 86_400)


@dataclass
class LabelCaps:
    campaigns: int = 200
    arms: int = 50


caps = LabelCaps()

DECISIONS = Counter(
    "latebandit_decisions_total", "Decisions served", ["campaign", "arm", "outcome"]
)  # outcome: new, repeated, fallback_paused, fallback_store_down, fallback_unreadable
FEEDBACK = Counter(
    "latebandit_feedback_events_total", "Accepted feedback events by outcome", ["campaign", "outcome"]
)  # outcome: counted, censored, repeat, stale, duplicate
FEEDBACK_REJECTED = Counter(
    "latebandit_feedback_rejected_total",
    "Rejected feedback events by reason (no campaign label: the ids of rejected events are untrusted input)",
    ["reason"],
)
SCHEDULE_PLANS = Counter(
    "latebandit_schedule_plans_total",
    "Plans committed by planning policies (ODAAF phases, ARS rounds, CLW blocks)",
    ["campaign"],
)
CONVERSION_DELAY = Histogram(
    "latebandit_conversion_delay_seconds",
    "Observed delays (occurred_at - decision time) of accepted conversions",
    ["campaign"],
    buckets=DELAY_BUCKETS,
)


def arm_gauge(name: str, documentation: str, *labels: str) -> Gauge:
    """A per-arm gauge (labels campaign, arm and ``labels``); across workers the latest value wins."""
    return Gauge(name, documentation, ["campaign", "arm", *labels], multiprocess_mode="mostrecent")


ARM_ESTIMATE = arm_gauge("latebandit_arm_estimate", "Policy estimate per arm (value units per decision)")
ARM_INDEX = arm_gauge("latebandit_arm_index", "Policy index per arm (on rewards scaled to [0, 1]: value / reward.max)")
ARM_REWARD = arm_gauge("latebandit_arm_reward", "Reward credited per arm (value units)")
ARM_EFFECTIVE = arm_gauge(
    "latebandit_arm_effective_pulls",
    "Delay-corrected pull count per arm",
)
ARM_PENDING = arm_gauge(
    "latebandit_arm_pending",
    "Pulls still inside the window without conversion",
)
ARM_OBSERVED_DELAYS = arm_gauge(
    "latebandit_arm_observed_delays",
    "First conversions of counted pulls whose delay the per-arm delay histogram holds",
)
ARM_DELAY_QUANTILE = arm_gauge(
    "latebandit_arm_delay_quantile_seconds",
    "Upper bound of a quantile of the observed conversion delays (log-spaced buckets, ratio sqrt 2)",
    "quantile",
)
ARM_DELAY_TAIL = arm_gauge(
    "latebandit_arm_delay_tail_alpha",
    "Tail exponent of the observed delays, P(D > x) ~ x^-alpha (grouped Hill estimate; NaN: too few delays)",
)
ARM_PENDING_AGE = arm_gauge(
    "latebandit_arm_pending_age_seconds",
    "Mean age of the pending pulls (NaN when none)",
)
DELAY_ASSUMED = Gauge(
    "latebandit_delay_assumed_ratio",
    "The delay model's share of in-window conversions with a delay <= le, F(min(le, m)) / F(m): compare with "
    "latebandit_conversion_delay_seconds_bucket / _count",
    ["campaign", "le"],
    multiprocess_mode="mostrecent",
)
CAMPAIGN_WINDOW = Gauge(
    "latebandit_campaign_window_seconds", "Censoring window m", ["campaign"], multiprocess_mode="mostrecent"
)
CAMPAIGN_VERSION = Gauge(
    "latebandit_campaign_policy_version", "Policy version (a policy change adds 1)", ["campaign"],
    multiprocess_mode="mostrecent",
)  # fmt: skip
CAMPAIGN_PAUSED = Gauge(
    "latebandit_campaign_paused", "1 while the campaign is paused", ["campaign"], multiprocess_mode="mostrecent"
)
MODEL_PENDING = Gauge(
    "latebandit_model_pending_decisions", "Contextual campaigns: decisions inside the window, whose conversions "
    "may still come", ["campaign"], multiprocess_mode="mostrecent",
)  # fmt: skip
MODEL_CORRECTION_SHARE = Gauge(
    "latebandit_model_correction_share", "Contextual campaigns: the delay correction's share of the exploration "
    "width (otf-linucb: S/(2f+S); otf-lints: the window's share of the inflation; worst arm). Above 0.75 "
    "(S > 3·2f) the campaign mostly explores", ["campaign"], multiprocess_mode="mostrecent",
)  # fmt: skip
MODEL_THETA_NORM = Gauge(
    "latebandit_model_theta_norm", "Contextual campaigns: the norm of the estimate θ̂ (of τ_m·θ)", ["campaign"],
    multiprocess_mode="mostrecent",
)  # fmt: skip
REPORT_LAG = Histogram(
    "latebandit_feedback_report_lag_seconds",
    "How late conversions are reported: received_at - occurred_at",
    ["campaign"],
    buckets=(1, 10, 60, 600, 3600, 6 * 3600, 86_400, 3 * 86_400, 7 * 86_400),
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
STORE_LATENCY = Histogram(
    "latebandit_store_seconds",
    "Round trips to the state store (Redis) by operation: a script name, snapshot, campaign or audit",
    ["operation"],
    buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 2.0),
)
# The lowest of the live workers' (livemin): one worker cut off from Redis or PostgreSQL reads 0, where the
# most recent write would flip between its 0 and the others' 1 and keep an alert's `for:` from holding.
# Each worker pings at once when it starts, so a worker's initial 0 lasts no longer than its first ping.
STORE_UP = Gauge(
    "latebandit_store_up", "1 if the last ping of the state store succeeded, in every worker (every second)",
    multiprocess_mode="livemin",
)  # fmt: skip
AUDIT_UP = Gauge(
    "latebandit_audit_up", "1 if the last ping of the audit database succeeded, in every worker (every second)",
    multiprocess_mode="livemin",
)  # fmt: skip
AUDIT_WRITE_LATENCY = Histogram(
    "latebandit_audit_write_seconds",
    "One audit transaction (a batch of queue entries) into the database",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
)
AUDIT_ERRORS = Counter("latebandit_audit_errors_total", "Audit drains that failed")
AUDIT_ROWS = Counter("latebandit_audit_rows_total", "Audit rows written")
AUDIT_BACKLOG = Gauge(  # every worker reads the same queues: the freshest read (max kept a dead worker's)
    "latebandit_audit_backlog", "Audit queue entries waiting for the database", multiprocess_mode="mostrecent"
)
AUDIT_LAG = Gauge(  # the worst live writer: a dead worker's lag stops growing but is no longer true
    "latebandit_audit_lag_seconds", "Seconds since the last successful audit drain", multiprocess_mode="livemax"
)
SPOOL_RECORDS = Gauge(
    "latebandit_audit_spool_records",
    "Fallback decisions spooled on local disk while Redis was away, not yet handed to the audit log",
    multiprocess_mode="livesum",
)
SPOOL_FULL = Counter("latebandit_audit_spool_full_total", "Fallback decisions refused: the spool held its limit")

PLAN_SECONDS = Gauge(
    "latebandit_plan_seconds", "Wall time of the last plan solve (guha-bayes)", ["campaign"], multiprocess_mode="max"
)
PLAN_STATES = Gauge(
    "latebandit_plan_states", "DP states of the last plan (guha-bayes)", ["campaign"], multiprocess_mode="max"
)
PLAN_BYTES = Gauge(
    "latebandit_plan_memory_bytes",
    "Memory of the last plan (guha-bayes): its tables, and the DP's working set while solving",
    ["campaign", "kind"],
    multiprocess_mode="max",
)  # kind: tables, working
PLANS = Counter("latebandit_plans_total", "Plan solves by result", ["campaign", "result"])  # result: ok, error
PLAN_PENDING_DECISIONS = Counter(
    "latebandit_plan_pending_decisions_total",
    "Decisions served by the policy's fallback rule while its first plan was being solved",
    ["campaign"],
)

_labelled: dict[str, set[str]] = {}  # campaign -> its arms with a label of their own
_archived: set[str] = set()  # campaigns this process saw archived: never labelled again


def campaign_label(campaign: str) -> str:
    if campaign in _labelled:
        return campaign
    if len(_labelled) < caps.campaigns and campaign not in _archived:
        _labelled[campaign] = set()
        return campaign
    return OTHER


def arm_label(campaign: str, arm: str) -> tuple[str, str]:
    label = campaign_label(campaign)
    if label == OTHER:
        return OTHER, OTHER
    arms = _labelled[campaign]
    if arm in arms:
        return label, arm
    if len(arms) < caps.arms:
        arms.add(arm)
        return label, arm
    return label, OTHER


@functools.lru_cache(maxsize=4096)  # ids are many, the labels they map to are capped: the busiest kept
def decision_counter(campaign: str, arm: str, outcome: str) -> Counter:
    """DECISIONS' series for a decision, looked up once: ``labels()`` converts, validates and locks on every
    call, several times the cost of the series' own ``inc`` (docs/benchmarks.md). The labels an id maps to never change
    within a worker (arm_label: first come, kept), so neither does its series."""
    return DECISIONS.labels(*arm_label(campaign, arm), outcome)


@functools.cache  # a handful of operation names
def store_latency(operation: str) -> Histogram:
    """STORE_LATENCY's series for ``operation``, looked up once (``decision_counter``): one per store call."""
    return STORE_LATENCY.labels(operation)


def gauge_labels(campaign: str, arm: str) -> tuple[str, str] | None:
    """The labels of a per-arm gauge, or None beyond the caps: gauges cannot be summed, so arms past the cap
    are not exported at all rather than overwriting each other under "_other"."""
    labels = arm_label(campaign, arm)
    return None if OTHER in labels else labels


STORE_ERROR_OPERATIONS = ("choose", "choose_audit", "feedback", "campaigns")


def preset(rejection_reasons: Iterable[str]) -> None:
    """Create the labelled error counters at 0, so that rate() and the alert rules see them before the first
    error (a series that does not exist yet is not 0 to PromQL)."""
    for reason in rejection_reasons:
        FEEDBACK_REJECTED.labels(reason)
    for operation in STORE_ERROR_OPERATIONS:
        STORE_ERRORS.labels(operation)


def exposition(archived: Collection[str] = ()) -> tuple[bytes, str]:
    """The metrics; in the multiprocess mode without the series of the ``archived`` campaigns (the store's
    list: other workers' archives too) nor of those this process archived."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        forget_dead_workers(directory)
        registry = CollectorRegistry()
        shared = multiprocess.MultiProcessCollector(None, directory)
        registry.register(WithoutCampaigns(shared, {*archived, *_archived}))
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST


def forget_dead_workers(directory: str) -> None:
    """Remove the ``live*`` gauge files of processes that no longer exist (prometheus-client's
    mark_process_dead), so that a worker uvicorn replaced after a crash no longer counts: another worker
    handed over its spool records, and its audit lag, frozen at its death, is no longer anyone's."""
    for path in Path(directory).glob("gauge_live*_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            with contextlib.suppress(FileNotFoundError):  # another worker's scrape removed it first
                multiprocess.mark_process_dead(pid, directory)
        except PermissionError:  # alive, as another user
            pass


def observe_all(histogram: Histogram, values: Sequence[float] | np.ndarray) -> None:
    """``histogram.observe`` of every value, in one step per bucket: prometheus-client has no batch observe,
    and a /feedback batch of 1,000 conversions spent a tenth of its time observing them one by one. Uses
    the client's own layout (per bucket the count of values whose first bound at or above them it is, plus
    the sum), which the exposition makes cumulative; checked against ``observe`` in the tests."""
    if len(values) == 0:
        return
    bounds = histogram._upper_bounds
    firsts = np.searchsorted(np.asarray(bounds), np.asarray(values, dtype=np.float64), side="left")
    for bucket, count in enumerate(np.bincount(firsts, minlength=len(bounds)).tolist()):
        if count:
            histogram._buckets[bucket].inc(count)
    histogram._sum.inc(float(np.sum(values)))


def publish_arms(campaign: str, rows: dict[str, dict[str, float | int | None]]) -> None:
    """Per-arm gauges from the state rows (refreshed with each histogram read, and by GET /state). An
    estimate or index that is undefined (no effective pull yet, or an infinite exploration index) is NaN."""
    for arm, row in rows.items():
        labels = gauge_labels(campaign, arm)
        if labels is None:
            continue
        for gauge, key in ((ARM_EFFECTIVE, "effective_pulls"), (ARM_PENDING, "pending"),
                           (ARM_ESTIMATE, "estimate"), (ARM_INDEX, "index"), (ARM_REWARD, "reward"),
                           (ARM_PENDING_AGE, "pending_age")):  # fmt: skip
            if key in row:  # the pending age comes with histogram reads only, not with GET /state
                value = row[key]
                gauge.labels(*labels).set(math.nan if value is None else value)


def publish_model(campaign: str, model: dict[str, Any]) -> None:
    """A contextual campaign's model gauges, from the ``model`` object of its state (engine/contextual.py)."""
    label = campaign_label(campaign)
    if label == OTHER:
        return
    MODEL_PENDING.labels(label).set(model["pending"])
    MODEL_CORRECTION_SHARE.labels(label).set(model["correction_share"])
    MODEL_THETA_NORM.labels(label).set(model["theta_norm"])


def publish_delays(campaign: str, summaries: dict[str, dict[str, Any]]) -> None:
    """Per-arm delay gauges from the ``delays`` summaries of the state (service/latebandit/delays/tail.py)."""
    for arm, summary in summaries.items():
        labels = gauge_labels(campaign, arm)
        if labels is None:
            continue
        ARM_OBSERVED_DELAYS.labels(*labels).set(summary["observed"])
        alpha = summary["tail_alpha"]
        ARM_DELAY_TAIL.labels(*labels).set(math.nan if alpha is None else alpha)
        for name, value in summary["quantiles"].items():
            level = f"{int(name[1:]) / 100:g}"  # "p50" → "0.5"
            ARM_DELAY_QUANTILE.labels(*labels, level).set(math.nan if value is None else value)


def publish_campaign(campaign: Campaign) -> None:
    """Per-campaign gauges, when a worker loads or changes a campaign: window, version, pause, and for each
    bound of the observed-delay histogram the delay model's share of in-window conversions below it. An
    archived campaign's series are removed instead."""
    if campaign.archived_at is not None:
        forget_campaign(campaign.id)
        return
    label = campaign_label(campaign.id)
    if label == OTHER:
        return
    CAMPAIGN_WINDOW.labels(label).set(campaign.window)
    CAMPAIGN_VERSION.labels(label).set(campaign.version)
    CAMPAIGN_PAUSED.labels(label).set(int(campaign.status == "paused"))
    model = campaign.delay_model
    if model.family == "unknown":
        return
    at_window = float(model.cdf(campaign.window))
    for bound in DELAY_BUCKETS:
        share = float(model.cdf(min(bound, campaign.window))) / at_window
        DELAY_ASSUMED.labels(label, floatToGoString(bound)).set(share)  # the histogram's own ``le`` text


def forget_campaign(campaign: str) -> None:
    """Remove every series of an archived campaign (prometheus-client's ``remove``, per labelled metric), so
    that dashboards and alerts stop showing it, and give its label back to the cap. In the multiprocess mode
    the removal has no effect on the files (prometheus-client warns so): ``exposition`` hides them."""
    _archived.add(campaign)
    if _labelled.pop(campaign, None) is None:  # never labelled: its events went to "_other"
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for metric in _per_campaign():
            metric.remove_by_labels({"campaign": campaign})
    decision_counter.cache_clear()  # it holds series just removed


def _per_campaign() -> list[Counter | Gauge | Histogram]:
    """This module's metrics with a ``campaign`` label."""
    return [
        value for value in globals().values()
        if isinstance(value, Counter | Gauge | Histogram) and "campaign" in value._labelnames
    ]  # fmt: skip


def multiprocess_mode() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class WithoutCampaigns(Collector):
    """A collector's metrics without the series of ``hidden`` campaigns."""

    def __init__(self, collector: Collector, hidden: Collection[str]) -> None:
        self.collector = collector
        self.hidden = hidden

    def collect(self) -> Iterator[Metric]:
        for metric in self.collector.collect():
            metric.samples = [sample for sample in metric.samples if sample.labels.get("campaign") not in self.hidden]
            yield metric
