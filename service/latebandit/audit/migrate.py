"""Alembic, driven from code: ``latebandit migrate``, the embedded SQLite default's ``create_schema`` and
the ``serve`` schema check all run the hand-written migrations in ``migrations/`` through its env.py.

The migrations ship inside the package (``latebandit/migrations``; the repository's top-level
``migrations/`` is a link to them, for the alembic CLI and the layout of the design card), so a regular
install (``pip install .``, as the image does) migrates as a checkout does, and needs no alembic.ini.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.environment import EnvironmentContext
from alembic.script import ScriptDirectory

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(sqlalchemy_url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if sqlalchemy_url is not None:
        config.set_main_option("sqlalchemy.url", sqlalchemy_url.replace("%", "%%"))  # ini interpolation
    return config


def upgrade(sqlalchemy_url: str) -> None:
    command.upgrade(alembic_config(sqlalchemy_url), "head")


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no audit migrations in {MIGRATIONS}")
    return head


def current_revision(sqlalchemy_url: str) -> str | None:
    """The database's revision (None before the first migration), read through env.py so that it
    connects exactly as a migration would."""
    config = alembic_config(sqlalchemy_url)
    script = ScriptDirectory.from_config(config)
    found: list[str | None] = []

    def read(_heads: Any, context: Any) -> list[Any]:
        found.append(context.get_current_revision())
        return []  # nothing to migrate

    with EnvironmentContext(config, script, fn=read, dont_mutate=True):
        script.run_env()
    return found[0]
