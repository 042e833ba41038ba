"""Servers say whether they were emulated (a local stand-in for a cloud VM).

Old rows default to False; servers of runs recorded as emulated (``runs.emulated``: every run not on
a real Ray cluster) are set True, as the recorder now sets them.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("servers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("emulated", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.execute(
        sa.text(
            "UPDATE servers SET emulated = :yes WHERE run_id IN (SELECT run_id FROM runs WHERE emulated = :yes)"
        ).bindparams(yes=True)
    )


def downgrade() -> None:
    with op.batch_alter_table("servers", schema=None) as batch_op:
        batch_op.drop_column("emulated")
