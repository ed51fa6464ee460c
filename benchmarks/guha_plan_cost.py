"""Benchmark: what a guha-bayes plan costs per horizon H and delay δ (plays), at the default depth cap.

    .venv/bin/python -m benchmarks.guha_plan_cost [--horizons 50 100 200] [--delays 0 5 20] [--json OUT]

Per configuration: the depth cap that ``"params": {}`` resolves to for a 2-arm service campaign (caps
counted for one DP per arm), the DP's states and table bytes for one root, the wall seconds of one
λ sweep and of a whole plan (bisection + P⁺, P⁻, centre: the sweeps column), and whether the service
would accept it. A plan re-rooted at K distinct posteriors costs K times the one-root figures. Seconds are
wall-clock on a shared machine: compare rows of one run with each other, not across machines.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from latebandit.policies.blockstream import ArmShape, BlockStreamArm
from latebandit.policies.guha_plan import PlanTooLarge, check_size, largest_depth, solve_plan


def measure(horizon: int, delay: int, arms: int) -> dict[str, float | int | bool]:
    try:
        depth = largest_depth(1.0, 1.0, horizon, delay, arms)
        check_size([ArmShape(1.0, 1.0, horizon, delay, depth)] * arms)
        accepted = True
    except PlanTooLarge:
        depth, accepted = horizon, False
    shape = ArmShape(1.0, 1.0, horizon, delay, depth)
    started = time.perf_counter()
    BlockStreamArm(shape).solve(0.6)
    sweep = time.perf_counter() - started
    started = time.perf_counter()
    plan = solve_plan([(1.0, 1.0)] * arms, horizon, delay, depth)
    return {
        "horizon": horizon, "delay": delay, "depth": depth, "states": shape.states, "table_bytes": shape.table_bytes,
        "working_bytes": shape.working_bytes, "sweep_seconds": sweep, "plan_seconds": time.perf_counter() - started,
        "sweeps": plan.cost.solves, "accepted": accepted,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizons", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--delays", type=int, nargs="+", default=[0, 5, 20])
    parser.add_argument("--arms", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [measure(h, d, args.arms) for h in args.horizons for d in args.delays]
    table = Table(title=f"guha-bayes plan cost, {args.arms} arms, one shared Beta(1, 1) root")
    for key in rows[0]:
        table.add_column(key, justify="right")
    for row in rows:
        table.add_row(*(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row.values()))
    Console().print(table)
    if args.json:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
