"""SQLAlchemy ORM models of the cache tables.

Columns are typed (one per record field) rather than one opaque blob, so the
CLI can filter and list without decoding JSON and the hot lookup is a plain
indexed equality. Structured fields (inputs, params, validation, config) are
JSON, never pickles: a shared cache must not be able to run code.

The schema is created and changed only by the Alembic migrations in
``cache/migrations``; ``tests/test_store_contract.py`` checks they agree with
these models.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
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
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
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


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: UTCDateTime}


class EnvironmentRow(Base):
    __tablename__ = "environments"

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    device_kind: Mapped[str] = mapped_column(String(64))
    device_name: Mapped[str] = mapped_column(Text)
    torch_version: Mapped[str] = mapped_column(String(128))
    triton_version: Mapped[str | None] = mapped_column(String(128))
    cuda_version: Mapped[str | None] = mapped_column(String(128))
    system_hash: Mapped[str] = mapped_column(Text)
    config_fingerprint: Mapped[str] = mapped_column(Text)
    config: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class RequestRow(Base):
    __tablename__ = "requests"
    __table_args__ = (
        # The hot lookup: (env_id, key) equality.
        UniqueConstraint("env_id", "key"),
        Index("ix_requests_op", "op"),
        # prune --older-than
        Index("ix_requests_updated_at", "updated_at"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    env_id: Mapped[int] = mapped_column(ForeignKey("environments.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(64))
    op: Mapped[str] = mapped_column(String(128))
    inputs_key: Mapped[str] = mapped_column(Text)
    precision: Mapped[str] = mapped_column(String(32))
    inputs: Mapped[list[Any]]
    params: Mapped[dict[str, Any]]
    choice_hashes: Mapped[list[Any]]
    status: Mapped[str] = mapped_column(String(32))
    winner_hash: Mapped[str | None] = mapped_column(Text)
    validation: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)
    # Provenance of the stored result; updated_at is when this row last changed.
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    host: Mapped[str] = mapped_column(Text)
    sweep_id: Mapped[str | None] = mapped_column(Text)
    tuning_seconds: Mapped[float | None] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(32))
    # The winner's spread over its timed rounds (relative to its median), so a sweep finds the
    # noisy results a quieter host should re-time without reading their candidates.
    winner_spread: Mapped[float | None] = mapped_column(Float)
    # Why ATen was stored though another candidate looked faster ("within_noise"); NULL otherwise.
    fallback_reason: Mapped[str | None] = mapped_column(Text)
    # The search that found the winner; NULL is the default search.
    search: Mapped[str | None] = mapped_column(String(32))


class CandidateRow(Base):
    __tablename__ = "candidates"
    # The unique index also serves "all candidates of a request" (its prefix).
    __table_args__ = (UniqueConstraint("request_id", "choice_hash"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    request_id: Mapped[int] = mapped_column(ForeignKey("requests.id", ondelete="CASCADE"))
    # Order within the result, so a TuningResult round-trips equal.
    position: Mapped[int] = mapped_column(Integer)
    choice_hash: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(Text)
    description: Mapped[str] = mapped_column(Text)
    template_id: Mapped[str | None] = mapped_column(Text)
    params: Mapped[dict[str, Any]]
    time_ms: Mapped[float | None] = mapped_column(Float)  # the median of its timed rounds
    spread: Mapped[float | None] = mapped_column(Float)  # how far the rounds disagree, relative to the median
    repeats: Mapped[int | None] = mapped_column(Integer)  # how many rounds were timed
    failure_kind: Mapped[str | None] = mapped_column(String(64))
    failure_message: Mapped[str | None] = mapped_column(Text)


class MissRow(Base):
    __tablename__ = "misses"
    __table_args__ = (UniqueConstraint("env_id", "key"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    env_id: Mapped[int] = mapped_column(ForeignKey("environments.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(64))
    op: Mapped[str] = mapped_column(String(128))
    inputs_key: Mapped[str] = mapped_column(Text)
    precision: Mapped[str] = mapped_column(String(32))
    inputs: Mapped[list[Any]]
    params: Mapped[dict[str, Any]]
    choice_hashes: Mapped[list[Any]]
    first_seen: Mapped[datetime]
    last_seen: Mapped[datetime]
    count: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(Text)


class KernelConfigRow(Base):
    """Generic data-only key/value per environment (e.g. pointwise/reduction configs)."""

    __tablename__ = "kernel_configs"
    __table_args__ = (UniqueConstraint("env_id", "key"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    env_id: Mapped[int] = mapped_column(ForeignKey("environments.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(Text)
    value: Mapped[dict[str, Any]]
    updated_at: Mapped[datetime]


class ArtifactRow(Base):
    """A compiled artifact (Inductor FX graph, AOTAutograd entry, Dynamo package, C++
    library) under the key torch looks it up by. Written once, never updated.

    The payload is executable code once loaded, so it is stored with its Ed25519
    signature; the store never judges it, readers verify before loading.
    """

    __tablename__ = "artifacts"
    __table_args__ = (
        # The hot lookup: (kind, key) equality. Inductor's keys (e.g. a C++ library's
        # path) can be longer than a btree entry may be on PostgreSQL (~2.7 kB), so
        # the unique index is on a fixed-size hash of the key; `key` stays for ls/export.
        UniqueConstraint("kind", "key_hash"),
        # prune --older-than, and ls newest first
        Index("ix_artifacts_created_at", "created_at"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    key_hash: Mapped[str] = mapped_column(String(64))  # sha256 hex of key (UTF-8)
    key: Mapped[str] = mapped_column(Text)
    digest: Mapped[str] = mapped_column(String(64))  # sha256 hex of payload
    size: Mapped[int] = mapped_column(BigInteger)
    payload: Mapped[bytes] = mapped_column(LargeBinary)  # bytea on PostgreSQL, BLOB on SQLite
    signature: Mapped[bytes | None] = mapped_column(LargeBinary)
    public_key: Mapped[bytes | None] = mapped_column(LargeBinary)
    signer: Mapped[str | None] = mapped_column(String(16))  # fingerprint(public_key), for filters
    torch_version: Mapped[str] = mapped_column(String(128))
    device: Mapped[str] = mapped_column(Text)
    host: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]


class LeaseRow(Base):
    """Who tunes a request right now: one row per (environment, request), claimed by
    one sweep at a time and kept after release (``released_at``), so that a sweep
    that waited on it can tell "done since I started" from "failed long ago".
    The logic lives in ``cache/leases.py``.
    """

    __tablename__ = "leases"
    __table_args__ = (Index("ix_leases_holder", "holder"),)

    env_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    request_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(255))  # host:pid:uuid of the sweep
    acquired_at: Mapped[datetime]
    expires_at: Mapped[datetime]  # renewed by the holder's heartbeat
    released_at: Mapped[datetime | None]
    outcome: Mapped[str | None] = mapped_column(String(32))  # the result's status, at release


environments: Table = cast(Table, EnvironmentRow.__table__)
requests: Table = cast(Table, RequestRow.__table__)
candidates: Table = cast(Table, CandidateRow.__table__)
misses: Table = cast(Table, MissRow.__table__)
kernel_configs: Table = cast(Table, KernelConfigRow.__table__)
artifacts: Table = cast(Table, ArtifactRow.__table__)
leases: Table = cast(Table, LeaseRow.__table__)
