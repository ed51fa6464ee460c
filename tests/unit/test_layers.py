"""The packages' dependency order that docs/architecture.md states: api -> engine -> store, audit -> policies
-> delays. A module imports only from its own layer or those below it (top-level modules are shared by all),
so that a reader can understand a layer without the ones above it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "service" / "latebandit"
LAYERS = {"api": 4, "engine": 3, "store": 2, "audit": 2, "policies": 1, "delays": 0}


def imported(path: Path) -> set[str]:
    """The latebandit subpackages a module imports, at module level or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        modules += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        for module in modules:
            parts = module.split(".")
            if parts[0] == "latebandit" and len(parts) > 1:
                names.add(parts[1])
    return names


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = [
        f"{path.relative_to(PACKAGE)} imports latebandit.{package}"
        for layer, rank in LAYERS.items()
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for package in sorted(imported(path))
        if LAYERS.get(package, -1) > rank
    ]
    assert not upward


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from latebandit.engine.core import DecisionEngine\n")
    assert imported(module) == {"engine"}
