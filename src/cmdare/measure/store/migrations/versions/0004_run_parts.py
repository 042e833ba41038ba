"""A run's parts: its first training and each resume, with their own steps, time, cost and counts.

The run's figures in all are the sums over its parts (issue 42: after a resume the run showed the second part's
cost beside the whole run's revocations). Runs recorded before this revision have no part rows; they show their
run row as before.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_parts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("part", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("from_step", sa.BigInteger(), nullable=False),
        sa.Column("to_step", sa.BigInteger(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("wall_s", sa.Float(), nullable=True),
        sa.Column("steps_per_s", sa.Float(), nullable=True),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column("revocations", sa.Integer(), nullable=True),
        sa.Column("replacements", sa.Integer(), nullable=True),
        sa.Column("time_lost_s", sa.Float(), nullable=True),
        sa.Column("emulated", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "part", name="uq_run_parts_run_part"),
    )
    with op.batch_alter_table("run_parts", schema=None) as batch_op:
        batch_op.create_index("ix_run_parts_run_id", ["run_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("run_parts", schema=None) as batch_op:
        batch_op.drop_index("ix_run_parts_run_id")
    op.drop_table("run_parts")
