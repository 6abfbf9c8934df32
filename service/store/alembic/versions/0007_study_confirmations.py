"""A study's confirmation at the target (confirm: true; service.studies): the laws judged by its confirmation
sweep (`sweeps.law.Confirmation` per law, JSON), or why no confirmation sweep ran.

Studies stored before this revision have neither (NULL): they ran without a confirmation.

Revision ID: 0007
Revises: 0006
Create Date: 2027-01-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("studies") as batch:
        batch.add_column(sa.Column("confirmations", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("confirm_note", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("studies") as batch:
        batch.drop_column("confirm_note")
        batch.drop_column("confirmations")
