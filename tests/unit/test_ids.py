"""is_identifier: its shortcut for letters and digits agrees with the documented pattern on any string."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from latebandit.ids import ID_PATTERN, is_identifier

DOCUMENTED = re.compile(ID_PATTERN)
NEAR_MISSES = st.text(alphabet=st.sampled_from("aZ09_.:-é²٣ \n"), max_size=130)  # non-ASCII letters and digits too


@given(st.one_of(st.text(max_size=200), NEAR_MISSES, st.integers(), st.none()))
def test_agrees_with_the_pattern(value: object) -> None:
    assert is_identifier(value) == (isinstance(value, str) and DOCUMENTED.fullmatch(value) is not None)


def test_length_limits() -> None:
    assert is_identifier("a" * 128)
    assert not is_identifier("a" * 129)
    assert not is_identifier("")
