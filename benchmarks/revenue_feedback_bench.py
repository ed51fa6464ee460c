"""Benchmark: /feedback on a revenue campaign (``reward.per_decision`` "sum") against the same campaign with
Bernoulli rewards ("first"), and a contextual campaign's conversions, in one run: the /feedback part of
benchmarks/service_bench.py alone.

    .venv/bin/python -m benchmarks.revenue_feedback_bench [--duration 5] [--rounds 3] [--batch 1000]

One uvicorn worker on real Redis, its audit log drained into a fresh PostgreSQL database by the external
writer, paused (SIGSTOP) while /feedback is measured, as service_bench does. Both campaigns get the same
bodies: batches of ``--batch`` conversions, two purchases of 40.0 per decision (distinct event ids), so that
half the conversions are repeats, which "first" records and "sum" credits (a read and a write of the
decision's credited reward more). The contextual campaign (linucb on 10 arms' contexts of 8 features) gets
one conversion of 1.0 per decision, whose features are written into its Redis hashes beforehand, as its
/choose would have kept them (each conversion then adds its features to b). The three alternate, ``--rounds``
rounds of ``--duration`` seconds each; the medians and their ratios to "first" are reported, since the
machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json

import httpx
import numpy as np
import orjson
import redis
from rich.console import Console

from benchmarks.service_bench import (
    CAMPAIGNS,
    LATEBANDIT,
    REDIS_URL,
    RESULTS,
    SECRET,
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
from latebandit.store.base import features_field
from latebandit.store.keys import Keys
from latebandit.tokens import TokenSigner
from tests.faults import children

BASE = CAMPAIGNS["delayed-klucb"]
REWARDS = {
    "first": {**BASE, "id": "bench-first", "reward": {"max": 250.0, "per_decision": "first"}},
    "sum": {**BASE, "id": "bench-sum", "reward": {"max": 250.0, "per_decision": "sum"}},
}
CONTEXTUAL = {"id": "bench-context", "arms": BASE["arms"], "policy": {"name": "linucb", "params": {}}, "features": 8,
              "window": 86_400, "buckets": 64}  # fmt: skip
CASES = {**REWARDS, "contextual": CONTEXTUAL}


def contextual_bodies(campaign: Campaign, prefix: str, batch: int, batches: int) -> list[bytes]:
    """Batches of one conversion of 1.0 per decision of ``campaign``, each decision's features (norm below 1)
    written where its /choose keeps them (store/keys.py ``features``), so that every conversion counts."""
    bodies, _ = feedback_bodies(campaign, batch, batches, 1, 1.0)
    signer, keys, rng = TokenSigner(SECRET), Keys(prefix), np.random.default_rng(0)
    client = redis.Redis.from_url(REDIS_URL)
    for body in bodies:
        pipe = client.pipeline(transaction=False)
        for event in orjson.loads(body.partition(b"\r\n\r\n")[2])["events"]:
            bucket = signer.verify(event["decision_id"]).decided_at // campaign.bucket_width_us
            features = rng.random(campaign.features or 0)
            features *= 0.5 / np.linalg.norm(features)
            key = keys.features(campaign.id, bucket)
            pipe.hset(key, features_field(event["decision_id"]), features.astype("<f8").tobytes())
            pipe.expireat(key, campaign.features_expire_at(bucket))
        pipe.execute()
    return bodies


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
        for name, spec in CASES.items():
            assert httpx.post(f"{latebandit.url}/campaigns", json=spec).status_code == 201
            console.print(f"signing the /feedback batches of {name!r} ...")
            campaign, count = Campaign(**spec), needed * (args.rounds + 1) + 1
            if campaign.contextual:
                bodies[name] = contextual_bodies(campaign, prefix, args.batch, count)
            else:
                bodies[name], _ = feedback_bodies(campaign, args.batch, count, 2, 40.0)
            answer = httpx.post(f"{latebandit.url}/feedback", content=bodies[name].pop().partition(b"\r\n\r\n")[2],
                                headers={"content-type": "application/json"}).json()  # fmt: skip
            assert answer["accepted"] == args.batch and answer["stale"] == 0, answer  # every conversion is taken
        worker = [latebandit.process.pid, *children(latebandit.process.pid)]
        rounds: dict[str, list[tuple[float, float, float]]] = {name: [] for name in CASES}
        for turn in range(args.rounds + 1):  # a warm-up round of 1 s first
            for name in CASES:
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
        ratios = {name: [medians[name][i] / medians["first"][i] for i in range(3)] for name in ("sum", "contextual")}
        for name, (rate, worker_us, redis_us) in ratios.items():
            text = f"throughput {rate:.2f}, worker CPU {worker_us:.2f}, Redis CPU {redis_us:.2f}"
            console.print(f"{name} / first: {text}")
        RESULTS.mkdir(exist_ok=True)
        figures_out = {"rounds": rounds, "medians": medians, "over_first": ratios}
        (RESULTS / "revenue_feedback.json").write_text(json.dumps(figures_out, indent=2))
    finally:
        for server in servers:
            stop(server)
        teardown(prefix, database)


if __name__ == "__main__":
    main()
