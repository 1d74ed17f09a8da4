"""The usage ledger: totals and client rows per hour, and the ids of the batches written.

Revision ID: 0001
Revises: none
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage_totals",
        sa.Column("bucket", sa.BigInteger(), nullable=False),
        sa.Column("behaviour", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("decision", sa.String(64), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("untracked", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("bucket", "behaviour", "tenant", "decision", name="pk_usage_totals"),
    )
    op.create_table(
        "usage_clients",
        sa.Column("bucket", sa.BigInteger(), nullable=False),
        sa.Column("behaviour", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("client", sa.String(64), nullable=False),
        sa.Column("user_agent", sa.String(200), nullable=False),
        sa.Column("decision", sa.String(64), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("first_seen", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("bucket", "behaviour", "tenant", "client", "user_agent", "decision",
                                name="pk_usage_clients"),
    )
    op.create_table(
        "usage_batches",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("written_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_usage_batches"),
    )
    op.create_index("ix_usage_batches_written_at", "usage_batches", ["written_at"])


def downgrade() -> None:
    op.drop_index("ix_usage_batches_written_at", table_name="usage_batches")
    op.drop_table("usage_batches")
    op.drop_table("usage_clients")
    op.drop_table("usage_totals")
