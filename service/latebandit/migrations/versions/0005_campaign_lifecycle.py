"""Campaign events may record the campaign lifecycle: an archive (action ``archive``) and an arm change (action
``arms``: the arms added and retired in ``config``), so that ``replay`` and ``rebuild`` reproduce both.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27 00:00:00

Batch mode: SQLite (the embedded default) cannot alter a CHECK constraint in place, so the table is copied
(PostgreSQL alters it; the campaign events table is not partitioned).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "audit_campaign_events"
CONSTRAINT = "ck_audit_campaign_events_action"
BEFORE = "'create', 'pause', 'resume', 'policy', 'plan'"


def _allow(actions: str) -> None:
    with op.batch_alter_table(TABLE, recreate="auto") as batch:
        batch.drop_constraint(op.f(CONSTRAINT), type_="check")
        batch.create_check_constraint(op.f(CONSTRAINT), f"action IN ({actions})")


def upgrade() -> None:
    _allow(f"{BEFORE}, 'archive', 'arms'")


def downgrade() -> None:
    op.execute(f"DELETE FROM {TABLE} WHERE action IN ('archive', 'arms')")
    _allow(BEFORE)
