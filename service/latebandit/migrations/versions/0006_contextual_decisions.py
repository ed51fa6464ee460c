"""Decisions of contextual campaigns carry their chosen features, their footprint and, when the campaign logs
them, the offered actions (column ``contextual``, a JSON object as text, null for other decisions), so that
``rebuild``, ``replay`` and ``GET /state?at=`` reproduce a contextual model.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27 12:00:00

Adding a nullable column changes no existing row; on PostgreSQL the partitioned table passes it to its
partitions.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "audit_decisions"


def upgrade() -> None:
    op.add_column(TABLE, sa.Column("contextual", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table(TABLE, recreate="auto") as batch:
        batch.drop_column("contextual")
