"""The replay applies feedback through the service's own ingest (engine/ingest.py): a replay of what the
live engine queued for its audit log ends in the state the engine holds, including a planning campaign's
conversions whose decisions the streaming replay has forgotten, and what the ingest rejects or the store
refuses the replay counts as skipped, by kind and reason."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from latebandit.audit.export import record_to_line
from latebandit.campaign import CampaignSpec
from latebandit.config import Settings
from latebandit.engine.core import DecisionEngine, EngineOptions
from latebandit.replay.apply import Replayer
from latebandit.store.memory import MemoryStore
from latebandit.timeutil import MICROS, format_time
from latebandit.tokens import TokenSigner

T0 = 1_800_000_000_000_000
# Short window, retention and skew: the replay forgets a decision three seconds after it.
SETTINGS = Settings(dedup_retention=1.0, max_skew=1.0)
OPTIONS = EngineOptions(max_skew=SETTINGS.max_skew, dedup_retention=SETTINGS.dedup_retention)
ATTRIBUTED = CampaignSpec(id="attributed", arms=["a", "b"], policy={"name": "adapt-patient-bandits"}, window=1.0)
ODAAF = {"name": "odaaf", "params": {"mean_delay": 0, "horizon": 1000}}
PLANNING = CampaignSpec(id="planning", arms=["a", "b", "c"], policy=ODAAF, window=1.0, allowed_lateness=3600.0)
REVENUE = CampaignSpec(id="revenue", arms=["a", "b"], policy={"name": "klucb"}, window=1.0,
                       reward={"max": 250.0, "per_decision": "sum"})  # fmt: skip


def at(seconds: float) -> str:
    return format_time(T0 + round(seconds * MICROS))


@pytest.mark.parametrize("spec", [ATTRIBUTED, PLANNING, REVENUE], ids=lambda spec: spec.id)
async def test_a_replay_of_the_audit_queue_ends_in_the_live_state(spec: CampaignSpec) -> None:
    now = [T0]
    store = MemoryStore(clock=lambda: now[0])
    engine = DecisionEngine(store, TokenSigner("replay"), lambda: now[0], np.random.default_rng(3), OPTIONS)
    campaign = await engine.create_campaign(spec)
    decisions = []
    for second in range(1, 41):
        now[0] = T0 + second * MICROS
        if second % 3 == 0:  # the previous decision converted, within the window
            event = {"type": "conversion", "decision_id": decisions[-1], "occurred_at": at(second - 0.5),
                     "event_id": f"e{second}", "value": 0.6 * spec.reward.max}  # fmt: skip
            again = {**event, "event_id": f"f{second}", "occurred_at": at(second - 0.25)}  # a repeat: capped on sum
            await engine.feedback([event, event, again])  # a duplicate too
        decisions.append((await engine.choose(spec.id)).decision_id)
    late = [{"type": "conversion", "decision_id": decisions[second - 1], "occurred_at": at(second + 0.25)}
            for second in range(1, 20, 4)]  # fmt: skip
    now[0] = T0 + 41 * MICROS
    await engine.feedback(late)
    if campaign.plays_schedule:
        aggregate = {"type": "aggregate", "campaign": spec.id, "start": at(30), "end": at(40), "value": 2.0}
        await engine.feedback([aggregate, {"type": "watermark", "campaign": spec.id, "at": at(41)}])

    entries = await store.read_audit(spec.id, 100_000)
    replayer = Replayer(None, SETTINGS)
    await replayer.apply_all(record_to_line(record) for entry in entries for record in entry.records)

    live = await engine.state(spec.id, now[0])
    assert await replayer.state(spec.id, now[0]) == live
    if spec.reward.sums:  # 13 decisions converted twice, 0.6 max each time: each reward capped at max
        assert [sum(row[name] for row in live["arms"].values()) for name in ("conversions", "reward")] == [13, 3250]
    late_ids = {event["decision_id"] for event in late}
    assert late_ids.isdisjoint(replayer.decisions)  # forgotten by the time their conversions came
    if campaign.plays_schedule:  # read as aggregates over their instants, they need no decision
        assert replayer.skipped == Counter()
    else:  # the service recorded them and changed nothing, as the replay does without their decisions
        assert replayer.skipped == Counter({"conversion_after_retention": len(late)})


async def test_what_the_ingest_rejects_or_the_store_refuses_is_skipped_by_kind_and_reason() -> None:
    created = {"type": "campaign", "created_at": at(0)}
    lines = [
        {**created, **ATTRIBUTED.model_dump(mode="json")},
        {**created, **PLANNING.model_dump(mode="json")},
        {"type": "aggregate", "campaign": "attributed", "start": at(1), "end": at(1), "value": 1.0},
        {"type": "watermark", "campaign": "nobody", "at": at(1)},
        {"type": "conversion", "campaign": "attributed", "decision_id": "unseen", "occurred_at": at(1)},
        {"type": "aggregate", "campaign": "planning", "start": at(1), "end": at(2)},  # no value
        {"type": "campaign", "id": "planning", "status": "paused", "at": at(3)},
        {"type": "aggregate", "campaign": "planning", "start": at(3), "end": at(4), "value": 1.0},
        {"type": "watermark", "campaign": "planning", "at": at(4)},
        {"type": "signal", "campaign": "planning"},
    ]
    replayer = Replayer(None, SETTINGS)
    await replayer.apply_all(lines)
    assert replayer.skipped == Counter({
        "aggregate_wrong_feedback_kind": 1, "watermark_without_campaign": 1, "conversion_without_decision": 1,
        "aggregate_malformed_event": 1, "aggregate_refused": 1, "watermark_refused": 1, "signal_event": 1,
    })  # fmt: skip
