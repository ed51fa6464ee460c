"""Benchmark: what predicting the next choice while a decision is recorded is worth (engine/choosing.py).

    .venv/bin/python -m benchmarks.prediction_ab [--duration 6] [--rounds 3]

Three servers on one Redis, each one uvicorn worker: latebandit as shipped; latebandit with
``Chooser.predict`` made a no-op, so that a lone decision's successor is prepared only once it is answered
(the rule before the prediction); and the bare endpoint of benchmarks/service_bench.py. They alternate,
``--rounds`` rounds of ``--duration`` seconds per case, on the /choose cases where the prediction can act:
patient-bandits (no standing law: a drawn choice every decision) and delayed-klucb (its standing law renewed
every 64th decision) at 1 and 4 connections. Every figure is a median, reported as a ratio to the bare
endpoint in the same run. Audit records drain in each worker (inline), the same for both variants.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

import httpx
import orjson
from rich.console import Console
from rich.table import Table

from benchmarks.service_bench import (
    CAMPAIGNS,
    RESULTS,
    Figures,
    deployment,
    load,
    median,
    start,
    teardown,
)
from tests.e2e.server import LATEBANDIT, Server, free_port, stop

CASES = [(name, connections) for connections in (1, 4) for name in ("patient-bandits", "delayed-klucb")]
VARIANTS = ("bare", "shipped", "no prediction")
WITHOUT_PREDICTION = [sys.executable, "-m", "benchmarks.prediction_ab", "--serve-without-prediction"]


def serve_without_prediction(arguments: list[str]) -> None:
    """``latebandit serve`` in this process with the prediction switched off (one worker: no fork)."""
    from latebandit.cli import app
    from latebandit.engine.choosing import Chooser

    Chooser.predict = lambda self, campaign, state: None  # type: ignore[method-assign]
    app(["serve", *arguments])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=6, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    workdir = RESULTS / "prediction_ab"
    workdir.mkdir(parents=True, exist_ok=True)
    env, prefix, database = deployment("inline")
    servers: dict[str, tuple[Server, int]] = {}
    try:
        ports = {variant: free_port() for variant in VARIANTS}
        bare = [sys.executable, "-m", "uvicorn", "benchmarks.bare_app:create_app", "--factory", "--port",
                str(ports["bare"]), "--no-access-log", "--log-level", "warning"]  # fmt: skip
        commands = {
            "bare": bare,
            "shipped": [*LATEBANDIT, "serve", "--port", str(ports["shipped"])],
            "no prediction": [*WITHOUT_PREDICTION, "--port", str(ports["no prediction"])],
        }
        for variant in VARIANTS:
            log = workdir / f"{variant.replace(' ', '-')}.log"
            servers[variant] = (start(commands[variant], env, ports[variant], log), ports[variant])
        shipped = servers["shipped"][0]
        for name, _ in CASES[:2]:
            created = httpx.post(f"{shipped.url}/campaigns", json=CAMPAIGNS[name])
            assert created.status_code == 201, created.text
        rounds: dict[tuple[str, str, int], list[Figures]] = {}
        for measure in (False, *[True] * args.rounds):  # a warm-up round of 2 s first
            for name, connections in CASES:
                body = [orjson.dumps({"campaign": CAMPAIGNS[name]["id"]})]
                for variant in VARIANTS:
                    figures = load(servers[variant][1], body, args.duration if measure else 2, connections)
                    if measure:
                        rounds.setdefault((variant, name, connections), []).append(figures)
        report({case: median(figures) for case, figures in rounds.items()}, args)
    finally:
        for server, _ in servers.values():
            stop(server)
        teardown(prefix, database)


def report(figures: dict[tuple[str, str, int], Figures], args: argparse.Namespace) -> None:
    console = Console(width=140)
    table = Table(title=f"/choose, {args.rounds} rounds of {args.duration} s (medians), ratios to bare in this run")
    for column in ("case", "connections", "variant", "req/s", "p50 ms", "p50 ratio", "p99 ratio", "errors"):
        table.add_column(column)
    rows = []
    for name, connections in CASES:
        bare = figures[("bare", name, connections)]
        for variant in VARIANTS[1:]:
            row = figures[(variant, name, connections)]
            p50, p99 = row.p50_ms / bare.p50_ms, row.p99_ms / bare.p99_ms
            table.add_row(name, str(connections), variant, f"{row.throughput:,.0f}", f"{row.p50_ms:.3f}",
                          f"{p50:.2f}", f"{p99:.2f}", str(row.errors))  # fmt: skip
            rows.append({"case": name, "connections": connections, "variant": variant, **asdict(row),
                         "p50_ratio": p50, "p99_ratio": p99})  # fmt: skip
    console.print(table)
    (RESULTS / "prediction_ab.json").write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-without-prediction"]:
        serve_without_prediction(sys.argv[2:])
    else:
        main()
