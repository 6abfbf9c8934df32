"""Browser sessions and one-time sign-in links (service/api/sessions.py).

Revision ID: 0003
Revises: 0002
Create Date: 2027-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("id_hash", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("csrf_token", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_web_sessions_expires", "web_sessions", ["expires_at"])
    op.create_table(
        "sign_in_links",
        sa.Column("code_hash", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_sign_in_links_expires", "sign_in_links", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_sign_in_links_expires", table_name="sign_in_links")
    op.drop_table("sign_in_links")
    op.drop_index("ix_web_sessions_expires", table_name="web_sessions")
    op.drop_table("web_sessions")
