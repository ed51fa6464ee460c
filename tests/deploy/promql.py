"""The PromQL of deploy/: every expression of the alert rules and the Grafana dashboard, parsed by an
independent PromQL parser (promql-parser, the Rust parser of the Prometheus ecosystem) to the metric names
it selects."""

from __future__ import annotations

import json
from pathlib import Path

import promql_parser
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ALERTS = DEPLOY / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "latebandit.json"
PROMETHEUS_OWN = frozenset({"up"})
"""Series Prometheus itself adds to every scrape target: the only names not exported by the service."""


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    """The panel queries with the dashboard's variable filled in as Grafana would (all campaigns)."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"].replace("$campaign", ".*") for panel in panels for target in panel.get("targets", [])]


def metric_names(expression: str) -> set[str]:
    """The metric names an expression selects (ValueError if it does not parse)."""
    names: set[str] = set()
    _collect(promql_parser.parse(expression), names)
    return names


def _collect(node: object, names: set[str]) -> None:
    if isinstance(node, promql_parser.VectorSelector):
        if node.name:
            names.add(node.name)
        return
    if isinstance(node, list | tuple):
        for item in node:
            _collect(item, names)
        return
    for child in ("lhs", "rhs", "expr", "param", "args", "vector_selector"):
        value = getattr(node, child, None)
        if value is not None:
            _collect(value, names)
