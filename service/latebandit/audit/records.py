"""Audit records: what the state store queues, atomically with each state change, for the audit writer.

A queue entry holds a list of records (one decision, one feedback batch, one campaign change) and has an
id given by the queue (a Redis stream id, or a counter in memory). The writer inserts each record under
the key (campaign, entry id, position in entry), so draining an entry twice never writes a row twice.

Times are epoch microseconds. Records are plain dicts so that they cross Redis as JSON unchanged.

- ``{"type": "campaign", "campaign", "at", "action": "create"|"pause"|"resume"|"policy"|"plan"|"archive",
  "config": {...}}`` (``config``: the whole stored campaign for a creation and a policy change; for ``plan``, the
  plan a planning policy committed, with its version; none for the others)
- ``{"type": "decision", "campaign", "seq", "decision_id", "arm", "at", "propensity", "policy",
  "version", "fallback", "request_id"}``
- ``{"type": "conversion", "campaign", "event_id", "decision_id", "arm", "decided_at",
  "occurred_at", "received_at", "value", "outcome"}``
- ``{"type": "aggregate", "campaign", "event_id", "start", "end", "received_at", "value", "outcome"}``
- ``{"type": "watermark", "campaign", "at", "received_at", "outcome"}``

``outcome`` says how the state store classified the event: see ``Outcome``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

Record = dict[str, Any]


class Outcome(StrEnum):
    COUNTED = "counted"  # changed the policy state
    CENSORED = "censored"  # later than its decision's window: recorded, never counted
    REPEAT = "repeat"  # a new event_id for a decision that already converted: recorded, not counted
    STALE = "stale"  # its decision was a fallback or of an older policy version: recorded, not counted
    DUPLICATE = "duplicate"  # an event_id (or decision) seen before: not recorded again
    PHASE_CLOSED = "phase_closed"  # an aggregate for a segment whose feedback was closed: recorded, refused


FEEDBACK_TYPES = ("conversion", "aggregate", "watermark")
