"""Benchmark: what the service's standing choice (engine/choosing.py) costs in regret, in the simulator.

    .venv/bin/python -m benchmarks.standing_regret [--runs 200] [--rounds 1 16 64] [--as-if-standing]

The service draws a campaign's arms from its policy's last distribution for up to 64 decisions while the
histogram read and the conversions it was computed from stand, for the policies that stand
(``Policy.standing``: all but patient-bandits, adapt-patient-bandits, guha-bayes and qpm-d). The simulator
plays that rule (``run_policy(standing_rounds=...)``: a run's law is renewed after 64 rounds or as soon as a
conversion arrives, and meanwhile ignores Ñ's growth too), here on Vernade et al. 2017's settings (θH and
θL, geometric delays of mean 500 rounds, window 1,000, 10,000 rounds), where 64 rounds are an eighth of the
mean delay: far harsher than a service whose delays are hours and whose 64 decisions take milliseconds.
Each row is one policy's mean final regret over the same runs (same seeds: common random numbers) for each
reuse length, and the difference to asking the policy every round with its standard error (paired by run).
``--as-if-standing`` lets patient-bandits stand too: what that would change, the measurement behind its
exclusion.
"""

from __future__ import annotations

import argparse

import numpy as np
from rich.console import Console
from rich.table import Table

from latebandit.policies import POLICIES as POLICY_CLASSES
from latebandit.sim.reproductions.vernade2017 import GEOMETRIC, HORIZON, THETA_H, THETA_L, WINDOW
from latebandit.sim.runner import mean_and_error, run_policy
from latebandit.sim.scenario import Scenario, scenario_from_mapping

PARAMS = {"delayed-thompson": {"propensity_samples": 1}}  # its propensity estimate plays no part in regret
POLICIES = ("delayed-klucb", "delayed-thompson", "delayed-ucb", "patient-bandits", "klucb", "ucb1")


def scenario(arms: tuple[float, ...], runs: int, horizon: int = HORIZON) -> Scenario:
    return scenario_from_mapping({
        "horizon": horizon, "runs": runs, "seed": 2017, "arms": list(arms), "delay": GEOMETRIC, "window": WINDOW,
        "policies": [{"name": name, "params": PARAMS.get(name, {})} for name in POLICIES], "checkpoints": [horizon],
    })  # fmt: skip


def final_regret(world: Scenario, policy: str, standing_rounds: int) -> np.ndarray:
    """(R,) each run's regret at the horizon."""
    spec = next(spec for spec in world.policies if spec.name == policy)
    return run_policy(world, spec, standing_rounds=standing_rounds).final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, nargs="+", default=[1, 16, 64], help="reuse lengths (first: reference)")
    parser.add_argument("--as-if-standing", action="store_true", help="let patient-bandits stand too")
    args = parser.parse_args()
    if args.as_if_standing:
        for name in POLICIES:
            POLICY_CLASSES[name].stands = True
    console = Console(width=160)
    for name, arms in (("θH", THETA_H), ("θL", THETA_L)):
        world = scenario(arms, args.runs)
        table = Table(title=f"{name} = {arms}, {args.runs} runs, final regret at T = {HORIZON:,}")
        table.add_column("policy")
        for rounds in args.rounds:
            table.add_column(f"reuse {rounds}")
        for policy in POLICIES:
            reference = final_regret(world, policy, args.rounds[0])
            cells = [_mean(reference)]
            for rounds in args.rounds[1:]:
                regret = final_regret(world, policy, rounds)
                difference, error = mean_and_error(regret - reference)
                cells.append(f"{_mean(regret)}  ({difference:+.1f} ± {error:.1f})")
            table.add_row(policy, *cells)
        console.print(table)


def _mean(regret: np.ndarray) -> str:
    mean, error = mean_and_error(regret)
    return f"{mean:.1f} ± {error:.1f}"


if __name__ == "__main__":
    main()
