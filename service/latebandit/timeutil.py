"""Times on the wire are RFC 3339 strings; inside the service they are integer microseconds since the epoch.

Integers keep bucket offsets and replays exact (no float drift between the live service and a replay).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import UTC, datetime

MICROS = 1_000_000
Clock = Callable[[], int]  # epoch microseconds


def parse_time(text: str) -> int:
    """RFC 3339 with a zone (``Z`` or ``+hh:mm``) to epoch microseconds; ValueError otherwise. Remembers
    recent answers: a feedback batch often repeats its timestamps, and parsing is a tenth of its cost."""
    if not isinstance(text, str):
        raise ValueError("timestamp must be an RFC 3339 string")
    return _parse_time(text)


@functools.lru_cache(maxsize=4096)
def _parse_time(text: str) -> int:
    parsed = datetime.fromisoformat(text.replace("z", "Z"))
    if parsed.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no time zone")
    if not 1970 <= parsed.astimezone(UTC).year <= 9998:
        raise ValueError(f"timestamp {text!r} is outside the years 1970 to 9998")
    return to_micros(parsed)


def to_micros(moment: datetime) -> int:
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * MICROS + delta.microseconds


def format_time(micros: int) -> str:
    """Epoch microseconds to RFC 3339 in UTC, with a ``Z`` and microseconds only when non-zero."""
    seconds, rest = divmod(int(micros), MICROS)
    return f"{_second(seconds)}.{rest:06d}Z" if rest else f"{_second(seconds)}Z"


@functools.lru_cache(maxsize=4096)
def _second(seconds: int) -> str:
    """The date and time of a second: an export formats thousands of times within each one."""
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


def seconds_to_micros(seconds: float) -> int:
    return round(seconds * MICROS)


def wall_clock() -> int:
    """Epoch microseconds now: the service's only source of ``now`` (tests and replays inject others)."""
    return time.time_ns() // 1_000
