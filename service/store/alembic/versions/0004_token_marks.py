"""Each browser session and one-time link is bound to its owner's token as configured when it was made
(`token_mark`, service/api/sessions.py): a removed owner or a changed token ends both.

The sessions and links made before this revision are bound to no token, so they end here: their
owners sign in again.

Revision ID: 0004
Revises: 0003
Create Date: 2027-01-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("web_sessions", "sign_in_links")


def upgrade() -> None:
    for table in TABLES:
        op.execute(sa.table(table).delete())
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("token_mark", sa.String(64), nullable=False))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("token_mark")
