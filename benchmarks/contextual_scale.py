"""Benchmark: a contextual campaign with 10^6 decisions inside its window, in real Redis (issue 32).

    .venv/bin/python -m benchmarks.contextual_scale [--decisions 1000000] [--batch 64] [--features 20 50]

For each d, an actions campaign (otf-linucb, a window of one day in 64 buckets) under a fresh key prefix of
BENCH_REDIS_URL. Its decisions are recorded by RedisStore.record_decisions in batches of ``--batch`` (the
engine's group commit records up to GROUP_LIMIT = 64 at a time), each batch at one moment, the moments spread
evenly over the window ending now, so that at the end every decision is still inside it (pending). Each pull
is the engine's (DecisionEngine._pull: its signed id, bucket and audit record with the chosen features), of
one random action of norm below 1. The audit stream is emptied every 100 batches, as the audit writer
deletes what it has written.

Reported, for each d:
- the time a decision costs to record (its batch's call, wall clock, per decision): the median over the
  batches of the first and of the last 10,000 decisions; and the time of a snapshot read (RedisStore.snapshot
  with max_age 0), median of 20, on the new campaign and at the end: none grows with the pending decisions;
- Redis memory: INFO used_memory before and after (server-wide, so another client of the same server moves
  it), and MEMORY USAGE (every field sampled) of the features hashes over the decisions they hold, of the
  model hash, and of the campaign's other keys.
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
        snapshot_empty = await timed_snapshots(store, engine, campaign.id)
        audit_key = store.keys.audit(campaign.id)
        await store.client.delete(audit_key)
        used_before = (await store.client.info("memory"))["used_memory"]
        rng = np.random.default_rng(1)
        batches = -(-decisions // batch)
        step = (WINDOW - 2) * MICROS // batches  # the last batch one second before the end of the window
        per_decision: list[float] = []  # µs, per batch
        for number in range(batches):
            size = min(batch, decisions - number * batch)
            vectors = feature_vectors(rng, size, d)
            pulls = []
            for vector in vectors:
                offer = Offer(vector[None], ("a0",))
                choice = ContextualChoice(0, "a0", 1.0, vector, 0.05)
                pulls.append(engine._pull(campaign, 0, 1.0, clock.now, None, contextual=(offer, choice)))
            started = time.perf_counter()
            await store.record_decisions(campaign, pulls, [None] * size, 86_400)
            per_decision.append((time.perf_counter() - started) * 1e6 / size)
            clock.now += step
            if number % TRIM_EVERY == TRIM_EVERY - 1:
                await store.client.delete(audit_key)
        await store.client.delete(audit_key)
        clock.now = end
        used_after = (await store.client.info("memory"))["used_memory"]
        snapshot_full = await timed_snapshots(store, engine, campaign.id)
        state = await store.snapshot(campaign, 0.0)
        pending = int(
            state.histogram.count[
                (state.histogram.bucket + 1) * campaign.bucket_width_us > end - campaign.window_us
            ].sum()
        )
        hashes, features_bytes = await memory_usage(store, store.keys.all_features(campaign.id))
        model_bytes = await store.client.memory_usage(store.keys.model(campaign.id), samples=0) or 0
        fixed = [key for key in store.keys.state(campaign.id) if await store.client.exists(key)]
        fixed_bytes = sum([await store.client.memory_usage(key, samples=0) or 0 for key in fixed])
        sample = max(1, SAMPLE // batch)
        return {
            "d": d, "decisions": decisions, "batch": batch, "pending_at_end": pending,
            "record_us_per_decision_first": statistics.median(per_decision[:sample]),
            "record_us_per_decision_last": statistics.median(per_decision[-sample:]),
            "snapshot_ms_empty": snapshot_empty, "snapshot_ms_full": snapshot_full,
            "used_memory_delta_bytes": used_after - used_before,
            "used_memory_per_decision": (used_after - used_before) / decisions,
            "features_hashes": hashes, "features_bytes_per_decision": features_bytes / decisions,
            "model_bytes": model_bytes, "campaign_keys": len(fixed), "campaign_keys_bytes": fixed_bytes,
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
        first, last = row["record_us_per_decision_first"], row["record_us_per_decision_last"]
        console.print(
            f"d = {d}: {row['pending_at_end']:,} decisions pending. Recording: {first:.1f} µs a decision over the "
            f"first {SAMPLE:,}, {last:.1f} µs over the last {SAMPLE:,}; snapshot read {row['snapshot_ms_empty']:.2f} "
            f"ms new, {row['snapshot_ms_full']:.2f} ms at the end. Memory: used_memory "
            f"+{row['used_memory_delta_bytes'] / 2**20:,.1f} MiB = {row['used_memory_per_decision']:.0f} bytes a "
            f"decision; the {row['features_hashes']} features hashes {row['features_bytes_per_decision']:.0f} bytes "
            f"a decision; the model hash {row['model_bytes']:,} bytes, the campaign's {row['campaign_keys']} keys "
            f"but the features (model included) {row['campaign_keys_bytes']:,} bytes"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "contextual_scale.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
