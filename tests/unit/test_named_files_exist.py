"""Every repository file a comment, docstring or doc names exists: a path that drifted (a renamed script, a
moved module) sends the next reader nowhere. Read: the docs, configuration and Lua files whole, and a Python
file's comments and docstrings (its code's strings are data: a test's made-up paths, a container's own).
Paths are resolved the way they are written: from the repository's root (``tests/unit/...``,
``docs/...``), from the package (``engine/core.py``, ``store/lua/claim_slots.lua``), from the writing
file's folder (docs/README.md's links into docs/reference), and a bare script name (``claim_slots.lua``) from
the folder of the store's scripts."""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from pathlib import Path

from tests.unit.test_no_outside_paths import ROOT, text_of, tracked

SCANNED = {".py", ".md", ".lua", ".yml", ".yaml", ".toml"}
PACKAGE = ROOT / "service" / "latebandit"
LUA = PACKAGE / "store" / "lua"
TOP = ("service", "tests", "docs", "benchmarks", "deploy", "examples", "migrations")
SUFFIXES = "py|md|lua|yml|yaml|toml|json|sh|ini|cfg|txt|png|svg|mako"
# A path: not part of a longer word, path or URL before it; a glob, placeholder or f-string field after
# it makes it a pattern, not a name.
BEFORE = r"(?<![\w./:~$@-])"
AFTER = r"(?![\w/*{<-])"
NAMED = re.compile(
    BEFORE
    + r"((?:\.\.?/)*(?:"  # a relative path may climb to a parent folder
    + r"(?:" + "|".join(TOP) + r")/[\w.-]*[\w](?:/[\w.-]*[\w])*/?"  # from the root: tests/conftest.py, docs/img/
    + r"|[\w-]+(?:/[\w.-]+)+\.(?:" + SUFFIXES + r")"  # a relative path with a file name: engine/exposure.py
    + r"|[\w-]+\.lua"  # a script of the store's, by its name
    + r"))"
    + AFTER
)  # fmt: skip


def resolves(path: Path, name: str) -> bool:
    """Whether ``name``, as written in ``path``, names an existing file or folder of the repository."""
    for base in (path.parent, ROOT, PACKAGE, PACKAGE.parent, LUA):
        target = Path(os.path.normpath(base / name))
        if target.is_relative_to(ROOT) and target.exists():
            return True
    return False


def missing_names(path: Path, text: str) -> list[tuple[int, str]]:
    """(offset, name) of each path ``text`` names that does not resolve from ``path``."""
    return [(match.start(), match.group(1)) for match in NAMED.finditer(text) if not resolves(path, match.group(1))]


def prose_of(path: Path, text: str) -> list[tuple[int, str]]:
    """(first line, text) of what a reader reads as prose: a Python file's comments and docstrings, any other
    file whole."""
    if path.suffix != ".py":
        return [(1, text)]
    comments = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(text).readline)
        if token.type == tokenize.COMMENT
    ]
    docstrings = [
        (node.body[0].lineno, node.body[0].value.value)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    ]
    return comments + docstrings


def test_every_file_a_comment_or_doc_names_exists() -> None:
    missing = []
    for path in tracked():
        if path.suffix not in SCANNED:
            continue
        text = text_of(path)
        if text is None:
            continue
        for line, prose in prose_of(path, text):
            for offset, name in missing_names(path, prose):
                missing.append(f"{path.relative_to(ROOT)}:{line + prose.count(chr(10), 0, offset)}: {name}")
    assert not missing, "names of files that do not exist:\n" + "\n".join(missing)


def test_the_check_catches_a_wrong_path() -> None:
    """On made-up text: wrong paths of each kind are caught, existing ones (and patterns) pass."""
    here = PACKAGE / "engine" / "core.py"
    text = (
        "engine/core.py, store/lua/claim_slots.lua, claim_slots.lua, tests/unit/, engine/exposure.py, "
        "docs/algorithms/guha.md, tests/unit/test_*.py, https://example.org/docs/missing.md; "
        "../docs/README.md; claim_slot.lua, engine/cores.py, docs/missing.md, tests/nowhere/, ../docs/missing.md"
    )
    assert [name for _, name in missing_names(here, text)] == [
        "claim_slot.lua",
        "engine/cores.py",
        "docs/missing.md",
        "tests/nowhere/",
        "../docs/missing.md",
    ]
