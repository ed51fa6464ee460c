"""The backtest report: a table of every candidate's estimate, and its value over the log's time as a PNG
or a self-contained HTML page (the same figure as inline SVG, with the table)."""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from latebandit.figures import new_figure
from latebandit.replay.estimators import Estimate, running
from latebandit.replay.evaluate import Evaluation
from latebandit.replay.logged import CampaignLog
from latebandit.timeutil import MICROS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CURVE_POINTS = 200
COLUMNS = ("policy", "estimator", "value", "95% CI", "ESS", "steps", "clipped")


def rows(log: CampaignLog, evaluations: Sequence[Evaluation], logged: Estimate) -> list[list[str]]:
    """The table's rows: the logging policy's own value first, then each candidate's primary estimate."""

    def cells(name: str, estimate: Estimate, steps: str, clipped: str) -> list[str]:
        low, high = estimate.ci95
        return [name, estimate.estimator, f"{estimate.value:.4f}", f"{low:.4f} – {high:.4f}",
                f"{estimate.effective_sample_size:,.0f}", steps, clipped]  # fmt: skip

    table = [cells(f"{log.campaign.policy.name} (logged)", logged, f"{logged.effective_sample_size:,.0f}", "—")]
    for evaluation in evaluations:
        table.append(cells(evaluation.label, evaluation.primary, f"{evaluation.steps:,}", f"{evaluation.clipped:.1%}"))
    return table


def rich_table(log: CampaignLog, evaluations: Sequence[Evaluation], logged: Estimate) -> Table:
    title = (
        f"{log.campaign.id}: value per decision within the {log.campaign.window:g} s window, "
        f"{evaluations[0].decisions:,} decisions ({evaluations[0].known:,} with a closed window)"
    )
    table = Table(title=title)
    for column in COLUMNS:
        left = column in ("policy", "estimator")
        table.add_column(column, justify="left" if left else "right", no_wrap=column != "policy")
    for row in rows(log, evaluations, logged):
        table.add_row(*row)
    return table


def _when(micros: float) -> datetime:
    return datetime.fromtimestamp(micros / MICROS, tz=UTC)


def _figure(evaluations: Sequence[Evaluation], logged: Estimate, title: str) -> Figure:
    figure = new_figure((8.0, 4.5))
    ax = figure.subplots()
    times = evaluations[0].times
    curves = [(f"{e.label} ({e.primary.estimator})", e.primary) for e in evaluations]
    for label, estimate in [("logged policy (on-policy)", logged), *curves]:
        index, value, low, high = running(estimate.terms, CURVE_POINTS)
        when = [_when(times[i]) for i in index]
        # Matplotlib takes datetimes through its unit converters, which its type stubs leave out.
        (line,) = ax.plot(when, value, label=label, linewidth=1.4)  # type: ignore[arg-type]
        ax.fill_between(when, low, high, color=line.get_color(), alpha=0.15, linewidth=0)  # type: ignore[arg-type]
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("decision time (UTC)", fontsize=8)
    ax.set_ylabel("estimated value so far (95 % CI)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    figure.autofmt_xdate()
    figure.tight_layout()
    return figure


def write_plot(path: Path, log: CampaignLog, evaluations: Sequence[Evaluation], logged: Estimate) -> None:
    """A PNG, or (``.html``) a page with the figure as SVG and the table."""
    title = f"{log.campaign.id}: estimated value per decision over time"
    figure = _figure(evaluations, logged, title)
    if path.suffix.lower() != ".html":
        figure.savefig(path, dpi=90)
        return
    svg = io.StringIO()
    figure.savefig(svg, format="svg")
    head = "".join(f"<th>{html.escape(column)}</th>" for column in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
        for row in rows(log, evaluations, logged)
    )
    path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:right}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{svg.getvalue()}<table><tr>{head}</tr>{body}</table></body></html>",
        encoding="utf-8",
    )
