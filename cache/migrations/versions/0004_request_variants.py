"""Request keys include the kernel-selecting arguments of the ATen choice.

Inductor asks with one (op, inputs_key) for a Linear with a fused GELU and one without,
or for convolutions that differ only by stride, padding or dilation; their keys were
equal, so one stored result answered both and the other always missed. The key now
includes ``cache.records.request_variant(params)``: this migration recomputes the key of
every stored request and miss from its own row (op, inputs_key, precision, inputs and
params are all stored), so nothing stored is lost. Plain GEMMs keep their keys.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from autotune.cache.records import TuningRequest

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _table(name: str) -> sa.TableClause:
    return sa.table(name, sa.column("id", sa.Integer), sa.column("key", sa.String), sa.column("op", sa.String),
                    sa.column("inputs_key", sa.Text), sa.column("precision", sa.String),
                    sa.column("inputs", sa.JSON), sa.column("params", sa.JSON))


def _rekey(name: str) -> None:
    table = _table(name)
    conn = op.get_bind()
    rows = conn.execute(sa.select(table.c.id, table.c.key, table.c.op, table.c.inputs_key, table.c.precision,
                                  table.c.inputs, table.c.params)).all()
    for row in rows:
        key = TuningRequest.from_json({"op": row.op, "inputs_key": row.inputs_key, "precision": row.precision,
                                       "inputs": row.inputs or [], "params": row.params or {}}).key
        if key != row.key:
            conn.execute(sa.update(table).where(table.c.id == row.id).values(key=key))


def upgrade() -> None:
    _rekey("requests")
    _rekey("misses")


def downgrade() -> None:
    raise NotImplementedError("request keys with variants cannot be folded back: two requests may share the old key")
