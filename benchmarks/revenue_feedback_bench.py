"""Benchmark: /feedback on a revenue campaign (``reward.per_decision`` "sum") against the same campaign with
Bernoulli rewards ("first"), in one run: the /feedback part of benchmarks/service_bench.py alone.

    .venv/bin/python -m benchmarks.revenue_feedback_bench [--duration 5] [--rounds 3] [--batch 1000]

One uvicorn worker on real Redis, its audit log drained into a fresh PostgreSQL database by the external
writer, paused (SIGSTOP) while /feedback is measured, as service_bench does. Both campaigns get the same
bodies: batches of ``--batch`` conversions, two purchases of 40.0 per decision (distinct event ids), so that
half the conversions are repeats, which "first" records and "sum" credits (a read and a write of the
decision's credited reward more). The two alternate, ``--rounds`` rounds of ``--duration`` seconds each;
the medians and their ratio are reported, since the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json

import httpx
import numpy as np
from rich.console import Console

from benchmarks.service_bench import (
    CAMPAIGNS,
    LATEBANDIT,
    RESULTS,
    cpu_of,
    cpu_seconds,
    deployment,
    feedback_bodies,
    feedback_rate,
    free_port,
    paused,
    serve,
    start,
    stop,
    teardown,
)
from latebandit.campaign import Campaign
from tests.faults import children

BASE = CAMPAIGNS["delayed-klucb"]
REWARDS = {
    "first": {**BASE, "id": "bench-first", "reward": {"max": 250.0, "per_decision": "first"}},
    "sum": {**BASE, "id": "bench-sum", "reward": {"max": 250.0, "per_decision": "sum"}},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=5, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    workdir = RESULTS / "run"
    workdir.mkdir(parents=True, exist_ok=True)
    env, prefix, database = deployment("external")
    servers = []
    console = Console(width=160)
    try:
        latebandit, port = serve(env, 1, workdir)
        servers.append(latebandit)
        writer_port = free_port()
        writer = start([*LATEBANDIT, "audit-writer", "--metrics-port", str(writer_port)], env, writer_port,
                       workdir / "audit-writer.log")  # fmt: skip
        servers.append(writer)
        needed = int((args.duration + 1) * 100_000 / args.batch) + 8  # more than a worker takes in the time
        bodies = {}
        for name, spec in REWARDS.items():
            assert httpx.post(f"{latebandit.url}/campaigns", json=spec).status_code == 201
            console.print(f"signing the /feedback batches of {name!r} ...")
            bodies[name], _ = feedback_bodies(Campaign(**spec), args.batch, needed * (args.rounds + 1), 2, 40.0)
        worker = [latebandit.process.pid, *children(latebandit.process.pid)]
        rounds: dict[str, list[tuple[float, float, float]]] = {name: [] for name in REWARDS}
        for turn in range(args.rounds + 1):  # a warm-up round of 1 s first
            for name in REWARDS:
                batches = bodies[name][turn * needed : (turn + 1) * needed]
                with paused(writer):
                    worker_cpu, redis_cpu = cpu_of(worker), cpu_seconds().get("redis-server", 0.0)
                    events, seconds, figures = feedback_rate(port, batches, args.duration if turn else 1)
                    worker_us = (cpu_of(worker) - worker_cpu) * 1e6 / events
                    redis_us = (cpu_seconds().get("redis-server", 0.0) - redis_cpu) * 1e6 / events
                assert figures.errors == 0, f"{figures.errors} failed /feedback requests"
                if turn:
                    rounds[name].append((events / seconds, worker_us, redis_us))
        medians = {name: np.median(np.array(values), axis=0).tolist() for name, values in rounds.items()}
        for name, (rate, worker_us, redis_us) in medians.items():
            console.print(
                f"/feedback, {name!r}: {rate:,.0f} conversions/s per worker; CPU a conversion: the "
                f"worker's {worker_us:.1f} µs, Redis's {redis_us:.1f} µs (medians of {args.rounds})"
            )
        ratios = [medians["sum"][i] / medians["first"][i] for i in range(3)]
        ratio_text = f"throughput {ratios[0]:.2f}, worker CPU {ratios[1]:.2f}, Redis CPU {ratios[2]:.2f}"
        console.print(f"sum / first: {ratio_text}")
        RESULTS.mkdir(exist_ok=True)
        figures_out = {"rounds": rounds, "medians": medians, "sum_over_first": ratios}
        (RESULTS / "revenue_feedback.json").write_text(json.dumps(figures_out, indent=2))
    finally:
        for server in servers:
            stop(server)
        teardown(prefix, database)


if __name__ == "__main__":
    main()
