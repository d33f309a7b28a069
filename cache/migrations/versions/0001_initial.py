"""Initial schema: environments, requests, candidates, misses, kernel_configs.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from autotune.cache.models import Id, UTCDateTime

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _fk(column: str, target: str) -> sa.Column:
    return sa.Column(column, Id, sa.ForeignKey(target, ondelete="CASCADE"), nullable=False)


def _request_columns() -> list[sa.Column]:
    """Columns a request and a miss share: the TuningRequest's fields."""
    return [
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("op", sa.String(128), nullable=False),
        sa.Column("inputs_key", sa.Text(), nullable=False),
        sa.Column("precision", sa.String(32), nullable=False),
        sa.Column("inputs", sa.JSON(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("choice_hashes", sa.JSON(), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "environments",
        sa.Column("id", Id, primary_key=True),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("device_kind", sa.String(64), nullable=False),
        sa.Column("device_name", sa.Text(), nullable=False),
        sa.Column("torch_version", sa.String(128), nullable=False),
        sa.Column("triton_version", sa.String(128), nullable=True),
        sa.Column("cuda_version", sa.String(128), nullable=True),
        sa.Column("system_hash", sa.Text(), nullable=False),
        sa.Column("config_fingerprint", sa.Text(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("key", name="uq_environments_key"),
    )
    op.create_table(
        "requests",
        sa.Column("id", Id, primary_key=True),
        _fk("env_id", "environments.id"),
        *_request_columns(),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("winner_hash", sa.Text(), nullable=True),
        sa.Column("validation", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("sweep_id", sa.Text(), nullable=True),
        sa.Column("tuning_seconds", sa.Float(), nullable=True),
        sa.Column("source", sa.String(32), nullable=False),
        sa.UniqueConstraint("env_id", "key", name="uq_requests_env_id_key"),
    )
    op.create_index("ix_requests_op", "requests", ["op"])
    op.create_index("ix_requests_updated_at", "requests", ["updated_at"])
    op.create_table(
        "candidates",
        sa.Column("id", Id, primary_key=True),
        _fk("request_id", "requests.id"),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("choice_hash", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("template_id", sa.Text(), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("time_ms", sa.Float(), nullable=True),
        sa.Column("failure_kind", sa.String(64), nullable=True),
        sa.Column("failure_message", sa.Text(), nullable=True),
        sa.UniqueConstraint(
            "request_id", "choice_hash", name="uq_candidates_request_id_choice_hash"
        ),
    )
    op.create_table(
        "misses",
        sa.Column("id", Id, primary_key=True),
        _fk("env_id", "environments.id"),
        *_request_columns(),
        sa.Column("first_seen", UTCDateTime(), nullable=False),
        sa.Column("last_seen", UTCDateTime(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.UniqueConstraint("env_id", "key", name="uq_misses_env_id_key"),
    )
    op.create_table(
        "kernel_configs",
        sa.Column("id", Id, primary_key=True),
        _fk("env_id", "environments.id"),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("env_id", "key", name="uq_kernel_configs_env_id_key"),
    )


def downgrade() -> None:
    for table in ("kernel_configs", "misses", "candidates", "requests", "environments"):
        op.drop_table(table)
