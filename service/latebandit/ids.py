"""The id pattern of CONTRACT.md for campaigns, arms and events."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import StringConstraints

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
ID_RE = re.compile(ID_PATTERN)

Identifier = Annotated[str, StringConstraints(pattern=ID_PATTERN)]


def is_identifier(value: object) -> bool:
    return isinstance(value, str) and ID_RE.fullmatch(value) is not None
