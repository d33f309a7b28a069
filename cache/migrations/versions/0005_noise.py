"""Timings with their noise, and why ATen was stored.

A candidate's time is the median of several timed rounds; ``spread`` is how far those
rounds disagree (relative to the median) and ``repeats`` how many there were. A request
keeps its winner's spread (``winner_spread``), so a sweep can find the noisy results a
quieter host should re-time without reading every candidate; ``fallback_reason`` says why
ATen was stored instead of a faster-looking candidate (``within_noise``); ``search`` names
the search that found the winner (NULL reads as the default search). All columns are
nullable: rows stored before them read as they did.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _columns() -> dict[str, tuple[sa.Column[object], ...]]:
    return {
        "candidates": (sa.Column("spread", sa.Float(), nullable=True),
                       sa.Column("repeats", sa.Integer(), nullable=True)),
        "requests": (sa.Column("winner_spread", sa.Float(), nullable=True),
                     sa.Column("fallback_reason", sa.Text(), nullable=True),
                     sa.Column("search", sa.String(32), nullable=True)),
    }


def upgrade() -> None:
    # A column already there is left as it is: a database stamped back to an older
    # revision by hand (as the upgrade tests do) still holds this revision's columns.
    inspector = sa.inspect(op.get_bind())
    for table, columns in _columns().items():
        present = {c["name"] for c in inspector.get_columns(table)}
        for column in columns:
            if column.name not in present:
                op.add_column(table, column)


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("search")
        batch.drop_column("fallback_reason")
        batch.drop_column("winner_spread")
    with op.batch_alter_table("candidates") as batch:
        batch.drop_column("repeats")
        batch.drop_column("spread")
