"""Each sweep's price when submitted, in GPU-hours (service.policy.capped_price): the cap per owner over a
window (SWEEPS_MAX_GPU_HOURS_PER_OWNER) sums the prices of the owner's sweeps within it.

Sweeps submitted before this revision have no price (NULL) and count as nothing: they leave the window
(SWEEPS_GPU_HOURS_WINDOW_S, 7 days by default) unpriced.

Revision ID: 0005
Revises: 0004
Create Date: 2027-01-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("gpu_hours", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("gpu_hours")
