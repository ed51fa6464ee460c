"""Benchmark: what a guha-bayes plan costs per horizon H and delay δ (plays), at the default depth cap.

    .venv/bin/python -m benchmarks.guha_plan_cost [--horizons 50 100 200] [--delays 0 5 20] [--json OUT]
    .venv/bin/python -m benchmarks.guha_plan_cost --worlds [--json OUT]

``--worlds``: the service's plan at its defaults on the reference worlds of docs/algorithms/guha.md (four
arms at 5, 4, 3 and 2 %, the delay model and the decision rate declared, no params): the window, the step,
the seconds of a first plan (every arm at the prior: one DP) and of a re-plan (every arm at its own
posterior after 20,000 decisions: four DPs), and how long half the window, what a plan serves, lasts.

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
from typing import Any

import numpy as np
import orjson
from rich.console import Console
from rich.table import Table

from latebandit.campaign import Campaign, CampaignSpec
from latebandit.policies import ArmStats
from latebandit.policies.blockstream import ArmShape, BlockStreamArm
from latebandit.policies.guha import GuhaBayes
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


WORLDS = {
    "W1": ({"family": "pareto", "alpha": 1.5, "scale": 60}, 20.0),
    "W2": ({"family": "exponential", "mean": 3600}, 100.0),
    "W3": ({"family": "exponential", "mean": 86400}, 1000.0),
}
RATES = (0.05, 0.04, 0.03, 0.02)


def measure_world(name: str) -> dict[str, float | int | str]:
    delay, rate = WORLDS[name]
    body = {"id": name.lower(), "arms": ["a", "b", "c", "d"], "policy": {"name": "guha-bayes"}, "delay": delay,
            "decisions_per_second": rate}  # fmt: skip
    policy = Campaign(**CampaignSpec.model_validate(body).model_dump()).policy_impl
    assert isinstance(policy, GuhaBayes)
    fresh = ArmStats(np.zeros((1, 4)), np.zeros((1, 4)), np.zeros((1, 4)), np.ones(1))
    pulls = np.full((1, 4), 20_000.0)
    seen = ArmStats(pulls, pulls * np.array(RATES), pulls, np.array([pulls.sum() + 1]))
    seconds = []
    for stats in (fresh, seen):
        started = time.perf_counter()
        planned = policy.prepare(stats)
        seconds.append(time.perf_counter() - started)
    assert planned.plan is not None
    params, (steps, delay_steps) = policy.params(), policy.steps()
    return {
        "world": name, "delay": params["delay"], "horizon": params["horizon"], "unit": params["unit"],
        "steps": steps, "delay_steps": delay_steps, "first_plan_seconds": seconds[0],
        "replan_seconds": seconds[1], "serves_seconds": planned.plan.decisions / 2 / rate,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizons", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--delays", type=int, nargs="+", default=[0, 5, 20])
    parser.add_argument("--arms", type=int, default=2)
    parser.add_argument("--worlds", action="store_true", help="the service's defaults on W1, W2, W3 instead")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.worlds:
        rows: list[dict[str, Any]] = [measure_world(name) for name in WORLDS]
        title = "guha-bayes plan cost at the service's defaults, 4 arms"
    else:
        rows = [measure(h, d, args.arms) for h in args.horizons for d in args.delays]
        title = f"guha-bayes plan cost, {args.arms} arms, one shared Beta(1, 1) root"
    table = Table(title=title)
    for key in rows[0]:
        table.add_column(key, justify="right")
    for row in rows:
        table.add_row(*(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row.values()))
    Console().print(table)
    if args.json:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
