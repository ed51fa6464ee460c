"""The shell blocks of the README and docs/ name the command as a fresh checkout has it (issue 30: a bare
`latebandit` is not on the PATH until the venv is activated, and the docs never said to)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)
BARE = re.compile(r"(?:^|[;&|(]|\$\()\s*latebandit\b")  # the command itself, not .venv/bin/latebandit or a path


def bare_commands() -> list[str]:
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in BLOCK.findall(page.read_text()):
            if "source .venv/bin/activate" in block:
                continue
            lines = [line.split("#", 1)[0] for line in block.splitlines()]
            found += [f"{page.name}: {line.strip()}" for line in lines if BARE.search(line)]
    return found


def test_shell_blocks_run_latebandit_from_the_checkouts_venv() -> None:
    assert bare_commands() == []


def test_a_bare_command_is_found() -> None:
    for line in ("latebandit migrate", "x=1; latebandit serve", "echo $(latebandit export)"):
        assert BARE.search(line), line
    for line in (".venv/bin/latebandit migrate", "cd latebandit", "pip install latebandit-x"):
        assert not BARE.search(line), line
