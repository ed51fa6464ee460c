"""Made-up campaign ids cost a bounded number of lookups (issue 19): each unknown id is looked up once per
UNKNOWN_FOR window, one /feedback batch looks up at most LOOKUPS_PER_BATCH campaigns it has not seen, and
an unreachable audit log is tried once per HISTORY_RETRY, not once per id."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from latebandit.audit.log import AuditLog
from latebandit.campaign import Campaign, CampaignSpec
from latebandit.engine.core import DecisionEngine, EngineOptions
from latebandit.engine.directory import UNKNOWN_FOR, UnknownCampaign
from latebandit.engine.ingest import LOOKUPS_PER_BATCH
from latebandit.runtime import CampaignHistory
from latebandit.store.base import StoreUnavailable
from latebandit.store.memory import MemoryStore
from latebandit.timeutil import format_time
from latebandit.tokens import TokenSigner

T0 = 1_800_000_000_000_000


class Engine:
    """An engine on the embedded store whose audit-history lookups are counted."""

    def __init__(self) -> None:
        self.now = T0
        self.lookups: list[str] = []
        clock = lambda: self.now  # noqa: E731
        self.engine = DecisionEngine(MemoryStore(clock), TokenSigner("s" * 40), clock, np.random.default_rng(0),
                                     EngineOptions(), from_history=self.history)  # fmt: skip

    async def history(self, campaign_id: str) -> Campaign | None:
        self.lookups.append(campaign_id)
        return None


def aggregates(names: list[str]) -> list[dict]:
    at = format_time(T0)
    return [{"type": "aggregate", "campaign": name, "event_id": f"e-{name}", "start": at, "end": at, "value": 1.0}
            for name in names]  # fmt: skip


async def test_a_batch_of_made_up_campaigns_makes_a_bounded_number_of_lookups() -> None:
    test = Engine()
    names = [f"nobody{i}" for i in range(1_000)]
    result = (await test.engine.feedback(aggregates(names))).body()
    assert len(result["rejected"]) == 1_000
    assert {rejection["reason"] for rejection in result["rejected"]} == {"unknown_campaign"}
    assert len(test.lookups) == LOOKUPS_PER_BATCH


async def test_an_unknown_id_is_looked_up_once_per_window() -> None:
    test = Engine()
    names = [f"nobody{i}" for i in range(10)]
    for _ in range(3):
        await test.engine.feedback(aggregates(names))
        with pytest.raises(UnknownCampaign):
            await test.engine.choose("nobody0")
    assert sorted(test.lookups) == sorted(names)
    test.now += UNKNOWN_FOR + 1
    await test.engine.feedback(aggregates(names))
    assert len(test.lookups) == 20


async def test_creating_the_campaign_here_ends_its_unknown_window() -> None:
    test = Engine()
    with pytest.raises(UnknownCampaign):
        await test.engine.choose("late")
    await test.engine.create_campaign(CampaignSpec(id="late", arms=["a", "b"], policy={"name": "ucb1"}))
    assert (await test.engine.choose("late")).arm == "a"


def test_an_unreachable_audit_log_is_tried_once_per_retry_period() -> None:
    history = CampaignHistory(AuditLog("postgresql+psycopg://postgres@127.0.0.1:1/test"))

    async def twice() -> list[str]:
        messages = []
        for campaign in ("a", "b"):
            with pytest.raises(StoreUnavailable) as down:
                await history(campaign)
            messages.append(str(down.value))
        return messages

    first, second = asyncio.run(twice())
    assert "retried shortly" not in first and "retried shortly" in second  # the second did not connect
    history.audit.dispose()
