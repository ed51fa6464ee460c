"""Alembic environment for the audit schema (the layout of FastAPI's full-stack template).

``service/latebandit/audit/migrate.py`` sets ``sqlalchemy.url`` in code; the alembic CLI (alembic.ini at the
repository root) falls back to ``LATEBANDIT_DATABASE_URL``, mapped to the service's driver by Settings.
Connections come from the service's own engine factory, so migrations see the same SQLite settings
(WAL, real transactions: a failed migration leaves no half-built schema) as the running service.
"""

from __future__ import annotations

from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy import pool

from latebandit.audit.log import audit_engine
from latebandit.audit.models import Base
from latebandit.audit.partitions import include_name
from latebandit.config import Settings

config = context.config

if config.config_file_name is not None:
    fileConfig(config.config_file_name)

target_metadata = Base.metadata


def get_url() -> str:
    return config.get_main_option("sqlalchemy.url") or Settings().sqlalchemy_url


def options(url: str) -> dict[str, Any]:
    # SQLite cannot ALTER most things: autogenerate must render batch (copy-and-move) operations.
    return {
        "target_metadata": target_metadata,
        "compare_type": True,
        "render_as_batch": url.startswith("sqlite"),
        "transactional_ddl": True,
        "include_name": include_name,
    }


def run_migrations_offline() -> None:
    url = get_url()
    context.configure(url=url, literal_binds=True, **options(url))
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = get_url()
    with audit_engine(url, poolclass=pool.NullPool).connect() as connection:
        context.configure(connection=connection, **options(url))
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
