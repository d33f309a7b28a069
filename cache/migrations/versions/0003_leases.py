"""Leases: which sweep tunes which request right now, so concurrent sweeps on one
database never tune a request twice and a crashed sweep's requests are taken over.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from autotune.cache.models import UTCDateTime

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("env_key", sa.String(64), nullable=False),
        sa.Column("request_key", sa.String(64), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("acquired_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("released_at", UTCDateTime(), nullable=True),
        sa.Column("outcome", sa.String(32), nullable=True),
        sa.PrimaryKeyConstraint("env_key", "request_key", name="pk_leases"),
    )
    op.create_index("ix_leases_holder", "leases", ["holder"])


def downgrade() -> None:
    op.drop_index("ix_leases_holder", table_name="leases")
    op.drop_table("leases")
