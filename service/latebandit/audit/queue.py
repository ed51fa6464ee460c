"""The queue between the state store and the audit writer.

The state store appends entries atomically with the state change they describe (a Redis stream, or an
in-process list for the embedded default); the writer drains them into SQL and acknowledges them. An entry
is acknowledged only after its rows are committed, and rows are keyed by (campaign, entry id, position), so
a crash between commit and acknowledgement repeats an insert that the database ignores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from latebandit.audit.records import Record


@dataclass(frozen=True)
class QueueEntry:
    campaign: str
    entry_id: str  # "<milliseconds>-<sequence>", increasing per campaign, as a Redis stream id
    records: list[Record]

    def order_key(self) -> tuple[int, int]:
        millis, sequence = self.entry_id.split("-")
        return int(millis), int(sequence)


class AuditQueue(Protocol):
    async def audit_campaigns(self) -> list[str]:
        """Campaigns whose queue may hold entries."""
        ...

    async def read_audit(self, campaign: str, limit: int) -> list[QueueEntry]:
        """Up to ``limit`` unacknowledged entries of a campaign, oldest first."""
        ...

    async def ack_audit(self, campaign: str, entry_ids: list[str]) -> None:
        """Forget entries whose rows are committed; acknowledging twice is harmless."""
        ...

    async def claim_audit(self, campaign: str, seconds: float) -> bool:
        """Whether this process should drain the campaign now: a lease that keeps the writers of several
        workers from all draining the same queue. Only an optimisation: concurrent drains stay correct. A store
        may answer no for an empty queue (nothing to drain)."""
        ...

    async def audit_backlog(self) -> int:
        """Entries waiting in all campaigns' queues."""
        ...
