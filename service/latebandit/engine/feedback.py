"""Feedback events: validated one by one, so that one bad event never rejects its neighbours.

Each event either becomes a ``Conversion`` (verified decision id, times checked) or a ``Rejection`` with a
machine-readable reason (docs/reference/http-api.md). Nothing here touches the store: the ingest (engine/ingest.py)
groups the accepted events by campaign and the store deduplicates and counts them atomically.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, NamedTuple

import numpy as np

from latebandit.audit.records import Record
from latebandit.campaign import Campaign
from latebandit.delays.tail import bucket_of
from latebandit.ids import is_identifier
from latebandit.store.base import AnonymousEvent, PreparedConversion
from latebandit.timeutil import MICROS, parse_time
from latebandit.tokens import BatchVerifier, InvalidToken, TokenSigner

MAX_EVENTS = 10_000


class Reason(StrEnum):
    MALFORMED_EVENT = "malformed_event"
    UNKNOWN_CAMPAIGN = "unknown_campaign"
    BAD_DECISION_ID = "bad_decision_id"
    BEFORE_DECISION = "before_decision"
    FUTURE_TIMESTAMP = "future_timestamp"
    VALUE_OUT_OF_RANGE = "value_out_of_range"
    WRONG_FEEDBACK_KIND = "wrong_feedback_kind"
    CAMPAIGN_PAUSED = "campaign_paused"
    CAMPAIGN_ARCHIVED = "campaign_archived"  # received after an archived campaign's feedback_until
    FORBIDDEN_CAMPAIGN = "forbidden_campaign"  # the request's key does not serve the event's campaign
    PHASE_CLOSED = "phase_closed"  # an aggregate for slots whose feedback a planning policy already closed


def not_served(campaign: str) -> str:
    """Why a key restricted to some campaigns is refused ``campaign`` (/choose's 403, an event's rejection)."""
    return f"this key does not serve campaign {campaign!r}"


class Rejection(ValueError):
    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class Conversion(NamedTuple):
    """A conversion whose decision id verified; ``arm`` is an index into the campaign's arms. A named tuple:
    a batch makes one per event, and a frozen dataclass costs several times as much to build."""

    campaign: str
    decision_id: str
    arm: int
    decided_at: int
    pull_counted: bool  # the decision was counted in N (not a fallback)
    version: int
    occurred_at: int
    value: float
    event_id: str | None


def _time(raw: dict[str, Any], name: str) -> int:
    try:
        return parse_time(raw[name])
    except KeyError as error:
        raise Rejection(Reason.MALFORMED_EVENT, f"{name} is required") from error
    except (TypeError, ValueError) as error:
        raise Rejection(Reason.MALFORMED_EVENT, f"{name}: {error}") from error


def _event_id(raw: dict[str, Any]) -> str | None:
    event_id = raw.get("event_id")
    if event_id is not None and not is_identifier(event_id):
        raise Rejection(Reason.MALFORMED_EVENT, "event_id must match ^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
    return event_id


def _value(raw: dict[str, Any], upper: float) -> float:
    value = raw.get("value", 1.0)
    # JSON's numbers are floats and ints (a bool is not a number here): the float, the common case, first
    if type(value) is not float and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise Rejection(Reason.MALFORMED_EVENT, "value must be a number")
    if not 0.0 <= value <= upper or value == math.inf:  # NaN fails the first; upper = inf admits any finite value
        raise Rejection(Reason.VALUE_OUT_OF_RANGE, f"value {value!r} is outside [0, {upper:g}]")
    return float(value)


def parse_conversion(raw: Any, signer: TokenSigner | BatchVerifier, now: int, max_skew: int) -> Conversion:
    """Validate a conversion event; campaign-level checks (known, paused, window) come later."""
    if not isinstance(raw, dict) or raw.get("type") != "conversion":
        raise Rejection(Reason.MALFORMED_EVENT, "not a conversion event")
    decision_id = raw.get("decision_id")
    if not isinstance(decision_id, str):
        raise Rejection(Reason.MALFORMED_EVENT, "decision_id is required")
    event_id = _event_id(raw)
    occurred_at = _time(raw, "occurred_at")
    value = _value(raw, math.inf)  # at most the campaign's reward.max: the store checks it (and refuses it)
    try:
        campaign, arm, decided_at, version, _, fallback = signer.fields(decision_id)
    except InvalidToken as error:
        raise Rejection(Reason.BAD_DECISION_ID, str(error)) from error
    named = raw.get("campaign")
    if named is not None and named != campaign:
        raise Rejection(Reason.BAD_DECISION_ID, f"decision belongs to campaign {campaign!r}, not {named!r}")
    if occurred_at > now + max_skew:
        raise Rejection(Reason.FUTURE_TIMESTAMP, "occurred_at is in the future beyond the allowed skew")
    if occurred_at < decided_at - max_skew:
        raise Rejection(Reason.BEFORE_DECISION, "occurred_at is before its decision")
    return Conversion(campaign, decision_id, arm, decided_at, not fallback, version, occurred_at, value, event_id)


def prepare(campaign: Campaign, conversion: Conversion, received_at: int, retention: float) -> PreparedConversion:
    """``prepare_batch`` of one conversion; raises its Rejection."""
    (prepared,) = prepare_batch(campaign, [conversion], received_at, retention)
    if isinstance(prepared, Rejection):
        raise prepared
    return prepared


def prepare_batch(
    campaign: Campaign, conversions: Sequence[Conversion], received_at: int, retention: float
) -> list[PreparedConversion | Rejection]:
    """Classify conversions against their campaign: censored beyond the window (event time, window end
    included), counted only for a counted pull of the campaign's current policy version. The arithmetic of
    the whole batch (delays, their buckets, how long each conversion is remembered) is done on columns: per
    event, NumPy's call overhead was a fifth of /feedback and Python's arithmetic another tenth.

    A time in the future within the allowed skew is taken as the time of receipt: the conversion counts
    from now on, so the state as of any moment holds only conversions that occurred by then.

    Beyond the window plus the dedup retention the service no longer remembers whether the decision
    converted, so a retry could not be recognised: such a late arrival is recorded and changes nothing (not
    even the observed delays, which a retry would count twice). That is also why a replay may forget a
    decision once it is that old (replay/apply.py). A contextual campaign forgets sooner, after the window plus
    its allowed lateness, when the decision's features (what its conversion adds to b) are no longer kept."""
    if not conversions:
        return []
    decided = np.array([conversion.decided_at for conversion in conversions], dtype=np.int64)
    occurred = np.minimum([conversion.occurred_at for conversion in conversions], received_at)
    delays = np.maximum(occurred - decided, 0)
    window, arms = campaign.window_us, campaign.arms
    # a contextual decision's features are kept for the window plus the allowed lateness (Campaign.features_expire_at)
    remembered = campaign.lateness_us if campaign.contextual else round(retention * MICROS)
    forgotten = decided < received_at - window - remembered
    # seconds the event id and the decision's conversion are remembered: the rest of the window, then retention
    ttls = np.ceil(np.maximum(0.0, (decided + window - received_at) / MICROS) + retention).astype(np.int64)
    columns = zip(
        conversions, occurred.tolist(), (decided // campaign.bucket_width_us).tolist(),
        ((delays > window) | forgotten).tolist(), forgotten.tolist(), ttls.tolist(),
        bucket_of(delays / MICROS).tolist(), strict=True,
    )  # fmt: skip
    current, campaign_id = campaign.version, campaign.id
    prepared: list[PreparedConversion | Rejection] = []
    for conversion, occurred_at, bucket, censored, forgot, ttl, delay_bucket in columns:
        decision_id, arm, decided_at, pull_counted, version, _, value, event_id = conversion[1:]
        if arm >= len(arms):
            prepared.append(Rejection(Reason.BAD_DECISION_ID, "decision names an arm the campaign does not have"))
            continue
        record: Record = {
            "type": "conversion", "campaign": campaign_id, "event_id": event_id, "decision_id": decision_id,
            "arm": arms[arm], "decided_at": decided_at, "occurred_at": occurred_at, "received_at": received_at,
            "value": value,
        }  # fmt: skip
        counts = pull_counted and version == current and not forgot
        prepared.append(
            PreparedConversion(decision_id, arm, bucket, value, counts, censored, event_id, ttl, record, delay_bucket)
        )
    return prepared


def anonymous_event(
    campaign: Campaign, item: Conversion | dict[str, Any], now: int, max_skew: int, retention: float
) -> AnonymousEvent:
    """An aggregate, a watermark, or an attributed conversion read as an aggregate over the instant it
    occurred at (docs/architecture.md: an anonymous learner may always be given attributed feedback), for a campaign
    whose policy learns from sums. Times in the future within the allowed skew are taken as now."""
    ttl = math.ceil(campaign.allowed_lateness + retention)  # an aggregate is refused once its slots closed
    if isinstance(item, Conversion):
        at = min(item.occurred_at, now)
        record: Record = {"type": "conversion", "campaign": campaign.id, "received_at": now,
                          "event_id": item.event_id, "decision_id": item.decision_id,
                          "decided_at": item.decided_at, "occurred_at": at, "value": item.value}  # fmt: skip
        if item.arm < len(campaign.arms):
            record["arm"] = campaign.arms[item.arm]
        counts = item.pull_counted and item.version == campaign.version
        return AnonymousEvent("aggregate", at, at, item.value, item.event_id, item.decision_id, ttl, record, counts)
    raw, kind = item, item.get("type")
    base: Record = {"type": kind, "campaign": campaign.id, "received_at": now}
    if kind == "watermark":
        at = _time(raw, "at")
        if at > now + max_skew:
            raise Rejection(Reason.FUTURE_TIMESTAMP, "a watermark cannot be in the future beyond the allowed skew")
        at = min(at, now)
        return AnonymousEvent("watermark", at, at, 0.0, None, None, ttl, {**base, "at": at})
    if kind != "aggregate":
        raise Rejection(Reason.MALFORMED_EVENT, "type must be conversion, aggregate or watermark")
    event_id = _event_id(raw)
    start, end = _time(raw, "start"), _time(raw, "end")
    if "value" not in raw:
        raise Rejection(Reason.MALFORMED_EVENT, "value is required: the total reward observed in [start, end)")
    value = _value(raw, math.inf)
    if end < start:
        raise Rejection(Reason.MALFORMED_EVENT, "end must not be before start")
    if end > now + max_skew:
        raise Rejection(Reason.FUTURE_TIMESTAMP, "end is in the future beyond the allowed skew")
    start, end = min(start, now), min(end, now)
    record = {**base, "event_id": event_id, "start": start, "end": end, "value": value}
    return AnonymousEvent("aggregate", start, end, value, event_id, None, ttl, record)


def campaign_of(raw: Any) -> str | None:
    """The campaign an aggregate or watermark names, for the wrong-kind and unknown-campaign checks."""
    if not isinstance(raw, dict) or raw.get("type") not in ("aggregate", "watermark"):
        return None
    campaign = raw.get("campaign")
    if not is_identifier(campaign):
        raise Rejection(Reason.MALFORMED_EVENT, "campaign is required and must be a valid id")
    return campaign
