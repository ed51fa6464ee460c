"""Allow the audit log to hold committed plans and refused late aggregates.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 00:00:00

Planning policies (ODAAF, ARS-*, CLW) commit plans that a rebuild must replay (campaign action ``plan``),
and an aggregate arriving after its segment's feedback was closed is recorded with outcome
``phase_closed``. Batch mode, so that SQLite (the embedded default) can change CHECK constraints too.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OUTCOMES = "'counted', 'censored', 'repeat', 'stale', 'duplicate'"
ACTIONS = "'create', 'pause', 'resume', 'policy'"


def _constraints(actions: str, outcomes: str) -> None:
    with op.batch_alter_table("audit_campaign_events", recreate="auto") as batch:
        batch.drop_constraint(op.f("ck_audit_campaign_events_action"), type_="check")
        batch.create_check_constraint(op.f("ck_audit_campaign_events_action"), f"action IN ({actions})")
    with op.batch_alter_table("audit_feedback", recreate="auto") as batch:
        batch.drop_constraint(op.f("ck_audit_feedback_outcome"), type_="check")
        batch.create_check_constraint(op.f("ck_audit_feedback_outcome"), f"outcome IN ({outcomes})")


def upgrade() -> None:
    _constraints(f"{ACTIONS}, 'plan'", f"{OUTCOMES}, 'phase_closed'")


def downgrade() -> None:
    op.execute("DELETE FROM audit_campaign_events WHERE action = 'plan'")
    op.execute("DELETE FROM audit_feedback WHERE outcome = 'phase_closed'")
    _constraints(ACTIONS, OUTCOMES)
