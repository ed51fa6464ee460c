"""Benchmark: what adding an arm mid-campaign costs each index and Bayesian policy, in the simulator.

    .venv/bin/python -m benchmarks.arm_arrival [--scenario examples/arm-arrival.yaml] [--runs 100] [--mean M]

The scenario names an arm that arrives during the run (``arrivals``; by default examples/arm-arrival.yaml:
a fourth, better arm at T/2; ``--mean`` gives the arriving arm another mean). The same world is run three
ways: the arm arriving as the scenario says, the arm present from the start, and the arm never there. A new
arm starts with no pulls and no conversions, as an arm added to a live campaign does (POST
/campaigns/{id}/arms): index policies open it, Bayesian ones start it at their prior. Regret is counted
against the best arm present at each round, so a better arm's arrival raises the bar. Each row is one
policy's mean final regret ± its standard error over the runs, then the differences: to the arm from the
start (paired: the same arms, the same worlds run by run) and to the arm never there (unpaired: a world
without the arm draws other numbers), and the regret of the rounds from the arrival on. The expected
conversions a better arm adds over never having it are the bar's rise, Σ over the rounds from the arrival
of (its mean − the best mean before it), minus the regret difference.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from latebandit.sim.runner import PolicyResult, mean_and_error, run_policy
from latebandit.sim.scenario import Scenario, scenario_from_mapping

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "arm-arrival.yaml"


def variants(data: dict[str, Any], runs: int, mean: float | None) -> tuple[Scenario, Scenario, Scenario, int, int]:
    """The scenario as given (its arriving arm's mean ``mean`` if given), with every arm from the start, and
    without its arriving arm; that arm and its arrival round (the scenario must name one arriving arm)."""
    if len(data.get("arrivals") or {}) != 1:
        raise SystemExit("the scenario must name exactly one arriving arm in 'arrivals'")
    ((key, first),) = data["arrivals"].items()
    arm = int(key)
    if mean is not None:
        data = data | {"arms": [mean if k == arm else value for k, value in enumerate(data["arms"])]}
    base = data | {"runs": runs, "checkpoints": [first - 1, data["horizon"]] if first > 1 else [data["horizon"]]}
    never = {key: value for key, value in base.items() if key != "arrivals"}
    never["arms"] = [mean for k, mean in enumerate(data["arms"]) if k != arm]
    if isinstance(data["delay"], list):
        never["delay"] = [delay for k, delay in enumerate(data["delay"]) if k != arm]
    start = {key: value for key, value in base.items() if key != "arrivals"}
    return scenario_from_mapping(base), scenario_from_mapping(start), scenario_from_mapping(never), arm, first


def regret(scenario: Scenario, label: str) -> PolicyResult:
    return run_policy(scenario, next(spec for spec in scenario.policies if spec.label == label))


def cell(values: np.ndarray) -> str:
    mean, error = mean_and_error(values)
    return f"{mean:.1f} ± {error:.1f}"


def unpaired(a: np.ndarray, b: np.ndarray) -> str:
    (mean_a, error_a), (mean_b, error_b) = mean_and_error(a), mean_and_error(b)
    return f"{mean_a - mean_b:+.1f} ± {math.hypot(error_a, error_b):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", type=Path, default=EXAMPLE)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--mean", type=float, help="the arriving arm's mean (default: the scenario's)")
    args = parser.parse_args()
    data = yaml.safe_load(args.scenario.read_text(encoding="utf-8"))
    arrives, start, never, arm, first = variants(data, args.runs, args.mean)
    horizon = arrives.horizon
    before = max(mean for k, mean in enumerate(arrives.arms) if k != arm)
    rise = (horizon - first + 1) * max(0.0, arrives.arms[arm] - before)
    print(
        f"arm {arm} (mean {arrives.arms[arm]}) arriving at round {first:,} of {horizon:,}; {args.runs} runs; "
        f"final regret, mean ± standard error; the bar rises by {rise:,.0f} expected conversions\n"
    )
    print("| policy | arm never there | arm from the start | arm at its arrival | arrival − start | arrival − never "
          "| of the arrival run: from the arrival on |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for spec in arrives.policies:
        late, early, none = regret(arrives, spec.label), regret(start, spec.label), regret(never, spec.label)
        after = late.final - (late.at([first - 1])[0] if first > 1 else 0.0)
        paired = mean_and_error(late.final - early.final)
        print(
            f"| {spec.label} | {cell(none.final)} | {cell(early.final)} | {cell(late.final)} "
            f"| {paired[0]:+.1f} ± {paired[1]:.1f} | {unpaired(late.final, none.final)} | {cell(after)} |"
        )


if __name__ == "__main__":
    main()
