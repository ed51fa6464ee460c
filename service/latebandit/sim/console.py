"""What ``latebandit simulate`` and ``latebandit reproduce`` do and print (progress bars, rich tables,
the JSON and PNG outputs); service/latebandit/cli.py only parses arguments and maps errors to exit codes."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from latebandit.sim.contextual import simulate_contextual
from latebandit.sim.contextual_scenario import ContextualScenario, contextual_from_mapping
from latebandit.sim.plotting import plot_panels
from latebandit.sim.reproductions import REPRODUCTIONS, Check, Reproduction, run_reproduction
from latebandit.sim.reproductions.base import comparison, markers, reproduction_json, result_of
from latebandit.sim.runner import PolicyResult, contract_json, simulate, summary
from latebandit.sim.scenario import PolicySpec, Scenario, ScenarioError, read_scenario_document, scenario_from_mapping
from latebandit.tables import show

Callback = Callable[[int], None]


@contextmanager
def progress_bars(console: Console) -> Iterator[Callable[[str, int], Callback]]:
    """A factory of progress callbacks, one bar per (description, total rounds)."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as bars:

        def start(description: str, total: int) -> Callback:
            task = bars.add_task(escape(description), total=total)
            return lambda rounds: bars.advance(task, rounds)

        yield start


def results_table(title: str, results: list[PolicyResult]) -> Table:
    """Final regret across runs: mean, std, quantiles, the mean τ-weighted L(T) and the seconds taken."""
    table = Table(title=escape(title))
    table.add_column("policy", no_wrap=True)
    for header in ("mean", "std", "q05", "q25", "median", "q75", "q95", "L(T)", "s"):
        table.add_column(header, justify="right", no_wrap=True)
    for result in results:
        stats = summary(result)
        cells = [stats[key] for key in ("mean", "std", "q05", "q25", "q50", "q75", "q95", "weighted")]
        table.add_row(escape(result.label), *(f"{value:.1f}" for value in cells), f"{result.seconds:.1f}")
    return table


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))


def run_simulation(
    path: Path, json_out: Path | None, plot: Path | None, runs: int | None, seed: int | None, console: Console
) -> None:
    """``latebandit simulate``: ScenarioError for a bad file or a policy that cannot consume its feedback."""
    scenario = load_any_scenario(path).with_overrides(runs, seed)
    with progress_bars(console) as start:

        def bars(spec: PolicySpec) -> Callback:
            return start(spec.label, scenario.horizon)

        if isinstance(scenario, ContextualScenario):
            results = simulate_contextual(scenario, bars)
        else:
            results = simulate(scenario, bars)
    unit = " (value units)" if isinstance(scenario, Scenario) and scenario.revenue is not None else ""
    title = f"{path.name}: final regret{unit} at T = {scenario.horizon:,} over {scenario.runs} runs"
    title += f" (seed {scenario.seed})"
    show(results_table(title, results))
    if json_out is not None:
        _write_json(json_out, contract_json(scenario, results))
    if plot is not None:
        plot_panels([(path.name, results)], plot)


def load_any_scenario(path: Path) -> Scenario | ContextualScenario:
    """The scenario of a file, contextual when it has a ``contextual`` block; ScenarioError naming the file."""
    document = read_scenario_document(path)
    contextual = isinstance(document, Mapping) and "contextual" in document
    try:
        return contextual_from_mapping(document) if contextual else scenario_from_mapping(document)
    except ScenarioError as error:
        raise ScenarioError(f"{path}: {error}") from error


def list_table() -> Table:
    table = Table(title="reproductions (latebandit reproduce NAME)")
    for header in ("name", "figure", "runs", "panels"):
        table.add_column(header)
    for reproduction in REPRODUCTIONS.values():
        panels = ", ".join(panel.title for panel in reproduction.panels(1))
        table.add_row(reproduction.name, escape(reproduction.figure), str(reproduction.runs), escape(panels))
    return table


def reference_table(reproduction: Reproduction, results: dict[str, list[PolicyResult]]) -> Table:
    table = Table(title=escape(f"ours beside the reference ({reproduction.reference_source})"))
    for header in ("panel", "policy"):
        table.add_column(header, no_wrap=True)
    for header in ("rounds", "ours", "reference", "z at the last round"):
        table.add_column(header, justify="right")
    for panel, rows in reproduction.references.items():
        for label, reference in rows.items():
            ours, z = comparison(reference, result_of(results, panel, label))
            table.add_row(
                escape(panel),
                escape(label),
                " / ".join(map(str, reference.rounds)),
                " / ".join(f"{value:.1f}" for value in ours),
                " / ".join(f"{value:g}" for value in reference.values)
                + ("" if reference.se is None else f" (±{reference.se:g})"),
                f"{z:+.1f}",
            )
    return table


def checks_table(checks: list[Check]) -> Table:
    table = Table(title="statements of the paper, checked on our runs")
    for header in ("", "statement", "observed"):
        table.add_column(header)
    for check in checks:
        table.add_row("[green]✓[/]" if check.passed else "[red]✗[/]", escape(check.statement), escape(check.observed))
    return table


def run_reproduce(name: str, runs: int | None, json_out: Path | None, plot: Path | None, console: Console) -> None:
    """``latebandit reproduce NAME``: ScenarioError for an unknown name."""
    reproduction = REPRODUCTIONS.get(name)
    if reproduction is None:
        raise ScenarioError(f"no reproduction named {name!r}; known: {', '.join(REPRODUCTIONS)}")
    out = Console()
    out.print(
        f"[bold]{escape(reproduction.figure)}[/] ({reproduction.paper})\n{escape(reproduction.setting)}\n"
        f"paper: {escape(reproduction.claim)}"
    )

    panels = reproduction.panels(runs or reproduction.runs)
    with progress_bars(console) as start:
        results, checks = run_reproduction(
            reproduction, panels, lambda panel, spec: start(f"{panel.title} · {spec.label}", panel.scenario.horizon)
        )
    for panel in panels:
        show(results_table(_panel_title(panel.title, panel.scenario), results[panel.title]))
    if reproduction.references:
        show(reference_table(reproduction, results))
    show(checks_table(checks))
    if json_out is not None:
        _write_json(json_out, reproduction_json(reproduction, panels, results, checks))
    if plot is not None:
        plot_panels(
            [(p.title, results[p.title]) for p in panels],
            plot,
            reproduction.figure,
            markers(reproduction),
            reproduction.ratio_to,
        )


def _panel_title(title: str, scenario: Scenario | ContextualScenario) -> str:
    return f"{title}: final regret at T = {scenario.horizon:,} over {scenario.runs} runs"
