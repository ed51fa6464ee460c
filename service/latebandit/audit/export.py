"""The audit log as an event log (docs/reference/event-log.md): what ``latebandit export`` writes and what
``replay`` and ``rebuild`` read.

Line shapes:

- campaign creation: ``{"type": "campaign", ...stored campaign...}``, the campaign body plus
  ``status``, ``version`` and ``created_at``;
- pause and resume: ``{"type": "campaign", "id", "status": "paused"|"active", "at"}``, no ``arms``,
  so a reader tells a status change from a creation;
- a plan committed by a planning policy (ODAAF, ARS-*, CLW): ``{"type": "campaign", "id", "at", "plan",
  "version", "consumed"}``, the plan and how many closed segments it learnt from;
- a policy change (the campaign's next version): ``{"type": "campaign", "id", "version", "policy", "delay",
  "at"}``, no ``arms`` either;
- an archive: ``{"type": "archive", "campaign", "at"}``;
- arms added or retired: ``{"type": "arms", "campaign", "at", "added", "retired"}``, plus ``"restart": true``
  when the change started the next policy version (stored as a campaign event, action ``arms``);
- decisions: the keys of a decision line plus ``seq``, ``policy``, ``version``, ``fallback`` and, when the client
  sent one, ``request_id`` (replay needs the version and fallback to classify later conversions);
- feedback: the /feedback event plus ``campaign``, ``received_at``, ``outcome`` (and for conversions the
  ``arm`` and ``decided_at`` their decision id carries). Censored, repeat and stale conversions are
  exported: they are real events, and the replay classifies them again.

Times are RFC 3339; keys whose value is null (an absent ``event_id`` or ``request_id``) are left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from latebandit.audit.log import AuditLog
from latebandit.audit.models import TIME_KEYS
from latebandit.audit.records import Record
from latebandit.timeutil import format_time

STATUS_AFTER = {"pause": "paused", "resume": "active"}


def record_to_line(record: Record) -> dict[str, Any]:
    if record["type"] == "campaign":
        return campaign_line(record)
    return {
        key: format_time(value) if key in TIME_KEYS else value for key, value in record.items() if value is not None
    }


def campaign_line(record: Record) -> dict[str, Any]:
    config: dict[str, Any] = record.get("config") or {}  # a pause or resume has none
    if record["action"] == "create":
        fields = {key: value for key, value in config.items() if value is not None}  # unset options: defaults
        return {"type": "campaign", **fields, "created_at": format_time(config["created_at"])}
    if record["action"] == "policy":
        return {"type": "campaign", "id": record["campaign"], "version": config["version"], "policy": config["policy"],
                "delay": config["delay"], "at": format_time(record["at"])}  # fmt: skip
    if record["action"] == "archive":
        return {"type": "archive", "campaign": record["campaign"], "at": format_time(record["at"])}
    if record["action"] == "arms":
        line = {"type": "arms", "campaign": record["campaign"], "at": format_time(record["at"]),
                "added": config["added"], "retired": config["retired"]}  # fmt: skip
        return line | ({"restart": True} if config.get("restart") else {})
    if record["action"] == "plan":
        return {"type": "campaign", "id": record["campaign"], "at": format_time(record["at"]), **config}
    return {"type": "campaign", "id": record["campaign"], "status": STATUS_AFTER[record["action"]],
            "at": format_time(record["at"])}  # fmt: skip


def export_lines(log: AuditLog, campaign: str | None, since_us: int | None, until_us: int | None) -> Iterator[str]:
    """One JSON line per record, in the log's order. ``since_us`` keeps what the service recorded at or
    after it, ``until_us`` what it recorded before (see ``AuditLog.records``): an export since T is an
    increment to an earlier one until T, which holds the campaign creation lines a replay needs first."""
    for record in log.records(campaign, since_us, until_us):
        yield orjson.dumps(record_to_line(record)).decode()
