"""Load monitoring: queueing delay and worker-observed wait per shard, and per-block loads.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_SHARD_COLUMNS = ("apply_s", "queue_s", "wait_s")


def upgrade() -> None:
    with op.batch_alter_table("shard_metrics", schema=None) as batch_op:
        for name in _SHARD_COLUMNS:
            batch_op.add_column(sa.Column(name, sa.Float(), nullable=True))
    op.create_table(
        "block_metrics",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=128), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("global_step", sa.BigInteger(), nullable=False),
        sa.Column("block_id", sa.Integer(), nullable=False),
        sa.Column("shard_id", sa.Integer(), nullable=False),
        sa.Column("pushes", sa.Integer(), nullable=False),
        sa.Column("bytes_in", sa.BigInteger(), nullable=False),
        sa.Column("bytes_out", sa.BigInteger(), nullable=False),
        sa.Column("apply_s", sa.Float(), nullable=False),
        sa.Column("queue_s", sa.Float(), nullable=False),
        sa.Column("wait_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("block_metrics", schema=None) as batch_op:
        batch_op.create_index("ix_block_metrics_run_step", ["run_id", "global_step"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("block_metrics", schema=None) as batch_op:
        batch_op.drop_index("ix_block_metrics_run_step")
    op.drop_table("block_metrics")
    with op.batch_alter_table("shard_metrics", schema=None) as batch_op:
        for name in reversed(_SHARD_COLUMNS):
            batch_op.drop_column(name)
