"""Allow the audit log to hold campaign archives (campaign action ``archive``).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 00:00:00

An archived campaign's end is an audit event, so that ``replay`` and ``rebuild`` reproduce it. Batch mode,
so that SQLite (the embedded default) can change the CHECK constraint too.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ACTIONS = "'create', 'pause', 'resume', 'policy', 'plan'"


def _allow(actions: str) -> None:
    with op.batch_alter_table("audit_campaign_events", recreate="auto") as batch:
        batch.drop_constraint(op.f("ck_audit_campaign_events_action"), type_="check")
        batch.create_check_constraint(op.f("ck_audit_campaign_events_action"), f"action IN ({actions})")


def upgrade() -> None:
    _allow(f"{ACTIONS}, 'archive'")


def downgrade() -> None:
    op.execute("DELETE FROM audit_campaign_events WHERE action = 'archive'")
    _allow(ACTIONS)
