"""The per-arm delay histogram is part of the state the audit log rebuilds: live Redis state, then the audit
drained into SQL, then `rebuild` into an empty Redis prefix and the embedded store's restore, all equal."""

from __future__ import annotations

import numpy as np
import pytest

from latebandit.audit.log import AuditLog
from latebandit.audit.writer import AuditWriter
from latebandit.campaign import CampaignSpec
from latebandit.config import Settings
from latebandit.delays.tail import BUCKETS, bucket_of
from latebandit.engine.core import DecisionEngine, EngineOptions
from latebandit.replay.apply import Replayer, records_as_lines
from latebandit.replay.rebuild import rebuild_redis, restore_memory
from latebandit.store.memory import MemoryStore
from latebandit.store.redis import RedisStore
from latebandit.timeutil import format_time
from latebandit.tokens import TokenSigner

pytestmark = [pytest.mark.redis]

T0 = 1_800_000_000_000_000


async def test_rebuilds_restore_the_delay_histogram(tmp_path, redis_url: str, redis_prefix: str) -> None:
    clock = [T0]
    live = RedisStore(redis_url, redis_prefix, clock=lambda: clock[0])
    signer = TokenSigner("secret")
    engine = DecisionEngine(live, signer, lambda: clock[0], np.random.default_rng(0), EngineOptions())
    spec = CampaignSpec(id="c", arms=["a", "b"], policy={"name": "adapt-patient-bandits"}, window=3600.0)
    await engine.create_campaign(spec)
    rng = np.random.default_rng(1)
    expected = np.zeros((2, BUCKETS), dtype=np.int64)
    decisions = []
    for _ in range(60):
        decisions.append(await engine.choose("c"))
        clock[0] += 10_000_000
    clock[0] += 7200 * 1_000_000  # past the window: some conversions below are censored, still counted here
    for decision in decisions[::2]:
        token = signer.verify(decision.decision_id)
        delay = float(rng.pareto(0.5) * 30)
        occurred = token.decided_at + min(round(delay * 1e6), clock[0] - token.decided_at)
        event = {"type": "conversion", "decision_id": decision.decision_id, "occurred_at": format_time(occurred)}
        assert (await engine.feedback([event, event])).duplicates == 1
        expected[token.arm, bucket_of((occurred - token.decided_at) / 1e6)] += 1
    state = await live.snapshot(await engine.campaign("c"))
    np.testing.assert_array_equal(state.delay_counts(), expected)

    audit = AuditLog(f"sqlite:///{tmp_path / 'audit.db'}")
    audit.create_schema()
    await AuditWriter(live, audit, 1000).flush()
    settings = Settings()
    rebuilt = RedisStore(redis_url, redis_prefix + "r", clock=lambda: clock[0])
    try:
        assert (await rebuild_redis(audit, rebuilt, settings)).campaigns == ["c"]
        campaign = await rebuilt.get_campaign("c")
        assert campaign is not None
        np.testing.assert_array_equal((await rebuilt.snapshot(campaign)).delay_counts(), expected)
        memory = MemoryStore(clock=lambda: clock[0])
        await restore_memory(audit, memory, settings)
        np.testing.assert_array_equal((await memory.snapshot(campaign)).delay_counts(), expected)
    finally:
        async for key in rebuilt.client.scan_iter(match=f"{redis_prefix}r:*"):
            await rebuilt.client.delete(key)
        await rebuilt.close()
        await live.close()
        audit.dispose()


async def test_a_conversion_after_window_and_retention_changes_nothing_and_replay_forgets_its_decision(
    tmp_path, redis_url: str, redis_prefix: str
) -> None:
    """Past its window plus the dedup retention, the service no longer knows whether a decision converted:
    a conversion then is recorded and changes nothing, not even the observed delays (a retry would count
    twice). So a replay may forget such a decision, which keeps its memory to one window of traffic."""
    clock = [T0]
    live = RedisStore(redis_url, redis_prefix, clock=lambda: clock[0])
    signer = TokenSigner("secret")
    settings = Settings(dedup_retention=600.0, max_skew=300.0)
    options = EngineOptions(dedup_retention=settings.dedup_retention)
    engine = DecisionEngine(live, signer, lambda: clock[0], np.random.default_rng(0), options)
    spec = CampaignSpec(id="c", arms=["a", "b"], policy={"name": "adapt-patient-bandits"}, window=3600.0)
    campaign = await engine.create_campaign(spec)
    old = await engine.choose("c")
    clock[0] += (3600 + 600 + 300 + 1) * 1_000_000  # window, retention and the replay's skew margin: all past
    recent = [await engine.choose("c") for _ in range(3)]
    before = await live.snapshot(campaign)
    late = {"type": "conversion", "event_id": "late", "decision_id": old.decision_id,
            "occurred_at": format_time(T0 + 10_000_000)}  # fmt: skip
    assert (await engine.feedback([late])).body()["censored"] == 1
    after = await live.snapshot(campaign)
    np.testing.assert_array_equal(after.delay_counts(), before.delay_counts())
    np.testing.assert_array_equal(after.counters.conversions, before.counters.conversions)

    audit = AuditLog(f"sqlite:///{tmp_path / 'audit.db'}")
    audit.create_schema()
    try:
        await AuditWriter(live, audit, 1000).flush()
        replayer = Replayer(None, settings)
        await replayer.apply_all(records_as_lines(audit.records(None, None, None)))
        assert replayer.skipped["conversion_after_retention"] == 1
        assert set(replayer.decisions) == {decision.decision_id for decision in recent}  # the old one forgotten
        assert await replayer.state("c", clock[0]) == await engine.state("c")
    finally:
        await live.close()
        audit.dispose()
