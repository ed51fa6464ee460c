"""Benchmark: the cost of one aggregate against the number of open segments of a planning campaign.

    .venv/bin/python -m benchmarks.aggregate_bench [--sizes 10,100,1000,10000] [--repeat 200]

A planning campaign on real Redis is given a plan of one-slot segments and as many claims, with an allowed
lateness long enough that none of their feedback closes, so that N segments are open; then aggregates of
one second, each over the latest two segments, are applied one script call each. Reported: microseconds per
aggregate (median of ``--repeat``), and its ratio to the smallest N measured in the same run: flat means the
cost does not grow with N (apply_anonymous.lua reads the segment index, it does not scan it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.service_bench import REDIS_URL, forget_keys
from latebandit.campaign import Campaign
from latebandit.policies.schedule import Next, Plan, Segment
from latebandit.store.base import AnonymousEvent, Pull
from latebandit.store.redis import RedisStore

RESULTS = Path(__file__).parent / "results"
T0 = 1_800_000_000_000_000
SECOND = 1_000_000


async def cost(open_segments: int, repeat: int) -> float:
    """Median seconds of one aggregate with ``open_segments`` segments open."""
    prefix = f"aggbench{uuid.uuid4().hex[:8]}"
    clock = [T0]
    store = RedisStore(REDIS_URL, prefix, clock=lambda: clock[0])
    campaign = Campaign(id="agg", arms=["a", "b"], created_at=T0, allowed_lateness=10**7,
                        policy={"name": "odaaf", "params": {"mean_delay": 1, "horizon": 10**9}})  # fmt: skip
    try:
        await store.create_campaign(campaign, {"type": "campaign"})
        segments = tuple(Segment(k % 2, 1, True) for k in range(open_segments))
        plan = Plan(segments, Segment(0, 1, False), Next.CLOSED, {})
        await store.commit_plan(campaign, 0, plan, 0, {"type": "campaign"}, T0)
        for k in range(open_segments):
            clock[0] = T0 + k * SECOND
            pull = Pull(k % 2, 0, 0, (), f"d{k}", 1.0, {"type": "decision", "at": clock[0]})
            await store.claim_slot(campaign, pull, None, 60)
        end = T0 + (open_segments - 1) * SECOND
        timings = []
        for i in range(repeat):
            event = AnonymousEvent("aggregate", end - SECOND, end, 1.0, f"e{i}", None, 3600, {"type": "aggregate"})
            started = time.perf_counter()
            await store.apply_anonymous(campaign, [event], end)
            timings.append(time.perf_counter() - started)
        return statistics.median(timings)
    finally:
        await store.close()
        forget_keys(prefix)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10,100,1000,10000")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    figures = {size: asyncio.run(cost(size, args.repeat)) for size in sizes}
    table = Table(title="one aggregate (one script call) against open segments")
    for column in ("open segments", "µs per aggregate", "ratio to the smallest"):
        table.add_column(column, no_wrap=True)
    for size, seconds in figures.items():
        table.add_row(f"{size:,}", f"{seconds * 1e6:.0f}", f"{seconds / figures[sizes[0]]:.2f}")
    Console(width=120).print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "aggregates.json").write_text(json.dumps({str(k): v for k, v in figures.items()}, indent=2))


if __name__ == "__main__":
    main()
