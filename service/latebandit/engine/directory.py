"""Each worker's view of its campaigns: their configurations, cached, and the ids known to be unknown.

Decisions and feedback read a campaign's configuration on every request, so it is cached per worker; the
store's scripts check the status and the policy version themselves, and a decision's script the arms
version too (an arm change keeps the policy version and the statistics: campaign.py's ``Campaign``), and
a stale copy is reloaded when they answer ``moved``. A conversion naming an arm past the cached arms
(added on another worker) reloads it before it is applied (engine/ingest.py). A campaign the store does
not have may still be in the audit log: then the store lost it
(answered as a store outage until ``latebandit rebuild``), and while the store cannot be reached decisions
fall back to the audit log's copy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from latebandit import metrics
from latebandit.campaign import Campaign
from latebandit.store.base import StateStore, StoreUnavailable
from latebandit.timeutil import MICROS, Clock

# Reloads of a campaign whose policy version changed under a request before it answers 503 (retry).
MAX_MOVES = 3
# Campaign ids no store or history knows are answered unknown without a lookup for this long (µs), so a
# client naming made-up campaigns costs one Redis read and one audit query per id and window, not per
# event. The price: a campaign created on another worker meanwhile is unknown here for as long.
UNKNOWN_FOR = 5 * MICROS
UNKNOWN_REMEMBERED = 10_000  # such ids held at most (the oldest go first)


class UnknownCampaign(LookupError):
    pass


class CampaignArchived(LookupError):
    """The campaign is archived: it decides nothing and takes no change (answered 410)."""

    def __init__(self, campaign_id: str) -> None:
        super().__init__(campaign_id)
        self.campaign_id = campaign_id


def lost_campaign(campaign_id: str) -> StoreUnavailable:
    """A campaign this worker knows that the store no longer has: Redis lost its data. Callers answer
    as for a store outage (fallback decisions, 503 on feedback) until `latebandit rebuild` restores it."""
    return StoreUnavailable(f"the store has lost campaign {campaign_id!r}: run `latebandit rebuild`")


class CampaignDirectory:
    def __init__(
        self,
        store: StateStore,
        clock: Clock,
        from_history: Callable[[str], Awaitable[Campaign | None]] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        # The campaign as the audit log knows it: the store may have lost it, or be unreachable.
        self._from_history = from_history
        self._campaigns: dict[str, Campaign] = {}
        self._unknown: dict[str, int] = {}  # campaign id -> until when (µs) it is answered unknown unread

    def knows(self, campaign_id: str) -> bool:
        """Cached here: reading it costs no lookup."""
        return campaign_id in self._campaigns

    def remember(self, campaign: Campaign) -> None:
        """The campaign as the store answered it (created, read, or changed by this worker)."""
        self._campaigns[campaign.id] = campaign
        self._unknown.pop(campaign.id, None)
        metrics.publish_campaign(campaign)

    def _remember_unknown(self, campaign_id: str) -> None:
        if len(self._unknown) >= UNKNOWN_REMEMBERED:
            del self._unknown[next(iter(self._unknown))]
        self._unknown[campaign_id] = self.clock() + UNKNOWN_FOR

    async def campaign(self, campaign_id: str, fresh: bool = False) -> Campaign:
        """The campaign's configuration, from the cache unless ``fresh``. UnknownCampaign if neither the
        store nor the audit log has it; the lost_campaign error if only the audit log does."""
        campaign = None if fresh else self._campaigns.get(campaign_id)
        if campaign is None:
            if not fresh and self._unknown.get(campaign_id, 0) > self.clock():
                raise UnknownCampaign(campaign_id)
            campaign = await self.store.get_campaign(campaign_id)
            if campaign is None:
                if await self.from_history(campaign_id) is not None:
                    raise lost_campaign(campaign_id)  # the same answer on every worker: retry after rebuild
                self._remember_unknown(campaign_id)
                raise UnknownCampaign(campaign_id)
            self.remember(campaign)
        return campaign

    async def refused_unknown(self, campaign_id: str) -> CampaignArchived | StoreUnavailable:
        """Why the store calls unknown a campaign this worker holds: archived (on any worker) and purged since,
        the archived copy remembered from now on; else the store lost it (lost_campaign)."""
        stored = await self.store.get_campaign(campaign_id)
        if stored is not None and stored.archived_at is not None:
            self.remember(stored)
            return CampaignArchived(campaign_id)
        return lost_campaign(campaign_id)

    async def from_history(self, campaign_id: str) -> Campaign | None:
        """The campaign as the audit log knows it (None without an audit log)."""
        return None if self._from_history is None else await self._from_history(campaign_id)

    async def while_store_down(self, campaign_id: str) -> Campaign | None:
        """The audit log's copy when the store cannot be reached, cached so that the next requests decide
        without asking the audit log again."""
        campaign = await self.from_history(campaign_id)
        if campaign is not None:
            self._campaigns[campaign_id] = campaign
        return campaign
