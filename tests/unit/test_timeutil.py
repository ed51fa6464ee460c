"""Times on the wire: RFC 3339 written as datetime.isoformat would (the independent reference here), read
back to the same microsecond."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from latebandit.timeutil import MICROS, format_time, parse_time

YEAR_9999 = 253_402_300_800 * MICROS


@given(st.integers(min_value=0, max_value=YEAR_9999 - 1))
def test_format_time_is_isoformat_in_utc_and_parses_back(micros: int) -> None:
    seconds, rest = divmod(micros, MICROS)
    moment = datetime.fromtimestamp(seconds, tz=UTC).replace(microsecond=rest)
    expected = moment.isoformat(timespec="microseconds" if rest else "seconds").replace("+00:00", "Z")
    assert format_time(micros) == expected
    if moment.year <= 9998:
        assert parse_time(expected) == micros
