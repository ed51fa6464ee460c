"""Run ``latebandit loadtest`` against a live service and summarise what it measured."""

from __future__ import annotations

import asyncio
import itertools
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from rich.table import Table

from latebandit.client import NO_RETRY, Client, ServiceError, Unreachable, aggregate
from latebandit.loadtest.client import LoadResult, run_load
from latebandit.loadtest.traffic import AdServer, Mix, Tally
from latebandit.timeutil import format_time, wall_clock

KINDS = ("choose", "feedback")
DEFAULT_CAMPAIGN = {
    "arms": [f"arm{k}" for k in range(10)], "policy": {"name": "delayed-klucb", "params": {}},
    "delay": {"family": "exponential", "mean": 2.0}, "window": 3600,
}  # fmt: skip


class LoadTestError(ValueError):
    """The load test cannot start (bad URL, unknown campaign, service unreachable); the message says why."""


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    base: str


def parse_url(url: str) -> Target:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise LoadTestError(f"--url must be http://host[:port] (got {url!r}); the load client speaks plain HTTP/1.1")
    port = parts.port or 80
    return Target(parts.hostname, port, f"http://{parts.hostname}:{port}")


def prepare_campaign(client: httpx.Client, campaign: str | None) -> str:
    """The given campaign, which must exist, or a new one created for this run (needs the admin scope)."""
    if campaign is not None:
        answer = client.get(f"/campaigns/{campaign}")
        if answer.status_code != 200:
            raise LoadTestError(f"campaign {campaign!r}: {answer.status_code} {answer.text[:200]}")
        return campaign
    created = f"loadtest-{secrets.token_hex(4)}"
    answer = client.post("/campaigns", json={"id": created, **DEFAULT_CAMPAIGN})
    if answer.status_code != 201:
        raise LoadTestError(f"creating campaign {created!r}: {answer.status_code} {answer.text[:200]}")
    return created


def takes_aggregates(client: Client, campaign: str) -> tuple[bool, str]:
    """Probe with one empty aggregate: the service says whether the campaign's policy takes them (any other
    refusal, e.g. ``before_decision`` for a campaign with no decision yet, still means it does)."""
    now = format_time(wall_clock())
    try:
        answer = client.feedback([aggregate(campaign, now, now, 0.0)])
    except ServiceError as error:
        raise LoadTestError(f"/feedback answered {error}") from error
    rejected = answer.rejected
    if rejected and rejected[0].reason == "wrong_feedback_kind":
        return False, rejected[0].detail
    return True, ""


@dataclass(frozen=True)
class LoadReport:
    campaign: str
    duration: float
    concurrency: int
    result: LoadResult
    tally: Tally
    aggregates_skipped: str  # why no aggregates were sent ("" if they were)

    def endpoint(self, kind: str) -> dict[str, float]:
        result = self.result
        count = len(result.latencies.get(kind, []))
        statuses = result.statuses.get(kind, {})
        return {
            "requests": count,
            "per_second": count / result.seconds,
            "p50_ms": result.percentile(50, kind) * 1e3,
            "p90_ms": result.percentile(90, kind) * 1e3,
            "p99_ms": result.percentile(99, kind) * 1e3,
            "errors": sum(n for status, n in statuses.items() if status >= 400 or status == 0),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "campaign": self.campaign, "duration": self.result.seconds, "concurrency": self.concurrency,
            "throughput": self.result.throughput, "errors": self.result.errors,
            "endpoints": {kind: self.endpoint(kind) for kind in KINDS},
            "statuses": {kind: {str(s): n for s, n in by.items()} for kind, by in self.result.statuses.items()},
            "counts": self.tally.as_dict(), "aggregates_skipped": self.aggregates_skipped or None,
        }  # fmt: skip


def run_loadtest(
    url: str, duration: float, concurrency: int, campaign: str | None, api_key: str | None, seed: int
) -> LoadReport:
    target = parse_url(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(base_url=target.base, headers=headers, timeout=30.0) as admin:
            campaign = prepare_campaign(admin, campaign)
        with Client(target.base, api_key=api_key, timeout=30.0, retry=NO_RETRY) as client:
            aggregates, why_not = takes_aggregates(client, campaign)
    except (httpx.HTTPError, Unreachable) as error:
        raise LoadTestError(f"cannot reach {target.base}: {error}") from error
    mix = Mix(campaign, aggregates=aggregates, headers=headers)
    tally = Tally()
    run = secrets.token_hex(4)
    seeds = itertools.count(seed)

    def session() -> AdServer:
        number = next(seeds)
        return AdServer(mix, tally, f"lt{run}-{number}", number)

    result = asyncio.run(run_load(target.host, target.port, session, duration, concurrency))
    return LoadReport(campaign, duration, concurrency, result, tally, why_not)


def report_table(report: LoadReport) -> Table:
    title = (
        f"loadtest of campaign {report.campaign}: {report.result.seconds:.1f} s, {report.concurrency} connections, "
        f"{report.result.throughput:,.0f} requests/s"
    )
    table = Table(title=title)
    for column in ("endpoint", "requests", "req/s", "p50 ms", "p90 ms", "p99 ms", "errors"):
        table.add_column(column, justify="left" if column == "endpoint" else "right")
    for kind in KINDS:
        row = report.endpoint(kind)
        table.add_row(f"/{kind}", f"{row['requests']:,}", f"{row['per_second']:,.0f}", f"{row['p50_ms']:.2f}",
                      f"{row['p90_ms']:.2f}", f"{row['p99_ms']:.2f}", str(row["errors"]))  # fmt: skip
    return table


def summary_lines(report: LoadReport) -> list[str]:
    t = report.tally
    lines = [
        f"{t.decisions:,} decisions ({t.choose_retries:,} /choose retries with the same request_id, "
        f"{t.choose_retry_mismatches} answered with another decision); {t.feedback_retries:,} /feedback batches "
        "re-sent whole",
        f"{t.conversions_sent:,} conversions, {t.duplicates_sent:,} duplicates and {t.aggregates_sent:,} aggregates "
        f"sent; the service counted {t.accepted:,} accepted, {t.duplicates:,} duplicates, {t.censored:,} censored, "
        f"{t.rejected:,} rejected {t.rejection_reasons or ''}",
        f"{t.retries:,} requests retried after a 503 or a lost connection",
    ]
    if report.aggregates_skipped:
        lines.append(f"aggregates skipped: {report.aggregates_skipped}")
    return lines
