"""Benchmark: the CPU one decision's policy call costs, for the /choose benchmark's campaigns.

    .venv/bin/python -m benchmarks.policy_call_bench [--calls 3000]

A policy that stands (engine/choosing.py) pays ``standing`` once per histogram read, conversion or 64
decisions and a uniform draw per decision; one that does not (patient-bandits) pays ``choose_together`` on
every batch of decisions: for a decision taken alone, after the previous one was answered (engine/choosing.py),
for two or more (under load) in the request. Statistics of one run, past the opening (no arm forced), as the
service passes them.
"""

from __future__ import annotations

import argparse
import functools
import timeit

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.service_bench import CAMPAIGNS
from latebandit.campaign import Campaign
from latebandit.policies.base import ArmStats


def statistics(arms: int) -> ArmStats:
    pulls = 1_000.0 + np.arange(arms)
    return ArmStats(pulls=pulls[None], conversions=(50.0 + np.arange(arms))[None], effective=(pulls - 100.0)[None],
                    t=np.array([int(pulls.sum()) + 1]), tail_weight=np.full((1, arms), 30.0),
                    pending=np.full((1, arms), 10.0))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3_000)
    args = parser.parse_args()
    table = Table(title=f"µs of CPU a call, best of 3 x {args.calls:,} calls")
    for column in ("policy", "arms", "stands", "choose_together, 1 decision", "2 decisions", "standing"):
        table.add_column(column)
    rng = np.random.default_rng(1)
    for name, spec in CAMPAIGNS.items():
        campaign = Campaign(**spec, created_at=0)
        if campaign.plays_schedule or campaign.contextual:
            continue  # a planning policy claims slots of a schedule, a contextual one scores offers: not ArmStats
        policy, stats = campaign.policy_impl, statistics(len(campaign.arms))
        calls = (*(functools.partial(policy.choose_together, stats, decisions, rng) for decisions in (1, 2)),
                 functools.partial(policy.standing, stats))  # fmt: skip
        timings = [min(timeit.repeat(call, number=args.calls, repeat=3)) * 1e6 / args.calls for call in calls]
        table.add_row(name, str(len(campaign.arms)), str(policy.stands), *(f"{t:.1f}" for t in timings))
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
