"""The id pattern (docs/reference/http-api.md) for campaigns, arms and events."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import StringConstraints

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
ID_RE = re.compile(ID_PATTERN)

Identifier = Annotated[str, StringConstraints(pattern=ID_PATTERN)]


def is_identifier(value: object) -> bool:
    """Whether ``value`` matches ID_PATTERN. Letters and digits alone always do, up to 128 of them: checked
    first, without the regular expression, since /feedback checks an event id per event."""
    if not isinstance(value, str):
        return False
    if value.isalnum() and value.isascii() and len(value) <= 128:
        return True
    return ID_RE.fullmatch(value) is not None
