"""The ``latebandit`` command line (typer + rich)."""

from __future__ import annotations

import asyncio
import functools
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from urllib.parse import urlsplit

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from latebandit.config import Settings, UnsafeSettings
from latebandit.setting_flags import export_flags, flag_name, variable_name, with_setting_flags
from latebandit.tables import show

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

app = typer.Typer(
    help="latebandit: bandit decisions whose rewards arrive late.", no_args_is_help=True, pretty_exceptions_enable=False
)
console = Console(stderr=True)


def _secrets_in_argv(flags: Mapping[str, object]) -> list[str]:
    """The flags given that carry a secret: a process's arguments are visible to every local user (ps)."""
    secret = [name for name in ("secret", "previous_secrets", "api_keys") if flags[name] is not None]
    passwords = [name for name in ("redis_url", "database_url") if flags[name] and urlsplit(str(flags[name])).password]
    return [flag_name(name) for name in secret + passwords]


@app.command()
@with_setting_flags
def serve(**flags: object) -> None:
    """Start the HTTP service (embedded state and SQLite audit unless Redis/PostgreSQL URLs are given).
    Each setting has a flag (--max-skew sets LATEBANDIT_MAX_SKEW). Exits 2 on a refused setting, and 3 when
    a worker fails to start, whatever the number of workers."""
    from pydantic import ValidationError

    from latebandit.serving import run_service

    export_flags(flags)
    exposed = _secrets_in_argv(flags)
    if exposed:
        console.print(f"[yellow]warning: {', '.join(exposed)} on the command line, where any local user can read "
                      "it (ps): set the LATEBANDIT_* variable instead[/]")  # fmt: skip
    try:
        settings = Settings()
        settings.check()  # the application checks again in each worker, and logs the warnings
    except ValidationError as invalid:
        error = invalid.errors()[0]
        name = str(error["loc"][0])
        console.print(f"[red]{variable_name(name)} ({flag_name(name)}): {escape(error['msg'])}[/]")
        raise typer.Exit(2) from None
    except UnsafeSettings as unsafe:
        console.print(f"[red]{escape(str(unsafe))}[/]")
        raise typer.Exit(2) from None
    if settings.embedded and settings.workers > 1:
        console.print(
            "[red]the embedded in-process state serves one worker[/]: set LATEBANDIT_REDIS_URL for --workers > 1"
        )
        raise typer.Exit(2)
    metrics_dir = None
    if settings.workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        metrics_dir = tempfile.mkdtemp(prefix="latebandit-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        run_service(settings)
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


@app.command("audit-writer")
def audit_writer(
    metrics_port: Annotated[int | None, typer.Option(help="its /metrics port (LATEBANDIT_AUDIT_METRICS_PORT)")] = None,
) -> None:
    """Drain the Redis audit queue into the audit database, out of the API workers (run them with
    LATEBANDIT_AUDIT_WRITER=external). Stops on SIGTERM or SIGINT after a last drain."""
    import asyncio
    import signal

    from prometheus_client import start_http_server

    from latebandit.runtime import run_audit_writer

    settings = Settings()
    port = metrics_port if metrics_port is not None else settings.audit_metrics_port
    start_http_server(port, addr=settings.host)  # LATEBANDIT_HOST, as for `serve`

    async def run() -> None:
        stop = asyncio.Event()
        for number in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(number, stop.set)
        await run_audit_writer(settings, stop)

    console.print(f"audit writer: metrics on port {port}")
    asyncio.run(run())


@app.command()
def migrate() -> None:
    """Apply the Alembic migrations to LATEBANDIT_DATABASE_URL (or the embedded SQLite file), and create
    the audit tables' day partitions up to a few days ahead (the audit writer keeps creating them). The
    database itself must exist: on PostgreSQL, create it first (createdb)."""
    from sqlalchemy.exc import OperationalError

    from latebandit.audit.log import AuditLog
    from latebandit.audit.migrate import head_revision
    from latebandit.audit.partitions import DAY_US, day_start, ensure_days, last_day
    from latebandit.timeutil import format_time, wall_clock

    audit = AuditLog(Settings().sqlalchemy_url)
    try:
        audit.create_schema()
    except OperationalError as error:
        hint = _create_database_hint(audit.engine.url, error)
        if hint is None:
            raise
        console.print(f"[red]error:[/] {escape(hint)}")
        raise typer.Exit(1) from None
    now = wall_clock()
    created = ensure_days(audit.engine, now)
    last = last_day(audit.engine)
    if last is None:
        days = "no day partitions (SQLite)"
    else:
        days = f"day partitions up to {format_time(last)[:10]} exist ({(last - day_start(now)) // DAY_US} days ahead)"
    console.print(f"audit schema at revision [bold]{head_revision()}[/]; {days}; {len(created)} created")


def _create_database_hint(url: URL, error: Exception) -> str | None:
    """What to run when the database of ``url`` does not exist (PostgreSQL creates no database on connect);
    None for any other error."""
    if url.database is None or f'database "{url.database}" does not exist' not in str(error):
        return None
    host, port = url.host or "localhost", str(url.port or 5432)
    user = ["-U", url.username] if url.username else []
    createdb = shlex.join(["createdb", "-h", host, "-p", port, *user, url.database])
    return (
        f'PostgreSQL at {host}:{port} has no database "{url.database}": create it ({createdb}, or '
        f'CREATE DATABASE "{url.database}"; in psql), then run latebandit migrate again'
    )


@app.command()
def export(
    campaign: Annotated[str | None, typer.Option(help="only this campaign")] = None,
    since: Annotated[str | None, typer.Option(help="only events at or after this RFC 3339 time")] = None,
    until: Annotated[str | None, typer.Option(help="only events before this RFC 3339 time")] = None,
) -> None:
    """Write the audit log as an event log (JSONL) to stdout. Events are placed in time by when the service
    recorded them (a conversion by when it arrived), so --until T and --since T split the log in two."""
    from latebandit.audit.export import export_lines
    from latebandit.audit.log import AuditLog

    audit = AuditLog(Settings().sqlalchemy_url)
    if campaign is not None and not audit.has_campaign(campaign):
        console.print(f"[red]the audit log has no campaign {campaign!r}[/]")
        raise typer.Exit(1)
    out = sys.stdout
    since_us = None if since is None else _moment(since, "--since")
    until_us = None if until is None else _moment(until, "--until")
    for line in export_lines(audit, campaign, since_us, until_us):
        out.write(line + "\n")
    out.flush()


def _moment(text: str, flag: str) -> int:
    """An RFC 3339 option in epoch microseconds; exits with status 2 and the reason if it is not one."""
    from latebandit.timeutil import parse_time

    try:
        return parse_time(text)
    except ValueError as error:
        console.print(f"[red]{flag}: {error}[/]")
        raise typer.Exit(2) from error


ARCHIVE_LATER = 3  # archive's exit status when the same command may succeed later (a cron job retries)


@app.command()
def archive(
    until: Annotated[str, typer.Option(help="a UTC midnight (RFC 3339): archive what was recorded before it")],
    out: Annotated[Path, typer.Option(help="the archive to write (JSONL, gzip-compressed); never overwritten")],
) -> None:
    """Export what the audit log recorded before --until to a compressed event log, then drop it from the
    log. Refuses, changing nothing: exit 3 when it may succeed later (a campaign can still learn from the
    range, another archive runs, rows reached the range meanwhile), 2 for a bad --until or --out."""
    from latebandit.audit.archive import ArchiveRefused
    from latebandit.audit.archive import archive as archive_range
    from latebandit.audit.log import AuditLog
    from latebandit.timeutil import wall_clock

    settings = Settings()
    cut = _moment(until, "--until")
    try:
        done = archive_range(AuditLog(settings.sqlalchemy_url), settings, cut, out, wall_clock())
    except ArchiveRefused as error:
        console.print(f"[red]not archived[/]: {error}")
        raise typer.Exit(ARCHIVE_LATER if error.later else 2) from error
    rows = ", ".join(f"{count} from {table}" for table, count in done.removed.items())
    console.print(f"archived {done.lines} events to {done.path} ({done.size} bytes); dropped {rows}")


@app.command()
def replay(
    log: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="event log (JSONL, or gzip-compressed)")],
    campaign: Annotated[str | None, typer.Option(help="the campaign to report (default: the only one)")] = None,
    at: Annotated[str | None, typer.Option(help="replay up to this time (default: the log's latest)")] = None,
    dump_state: Annotated[Path | None, typer.Option(help="write the campaign's state object here")] = None,
    policy: Annotated[
        list[str] | None, typer.Option(help="evaluate this policy off-policy on the log (repeat for several)")
    ] = None,
    params: Annotated[list[str] | None, typer.Option(help="JSON params of each --policy, in the same order")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the estimate JSON here")] = None,
    plot: Annotated[Path | None, typer.Option(help="plot the estimates over time (.png or .html)")] = None,
    clip: Annotated[float, typer.Option(min=1.0, help="largest importance weight")] = 100.0,
    estimator: Annotated[
        str | None,
        typer.Option(
            help="replay, ips, snips or doubly-robust (default: replay on uniform logs, else DR; SNIPS on a "
            "contextual campaign's)"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(min=0, help="seed of the evaluated policies' draws")] = 0,
) -> None:
    """Re-apply a log's decisions and feedback to the campaign's own policy and show the resulting state;
    with --policy, also estimate each given policy's value on the log's traffic, delays re-enacted."""
    from latebandit.replay.apply import Replayer, read_log

    if policy:
        _require_plots(plot)
    as_of = _moment(at, "--at") if at else None
    replayer = Replayer(as_of, Settings())
    asyncio.run(replayer.apply_all(read_log(str(log))))
    if not replayer.campaigns:
        console.print("[red]the log holds no campaign line[/]")
        raise typer.Exit(1)
    if campaign is None:
        if len(replayer.campaigns) > 1:
            console.print(f"[red]the log holds several campaigns[/] ({', '.join(replayer.campaigns)}): pass --campaign")
            raise typer.Exit(1)
        campaign = next(iter(replayer.campaigns))
    if campaign not in replayer.campaigns:
        console.print(f"[red]no campaign {campaign!r} in the log[/]")
        raise typer.Exit(1)
    state = asyncio.run(replayer.state(campaign))
    if dump_state is not None:
        dump_state.write_bytes(orjson.dumps(state, option=orjson.OPT_INDENT_2))
    _print_state(state)
    _report_skipped(replayer.skipped)
    if policy:
        contextual = replayer.campaigns[campaign].contextual
        _evaluate(log, campaign, as_of, policy, params or [], json_out, plot, clip, estimator, seed, contextual)
    elif json_out is not None or plot is not None:
        console.print("[red]--json and --plot report an off-policy evaluation: pass --policy[/]")
        raise typer.Exit(2)


def _evaluate(
    log: Path, campaign: str, as_of: int | None, policies: list[str], params: list[str],
    json_out: Path | None, plot: Path | None, clip: float, estimator: str | None, seed: int, contextual: bool,
) -> None:  # fmt: skip
    """The off-policy part of ``replay``: one evaluation per --policy, a table, the JSON and the plot; a
    contextual campaign's policies choose among what each logged request offered (replay/contextual.py)."""
    from rich.progress import Progress

    from latebandit.replay.apply import read_log
    from latebandit.replay.contextual import evaluate_contextual, read_contextual_log
    from latebandit.replay.evaluate import Evaluation, evaluate, logged_value
    from latebandit.replay.logged import NotEvaluable, read_campaign_log
    from latebandit.replay.report import rich_table, write_plot

    if params and len(params) != len(policies):
        console.print(f"[red]{len(params)} --params for {len(policies)} --policy[/]: give one per policy, in order")
        raise typer.Exit(2)
    try:
        decoded = [orjson.loads(text) for text in params] or [{} for _ in policies]
    except orjson.JSONDecodeError as error:
        console.print(f"[red]--params is not JSON:[/] {escape(str(error))}")
        raise typer.Exit(2) from None
    if not all(isinstance(value, dict) for value in decoded):
        console.print("[red]--params must be a JSON object[/]")
        raise typer.Exit(2)
    try:
        if contextual:
            offered = read_contextual_log(read_log(str(log)), campaign, as_of)
            logged, judge = offered.log, functools.partial(evaluate_contextual, offered)
        else:
            logged = read_campaign_log(read_log(str(log)), campaign, as_of)
            judge = functools.partial(evaluate, logged)
        evaluations: list[Evaluation] = []
        with Progress(console=console, transient=True) as bar:
            for name, value in zip(policies, decoded, strict=True):
                task = bar.add_task(f"re-enacting {name}", total=len(logged.decisions))
                advance = functools.partial(bar.advance, task)
                evaluations.append(judge(name, value, clip, estimator, seed, advance))
    except NotEvaluable as refused:
        console.print(f"[red]cannot evaluate:[/] {escape(str(refused))}")
        raise typer.Exit(1) from None
    show(rich_table(logged, evaluations, logged_value(logged)))
    for reason, count in logged.skipped.items():
        console.print(f"[yellow]left out {count} {reason}[/]")
    if json_out is not None:
        documents = [evaluation.contract() for evaluation in evaluations]
        document = documents[0] if len(documents) == 1 else documents  # one per policy when several
        json_out.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    if plot is not None:
        write_plot(plot, logged, evaluations, logged_value(logged))


def _print_state(state: dict) -> None:
    title = f"{state['campaign']} ({state['policy']}), {state['decisions']} decisions, as of {state['as_of']}"
    if "model" in state:
        _print_model(title, state["model"])
        return
    table = Table(title=title)
    for column in ("arm", "pulls", "conversions", "effective_pulls", "estimate", "index", "pending"):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for arm, row in state["arms"].items():
        cells = [row[name] for name in ("pulls", "conversions", "effective_pulls", "estimate", "index", "pending")]
        table.add_row(arm, *("—" if value is None else f"{value:.6g}" for value in cells))
    show(table)


def _print_model(title: str, model: dict) -> None:
    """A contextual campaign's state: θ̂ per model block (each arm's, or the actions' one)."""
    table = Table(title=f"{title}: {model['conversions']} conversions counted, θ̂ estimates τ_m·θ")
    for column in ("block", "decisions", "pending", "theta"):
        table.add_column(column, justify="left" if column in ("block", "theta") else "right")
    blocks = model.get("arms") or {"actions": model}
    for block, row in blocks.items():
        theta = ", ".join(f"{value:.4g}" for value in row["theta"])
        table.add_row(block, str(row["decisions"]), str(row["pending"]), f"[{theta}]")
    show(table)


def _report_skipped(skipped: Mapping[str, int]) -> None:
    """The log lines a replay could not apply, by reason: a wrong archive order shows here."""
    for reason, count in skipped.items():
        console.print(f"[yellow]skipped {count} line(s): {reason.replace('_', ' ')}[/]")


@app.command()
def rebuild(
    campaign: Annotated[str | None, typer.Option(help="only this campaign")] = None,
    archive: Annotated[
        list[Path] | None,
        typer.Option(exists=True, dir_okay=False, help="an archive the log was cut from (repeat it, oldest first)"),
    ] = None,
) -> None:
    """Rebuild the Redis state from the audit log (after Redis lost its data), after the archives the log
    was cut from, if given: without them, what was archived no longer counts in the state."""
    from latebandit.audit.log import AuditLog
    from latebandit.audit.writer import AuditWriter
    from latebandit.replay.rebuild import Rebuilt, rebuild_redis
    from latebandit.runtime import redis_store

    settings = Settings()
    if settings.embedded:
        console.print("[red]LATEBANDIT_REDIS_URL is not set[/]: the embedded store rebuilds itself at start")
        raise typer.Exit(2)

    async def run() -> Rebuilt:
        store = redis_store(settings)
        audit = AuditLog(settings.sqlalchemy_url)
        try:
            # What Redis still queues must reach the log first, or the rebuilt state would lose it.
            await AuditWriter(store, audit, settings.audit_batch).flush()
            return await rebuild_redis(audit, store, settings, campaign, [str(path) for path in archive or ()])
        finally:
            await store.close()

    rebuilt = asyncio.run(run())
    if campaign is not None and not rebuilt.campaigns:
        console.print(f"[red]the audit log has no campaign {campaign!r}[/]")
        raise typer.Exit(1)
    _report_skipped(rebuilt.skipped)
    console.print(f"rebuilt {len(rebuilt.campaigns)} campaign(s): {', '.join(rebuilt.campaigns) or 'none'}")


def _require_plots(plot: Path | None) -> None:
    """Before any work: exit 2 with the install hint when --plot is asked for without matplotlib."""
    from latebandit.figures import require_plots

    if plot is not None:
        try:
            require_plots()
        except ValueError as missing:
            console.print(f"[red]error:[/] {escape(str(missing))}")
            raise typer.Exit(2) from None


@app.command()
def simulate(
    scenario: Annotated[Path, typer.Argument(help="scenario file (.json, .yaml), docs/reference/scenarios.md")],
    json_out: Annotated[Path | None, typer.Option("--json", help="write the results JSON here")] = None,
    plot: Annotated[Path | None, typer.Option(help="write a PNG of the regret curves here")] = None,
    runs: Annotated[int | None, typer.Option(min=1, help="override the scenario's number of runs")] = None,
    seed: Annotated[int | None, typer.Option(min=0, help="override the scenario's seed")] = None,
) -> None:
    """Run many independent runs of the scenario's policies on its environment, vectorised across runs."""
    from latebandit.sim.console import run_simulation
    from latebandit.sim.scenario import ScenarioError

    _require_plots(plot)
    try:
        run_simulation(scenario, json_out, plot, runs, seed, console)
    except ScenarioError as error:
        console.print(f"[red]error:[/] {escape(str(error))}")
        raise typer.Exit(2) from None


@app.command()
def reproduce(
    name: Annotated[str | None, typer.Argument(help="the reproduction to run (see --list)")] = None,
    list_: Annotated[bool, typer.Option("--list", help="list the reproducible figures and tables")] = False,
    runs: Annotated[int | None, typer.Option(min=1, help="override the paper's number of runs")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write our numbers, references and checks")] = None,
    plot: Annotated[Path | None, typer.Option(help="write a PNG of the regret curves here")] = None,
) -> None:
    """Re-run a paper's experiment at its settings and print our numbers beside the paper's."""
    from latebandit.sim.console import list_table, run_reproduce
    from latebandit.sim.scenario import ScenarioError

    if list_ or name is None:
        show(list_table())
        return
    _require_plots(plot)
    try:
        run_reproduce(name, runs, json_out, plot, console)
    except ScenarioError as error:
        console.print(f"[red]error:[/] {escape(str(error))}")
        raise typer.Exit(2) from None


@app.command()
def plan(
    campaign: Annotated[Path, typer.Argument(help="a campaign body (JSON) whose policy is guha-bayes")],
    json_out: Annotated[Path | None, typer.Option("--json", help="write the measurements as JSON here")] = None,
) -> None:
    """Solve a guha-bayes campaign's plan as the service would, and report its cost: seconds, peak memory,
    DP states, table bytes, and the plan (multiplier, mix, LP bound, priority order)."""
    from pydantic import ValidationError

    from latebandit.campaign import CampaignSpec
    from latebandit.engine.plan_cost import measure_plan

    try:
        spec = CampaignSpec.model_validate_json(campaign.read_bytes())
    except ValidationError as invalid:
        console.print(f"[red]error:[/] {invalid.errors()[0]['msg']}")
        raise typer.Exit(2) from None
    report = measure_plan(spec)
    table = Table(title=f"guha-bayes plan of {report['campaign']}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, value in report.items():
        if key != "campaign":
            table.add_row(key, f"{value:.6g}" if isinstance(value, float) else str(value))
    show(table)
    if json_out is not None:
        json_out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))


@app.command()
def loadtest(
    url: Annotated[str, typer.Option(help="the service's base URL (plain HTTP)")] = "http://127.0.0.1:8000",
    duration: Annotated[float, typer.Option(min=0.1, help="seconds of load")] = 10.0,
    concurrency: Annotated[int, typer.Option(min=1, max=1024, help="keep-alive connections")] = 16,
    campaign: Annotated[str | None, typer.Option(help="an existing campaign (default: create one)")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="LATEBANDIT_LOADTEST_KEY", help="bearer key")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the figures as JSON here")] = None,
    seed: Annotated[int, typer.Option(min=0, help="seed of the clients' random choices")] = 0,
) -> None:
    """Drive /choose and /feedback at a realistic mix (late conversions, duplicates, retries, aggregates
    where the campaign takes them) and report throughput, latency percentiles and errors."""

    from latebandit.loadtest.run import LoadTestError, report_table, run_loadtest, summary_lines

    try:
        report = run_loadtest(url, duration, concurrency, campaign, api_key, seed)
    except LoadTestError as error:
        console.print(f"[red]error:[/] {escape(str(error))}")
        raise typer.Exit(2) from None
    show(report_table(report))
    for line in summary_lines(report):
        Console().print(escape(line))
    if json_out is not None:
        json_out.write_bytes(orjson.dumps(report.as_dict(), option=orjson.OPT_INDENT_2))


def main() -> None:
    """The console script: expected failures (bad input, an unreachable server, a schema behind) print
    one clear line instead of a traceback."""
    from redis.exceptions import RedisError
    from sqlalchemy.exc import SQLAlchemyError

    from latebandit.runtime import SchemaBehind
    from latebandit.store.base import StoreUnavailable

    try:
        app()
    except (ValueError, OSError, SQLAlchemyError, RedisError, SchemaBehind, StoreUnavailable) as error:
        console.print(f"[red]error:[/] {escape(_first_line(error))}")
        raise SystemExit(1) from None


def _first_line(error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


if __name__ == "__main__":
    main()
