"""Alembic environment for the autotune cache.

Run only through cache.schema, which passes an open connection (already inside a
transaction and holding the migration lock) in ``config.attributes``; there is
no alembic.ini and no URL here.
"""

from __future__ import annotations

from alembic import context

from autotune.cache.models import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - misuse guard
    raise RuntimeError("run autotune migrations through cache.schema (autotune cache upgrade)")

context.configure(
    connection=connection,
    target_metadata=metadata,
    # SQLite cannot ALTER most things; batch mode rebuilds tables instead.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
