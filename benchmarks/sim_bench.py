"""Benchmark: the vectorised simulator on the Vernade 2017 setting and on the other accounting paths.

    .venv/bin/python -m benchmarks.sim_bench [--runs 100] [--horizon 10000] [--reproductions] [--json OUT]

The headline row is the issue's target: K = 3, T = 10,000, 100 runs, three policies (d-klucb, d-ucb and
the delay-naive klucb) on θL with geometric delays (μ = 500) censored at m = 1000, under 30 s on two
cores. Further rows time each Ñ path (decayed sums, block convolution, per-arm delays), each feed
(discarding, plug-in) and the cost of more runs; ``--reproductions`` also times every registered
reproduction at the paper's number of runs. Seconds are wall-clock, one process, one policy at a time.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from latebandit.sim.reproductions import REPRODUCTIONS, run_reproduction
from latebandit.sim.runner import simulate
from latebandit.sim.scenario import scenario_from_mapping

THETA_L = [0.1, 0.05, 0.03]
GEOMETRIC = {"family": "geometric", "p": 0.002}
PARETO = {"family": "pareto", "alpha": 1.1, "scale": 20.0}
CRITEO = {
    "family": "mixture",
    "weights": [0.33, 0.18, 0.49],
    "components": [{"family": "exponential", "mean": m} for m in (0.75, 78.0, 1008.0)],
}
VERNADE = [{"name": "delayed-klucb"}, {"name": "delayed-ucb"}, {"name": "klucb"}]


def cases(runs: int, horizon: int) -> list[tuple[str, dict[str, Any]]]:
    """(name, scenario) pairs; the first is the headline."""

    def scenario(policies: list[dict[str, Any]], delay: Any = GEOMETRIC, window: int | None = 1000, **extra: Any):
        return {
            "horizon": horizon,
            "runs": runs,
            "seed": 1,
            "arms": THETA_L,
            "delay": delay,
            "window": window,
            "policies": policies,
        } | extra

    return [
        ("Vernade setting: d-klucb, d-ucb, klucb (geometric, m=1000)", scenario(VERNADE)),
        ("same, uncensored", scenario(VERNADE, window=None)),
        ("d-klucb, Criteo-like mixture (decayed sums, 3 terms)", scenario([VERNADE[0]], CRITEO, 2160)),
        ("d-klucb, Pareto α=1.1 censored m=1000 (block convolution)", scenario([VERNADE[0]], PARETO)),
        ("d-klucb, Pareto α=1.1 uncensored (block convolution, lookback T)", scenario([VERNADE[0]], PARETO, None)),
        (
            "d-klucb, per-arm delays: geometric, Pareto, uniform",
            scenario([VERNADE[0]], [GEOMETRIC, PARETO, {"family": "uniform", "low": 0, "high": 2000}]),
        ),
        ("discarding-klucb (matured pulls)", scenario([{"name": "delayed-klucb", "feed": "discarding"}])),
        ("d-klucb plug-in τ̂, censored (O(R·m) per round)", scenario([{"name": "delayed-klucb", "feed": "plugin"}])),
        ("d-klucb plug-in μ̂, uncensored", scenario([{"name": "delayed-klucb", "feed": "plugin"}], window=None)),
        ("d-ucb, 1 run", scenario([VERNADE[1]], runs=1)),
        (f"d-ucb, {10 * runs} runs", scenario([VERNADE[1]], runs=10 * runs)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--horizon", type=int, default=10_000)
    parser.add_argument("--reproductions", action="store_true", help="also time every reproduction")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for name, data in cases(args.runs, args.horizon):
        scenario = scenario_from_mapping(data)
        started = time.perf_counter()
        results = simulate(scenario)
        seconds = time.perf_counter() - started
        per_round = 1e6 * seconds / (scenario.horizon * len(results))
        rows.append(
            {
                "case": name,
                "runs": scenario.runs,
                "horizon": scenario.horizon,
                "policies": len(results),
                "seconds": seconds,
                "us_per_round_per_policy": per_round,
                "per_policy": {r.label: round(r.seconds, 2) for r in results},
            }
        )
    if args.reproductions:
        for reproduction in REPRODUCTIONS.values():
            panels = reproduction.panels(reproduction.runs)
            started = time.perf_counter()
            run_reproduction(reproduction, panels)
            seconds = time.perf_counter() - started
            policies = sum(len(panel.scenario.policies) for panel in panels)
            rows.append(
                {
                    "case": f"reproduce {reproduction.name}",
                    "runs": reproduction.runs,
                    "horizon": panels[0].scenario.horizon,
                    "policies": policies,
                    "seconds": seconds,
                    "us_per_round_per_policy": 1e6 * seconds / (panels[0].scenario.horizon * policies),
                    "per_policy": {},
                }
            )
    table = Table(title="latebandit simulator (wall-clock, one process)")
    for header in ("case", "runs", "T", "policies", "seconds", "µs/round/policy"):
        table.add_column(header, justify="left" if header == "case" else "right")
    for row in rows:
        table.add_row(
            row["case"],
            str(row["runs"]),
            f"{row['horizon']:,}",
            str(row["policies"]),
            f"{row['seconds']:.1f}",
            f"{row['us_per_round_per_policy']:.0f}",
        )
    Console().print(table)
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
