"""SQLAlchemy Core tables of the cache.

Columns are typed (one per record field) rather than one opaque blob, so the
CLI can filter and list without decoding JSON and the hot lookup is a plain
indexed equality. Structured fields (inputs, params, validation, config) are
JSON, never pickles: a shared cache must not be able to run code.

Core only, never ``sqlalchemy.orm``: nothing here maps rows to objects, and the ORM's
modules are a large part of what a job's prefetch thread imports, holding the GIL while the
script builds its model (benchmarks/results/install_cost.md).

The schema is created and changed only by the Alembic migrations in
``cache/migrations``; ``tests/test_store_contract.py`` checks they agree with
these tables.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

# Deterministic constraint names, so migrations can refer to them on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# 64-bit ids on PostgreSQL; SQLite only autoincrements an INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend.

    SQLite has no timezone type and returns naive values; storing UTC and
    re-attaching the zone on the way out keeps records round-tripping equal.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


metadata = MetaData(naming_convention=NAMING_CONVENTION)

# Every column but a primary key's states its nullability: Core's default (nullable=True)
# is not the schema's.

environments = Table(
    "environments",
    metadata,
    Column("id", Id, primary_key=True),
    Column("key", String(64), nullable=False, unique=True),
    Column("device_kind", String(64), nullable=False),
    Column("device_name", Text, nullable=False),
    Column("torch_version", String(128), nullable=False),
    Column("triton_version", String(128), nullable=True),
    Column("cuda_version", String(128), nullable=True),
    Column("system_hash", Text, nullable=False),
    Column("config_fingerprint", Text, nullable=False),
    Column("config", JSON, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)

requests = Table(
    "requests",
    metadata,
    Column("id", Id, primary_key=True),
    Column("env_id", ForeignKey("environments.id", ondelete="CASCADE"), nullable=False),
    Column("key", String(64), nullable=False),
    Column("op", String(128), nullable=False),
    Column("inputs_key", Text, nullable=False),
    Column("precision", String(32), nullable=False),
    Column("inputs", JSON, nullable=False),
    Column("params", JSON, nullable=False),
    Column("choice_hashes", JSON, nullable=False),
    Column("status", String(32), nullable=False),
    Column("winner_hash", Text, nullable=True),
    Column("validation", JSON, nullable=True),
    Column("error", Text, nullable=True),
    # Provenance of the stored result; updated_at is when this row last changed.
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("host", Text, nullable=False),
    Column("sweep_id", Text, nullable=True),
    Column("tuning_seconds", Float, nullable=True),
    Column("source", String(32), nullable=False),
    # The winner's spread over its timed rounds (relative to its median), so a sweep finds the
    # noisy results a quieter host should re-time without reading their candidates.
    Column("winner_spread", Float, nullable=True),
    # Why ATen was stored though another candidate looked faster ("within_noise"); NULL otherwise.
    Column("fallback_reason", Text, nullable=True),
    # The search that found the winner; NULL is the default search.
    Column("search", String(32), nullable=True),
    # The hot lookup: (env_id, key) equality.
    UniqueConstraint("env_id", "key"),
    Index("ix_requests_op", "op"),
    # prune --older-than
    Index("ix_requests_updated_at", "updated_at"),
)

# The unique index also serves "all candidates of a request" (its prefix).
candidates = Table(
    "candidates",
    metadata,
    Column("id", Id, primary_key=True),
    Column("request_id", ForeignKey("requests.id", ondelete="CASCADE"), nullable=False),
    # Order within the result, so a TuningResult round-trips equal.
    Column("position", Integer, nullable=False),
    Column("choice_hash", Text, nullable=False),
    Column("kind", String(64), nullable=False),
    Column("name", Text, nullable=False),
    Column("description", Text, nullable=False),
    Column("template_id", Text, nullable=True),
    Column("params", JSON, nullable=False),
    Column("time_ms", Float, nullable=True),  # the median of its timed rounds
    Column("spread", Float, nullable=True),  # how far the rounds disagree, relative to the median
    Column("repeats", Integer, nullable=True),  # how many rounds were timed
    Column("failure_kind", String(64), nullable=True),
    Column("failure_message", Text, nullable=True),
    UniqueConstraint("request_id", "choice_hash"),
)

misses = Table(
    "misses",
    metadata,
    Column("id", Id, primary_key=True),
    Column("env_id", ForeignKey("environments.id", ondelete="CASCADE"), nullable=False),
    Column("key", String(64), nullable=False),
    Column("op", String(128), nullable=False),
    Column("inputs_key", Text, nullable=False),
    Column("precision", String(32), nullable=False),
    Column("inputs", JSON, nullable=False),
    Column("params", JSON, nullable=False),
    Column("choice_hashes", JSON, nullable=False),
    Column("first_seen", UTCDateTime, nullable=False),
    Column("last_seen", UTCDateTime, nullable=False),
    Column("count", Integer, nullable=False),
    Column("host", Text, nullable=False),
    UniqueConstraint("env_id", "key"),
)

# Generic data-only key/value per environment (e.g. pointwise/reduction configs).
kernel_configs = Table(
    "kernel_configs",
    metadata,
    Column("id", Id, primary_key=True),
    Column("env_id", ForeignKey("environments.id", ondelete="CASCADE"), nullable=False),
    Column("key", Text, nullable=False),
    Column("value", JSON, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    UniqueConstraint("env_id", "key"),
)

# A compiled artifact (Inductor FX graph, AOTAutograd entry, Dynamo package, C++
# library) under the key torch looks it up by. Written once, never updated.
#
# The payload is executable code once loaded, so it is stored with its Ed25519
# signature; the store never judges it, readers verify before loading.
artifacts = Table(
    "artifacts",
    metadata,
    Column("id", Id, primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("key_hash", String(64), nullable=False),  # sha256 hex of key (UTF-8)
    Column("key", Text, nullable=False),
    Column("digest", String(64), nullable=False),  # sha256 hex of payload
    Column("size", BigInteger, nullable=False),
    Column("payload", LargeBinary, nullable=False),  # bytea on PostgreSQL, BLOB on SQLite
    Column("signature", LargeBinary, nullable=True),
    Column("public_key", LargeBinary, nullable=True),
    Column("signer", String(16), nullable=True),  # fingerprint(public_key), for filters
    Column("torch_version", String(128), nullable=False),
    Column("device", Text, nullable=False),
    Column("host", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    # The hot lookup: (kind, key) equality. Inductor's keys (e.g. a C++ library's
    # path) can be longer than a btree entry may be on PostgreSQL (~2.7 kB), so
    # the unique index is on a fixed-size hash of the key; `key` stays for ls/export.
    UniqueConstraint("kind", "key_hash"),
    # prune --older-than, and ls newest first
    Index("ix_artifacts_created_at", "created_at"),
)

# Who tunes a request right now: one row per (environment, request), claimed by
# one sweep at a time and kept after release (``released_at``), so that a sweep
# that waited on it can tell "done since I started" from "failed long ago".
# The logic lives in ``cache/leases.py``.
leases = Table(
    "leases",
    metadata,
    Column("env_key", String(64), primary_key=True),
    Column("request_key", String(64), primary_key=True),
    Column("holder", String(255), nullable=False),  # host:pid:uuid of the sweep
    Column("acquired_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),  # renewed by the holder's heartbeat
    Column("released_at", UTCDateTime, nullable=True),
    Column("outcome", String(32), nullable=True),  # the result's status, at release
    Index("ix_leases_holder", "holder"),
)
