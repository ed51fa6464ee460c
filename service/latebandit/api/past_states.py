"""GET /campaigns/{id}/state?at=: the audit log replayed up to a past moment, at a bounded cost.

A replay reads the campaign's history up to ``at`` (streamed, so its memory is bounded; its time is not).
Each worker therefore runs one such replay at a time, the others waiting their turn, and keeps the last
REMEMBERED answers: the state as of a moment that the drained audit log already covers with SETTLED_US to
spare can no longer change (every later record is stamped later), so a repeated question costs nothing.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from latebandit.replay.rebuild import replay_audit
from latebandit.runtime import Runtime
from latebandit.timeutil import MICROS

REMEMBERED = 64  # answers kept per worker
SETTLED_US = 5 * MICROS  # how far behind the drain a moment must be for its answer to be kept


class CampaignNotYet(LookupError):
    """The campaign did not exist at the moment asked for."""


class PastStates:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._turn = asyncio.Lock()
        self._answers: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()

    async def state(self, campaign_id: str, at: int) -> dict[str, Any]:
        key = (campaign_id, at)
        async with self._turn:
            if key in self._answers:
                self._answers.move_to_end(key)
                return self._answers[key]
            drained = self.runtime.engine.clock()
            await self.runtime.writer.flush()
            replayer = await replay_audit(self.runtime.audit, self.runtime.settings, campaign_id, as_of=at)
            if campaign_id not in replayer.campaigns:
                raise CampaignNotYet(campaign_id)
            body = await replayer.state(campaign_id, at)
            if at < drained - SETTLED_US:
                self._answers[key] = body
                if len(self._answers) > REMEMBERED:
                    self._answers.popitem(last=False)
            return body
