"""Studies submitted over HTTP (POST /studies; service.studies): one row per study, its scales' sweeps are
rows of `sweeps` named `<study id>-s<i>`.

Revision ID: 0006
Revises: 0005
Create Date: 2027-01-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "studies",
        sa.Column("id", sa.String(80), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("laws", sa.JSON(), nullable=True),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("gpu_hours", sa.Float(), nullable=True),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_studies_owner_created", "studies", ["owner", "created_at"])
    op.create_index("ix_studies_status", "studies", ["status"])


def downgrade() -> None:
    op.drop_index("ix_studies_status", table_name="studies")
    op.drop_index("ix_studies_owner_created", table_name="studies")
    op.drop_table("studies")
