"""Benchmark: a contextual campaign with 10^6 decisions inside its window, in real Redis (issue 32).

    .venv/bin/python -m benchmarks.contextual_scale [--decisions 1000000] [--batch 64] [--features 20 50]

For each d, an actions campaign (otf-linucb, a window of one day in 64 buckets) under a fresh key prefix of
BENCH_REDIS_URL. Its decisions are recorded by RedisStore.record_decisions in batches of ``--batch`` (the
engine's group commit records up to GROUP_LIMIT = 64 at a time), each batch at one moment, the moments spread
evenly over the window ending now, so that at the end every decision is still inside it (pending). One batch
is recorded in each bucket of the window first, so that the histogram holds all its cells from the start, as
after a day of traffic. Each pull is the engine's (DecisionEngine._pull: its signed id, bucket and audit record
with the chosen features), of one random action of norm below 1. The audit stream is emptied every 100
batches, as the audit writer deletes what it has written.

Reported, for each d:
- the time a decision costs to record (its batch's call, wall clock, per decision), median over the batches
  of 10,000 decisions recorded at the end of the window, before the run and after it: the same cells, so the
  two differ only by the decisions pending; and, for the run, the median of each tenth, which grows as the
  run's moment moves along the cells hash (a listpack below hash-max-listpack-entries, scanned from its
  first cell: a cost bounded by the window's cells, the steady state being the last tenth's);
- the time of a snapshot read (RedisStore.snapshot with max_age 0), median of 20, before and after the run;
- Redis memory: INFO used_memory before and after (server-wide: give BENCH_REDIS_URL a server of its own,
  or another client's keys move it), and MEMORY USAGE (every field sampled) of the features hashes over the
  decisions they hold, of the model hash and its ``decided`` string (the decisions not folded yet, at most
  about store/redis.py's FOLD_AFTER), and of the campaign's other keys.
The campaign's keys are deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from benchmarks.service_bench import REDIS_URL, SECRET, feature_vectors
from latebandit.campaign import CampaignSpec
from latebandit.engine.contextual import ContextualChoice, Offer
from latebandit.engine.core import GROUP_LIMIT, DecisionEngine, EngineOptions
from latebandit.store.redis import RedisStore
from latebandit.timeutil import MICROS, wall_clock
from latebandit.tokens import TokenSigner

RESULTS = Path(__file__).parent / "results"
WINDOW = 86_400
SAMPLE = 10_000  # decisions at the start and at the end whose recording time is compared
TRIM_EVERY = 100  # batches between two deletions of the audit stream (what the audit writer has written)


class Clock:
    """The store's and the engine's clock, moved along the window by the benchmark."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


async def timed_snapshots(store: RedisStore, engine: DecisionEngine, campaign_id: str) -> float:
    """Median ms of 20 snapshot reads (max_age 0: each one reads Redis)."""
    campaign = await engine.campaigns.campaign(campaign_id)
    times = []
    for _ in range(20):
        started = time.perf_counter()
        await store.snapshot(campaign, 0.0)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


async def memory_usage(store: RedisStore, pattern: str) -> tuple[int, int]:
    """The keys matching ``pattern`` and their MEMORY USAGE (every field sampled), in bytes."""
    keys = [key async for key in store.client.scan_iter(match=pattern, count=1_000)]
    sizes = [await store.client.memory_usage(key, samples=0) or 0 for key in keys]
    return len(keys), sum(sizes)


async def scale(d: int, decisions: int, batch: int) -> dict[str, Any]:
    prefix = f"scale{uuid.uuid4().hex[:8]}"
    end = wall_clock()
    clock = Clock(end - WINDOW * MICROS + MICROS)
    store = RedisStore(REDIS_URL, prefix, clock=clock)
    engine = DecisionEngine(store, TokenSigner(SECRET), clock, np.random.default_rng(0), EngineOptions())
    spec = {"id": "scale", "policy": {"name": "otf-linucb"}, "features": d, "window": WINDOW, "buckets": 64,
            "delay": {"family": "exponential", "mean": 3600}}  # fmt: skip
    try:
        campaign = await engine.create_campaign(CampaignSpec(**spec))
        await store.snapshot(campaign, 0.0)  # the worker's held state, as at /choose
        audit_key, rng, start = store.keys.audit(campaign.id), np.random.default_rng(1), clock.now

        async def record(size: int) -> float:
            """A batch of ``size`` decisions at the clock's moment; µs a decision its record took."""
            pulls = []
            for vector in feature_vectors(rng, size, d):
                offer, choice = Offer(vector[None], ("a0",)), ContextualChoice(0, "a0", 1.0, vector, 0.05)
                pulls.append(engine._pull(campaign, 0, 1.0, clock.now, None, contextual=(offer, choice)))
            started = time.perf_counter()
            await store.record_decisions(campaign, pulls, [None] * size, 86_400)
            return (time.perf_counter() - started) * 1e6 / size

        async def at_the_end() -> float:
            """Median µs a decision of SAMPLE decisions recorded in batches at the window's last moment."""
            clock.now, times = end - MICROS, []
            for _ in range(max(1, SAMPLE // batch)):
                times.append(await record(batch))
            await store.client.delete(audit_key)
            return statistics.median(times)

        for bucket in range(campaign.buckets + 1):  # every cell of the window present from the start
            clock.now = min(start + bucket * campaign.bucket_width_us, end - MICROS)
            await record(batch)
        before = await at_the_end()
        clock.now = start
        snapshot_start = await timed_snapshots(store, engine, campaign.id)
        used_before = (await store.client.info("memory"))["used_memory"]
        batches = -(-decisions // batch)
        step = (WINDOW - 2) * MICROS // batches  # the last batch one second before the end of the window
        per_decision: list[float] = []  # µs, per batch
        for number in range(batches):
            per_decision.append(await record(min(batch, decisions - number * batch)))
            clock.now += step
            if number % TRIM_EVERY == TRIM_EVERY - 1:
                await store.client.delete(audit_key)
        await store.client.delete(audit_key)
        used_after = (await store.client.info("memory"))["used_memory"]  # the run's decisions alone
        after = await at_the_end()
        snapshot_full = await timed_snapshots(store, engine, campaign.id)
        state = await store.snapshot(campaign, 0.0)
        pending = int(
            state.histogram.count[
                (state.histogram.bucket + 1) * campaign.bucket_width_us > end - campaign.window_us
            ].sum()
        )
        hashes, features_bytes = await memory_usage(store, store.keys.all_features(campaign.id))
        model_bytes = await store.client.memory_usage(store.keys.model(campaign.id), samples=0) or 0
        decided_bytes = await store.client.memory_usage(store.keys.decided(campaign.id), samples=0) or 0
        fixed = [key for key in store.keys.state(campaign.id) if await store.client.exists(key)]
        fixed_bytes = sum([await store.client.memory_usage(key, samples=0) or 0 for key in fixed])
        tenth = max(1, len(per_decision) // 10)
        return {
            "d": d, "decisions": decisions, "batch": batch, "pending_at_end": pending,
            "record_us_per_decision_before": before, "record_us_per_decision_after": after,
            "record_us_per_decision_by_tenth": [statistics.median(per_decision[k * tenth : (k + 1) * tenth])
                                                for k in range(len(per_decision) // tenth)],
            "snapshot_ms_start": snapshot_start, "snapshot_ms_full": snapshot_full,
            "used_memory_delta_bytes": used_after - used_before,
            "used_memory_per_decision": (used_after - used_before) / decisions,
            "features_hashes": hashes, "features_bytes_per_decision": features_bytes / pending,
            "model_bytes": model_bytes, "decided_bytes": decided_bytes,
            "campaign_keys": len(fixed), "campaign_keys_bytes": fixed_bytes,
        }  # fmt: skip
    finally:
        for key in [key async for key in store.client.scan_iter(match=f"{prefix}:*", count=10_000)]:
            await store.client.delete(key)
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=GROUP_LIMIT)
    parser.add_argument("--features", type=int, nargs="+", default=[20, 50])
    args = parser.parse_args()
    console = Console(width=160)
    results = []
    for d in args.features:
        row = asyncio.run(scale(d, args.decisions, args.batch))
        results.append(row)
        first, last = row["record_us_per_decision_before"], row["record_us_per_decision_after"]
        tenths = ", ".join(f"{value:.0f}" for value in row["record_us_per_decision_by_tenth"])
        used = row["used_memory_delta_bytes"]
        console.print(
            f"d = {d}: {row['pending_at_end']:,} decisions pending. Recording at the window's end: {first:.1f} µs "
            f"a decision before the run, {last:.1f} µs after it (the run by tenths: {tenths}); snapshot "
            f"read {row['snapshot_ms_start']:.2f} ms before, {row['snapshot_ms_full']:.2f} ms at the end. Memory: "
            f"used_memory +{used / 2**20:,.1f} MiB = {used / args.decisions:.0f} bytes a decision; the "
            f"{row['features_hashes']} features hashes {row['features_bytes_per_decision']:.0f} bytes a decision; "
            f"the model hash {row['model_bytes']:,} bytes and its decided string {row['decided_bytes']:,}, the "
            f"campaign's {row['campaign_keys']} keys but the "
            f"features (model and decided string included) {row['campaign_keys_bytes']:,} bytes"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "contextual_scale.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
