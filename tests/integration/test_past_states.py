"""GET /state?at= at a bounded cost (issue 19): one replay at a time per worker, and a settled moment's
answer kept, against the embedded runtime and its SQLite audit log."""

from __future__ import annotations

import asyncio

from latebandit.api.past_states import REMEMBERED, SETTLED_US, PastStates
from latebandit.audit.queue import QueueEntry
from latebandit.campaign import CampaignSpec
from latebandit.config import Settings
from latebandit.runtime import Runtime
from latebandit.timeutil import MICROS


async def test_a_settled_moment_is_replayed_once_and_replays_take_turns(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    now = [1_800_000_000_000_000]
    runtime = Runtime.build(Settings(database_url=f"sqlite:///{tmp_path / 'audit.db'}"), clock=lambda: now[0])
    await runtime.start()
    try:
        engine = runtime.engine
        await engine.create_campaign(CampaignSpec(id="c", arms=["a", "b"], policy={"name": "ucb1"}))
        for _ in range(5):
            now[0] += MICROS
            await engine.choose("c")
        settled = now[0]
        now[0] += SETTLED_US + MICROS
        past = PastStates(runtime)
        answers = await asyncio.gather(*(past.state("c", settled) for _ in range(3)))  # queued, one at a time
        assert all(answer == answers[0] for answer in answers) and answers[0]["decisions"] == 5
        # A record stamped before the moment, written behind the service's back, is not seen: the answer
        # was kept. (The service never writes one: every later record is stamped later.)
        extra = {"type": "decision", "campaign": "c", "decision_id": "x", "arm": "a", "at": settled - MICROS,
                 "propensity": 1.0, "policy": "ucb1", "version": 1, "fallback": False, "request_id": None,
                 "seq": 99}  # fmt: skip
        runtime.audit.write([QueueEntry("c", f"{settled // 1000}-999999", [extra])])
        assert (await past.state("c", settled))["decisions"] == 5
        recent = now[0] - MICROS  # not settled: answered afresh each time
        assert (await past.state("c", recent))["decisions"] == 6
        for moment in range(REMEMBERED + 1):
            await past.state("c", settled - moment - 1)
        assert (await past.state("c", settled))["decisions"] == 6  # forgotten (the oldest go first): replayed
    finally:
        await runtime.close()
