"""SQL of the artifact tier, used by Store (the cache/store/ package, cache/store/_artifacts.py).

Plain functions on an open connection: Store owns the engines, transactions,
retries and error translation, this module only knows the ``artifacts`` table.
Artifacts are written once: the first writer of a (kind, key) wins and the row
is never changed, so concurrent publishers of one compiled graph need no lock.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, bindparam, func, select

from autotune.cache.errors import MalformedRow
from autotune.cache.models import artifacts as A
from autotune.cache.records import ARTIFACT_KINDS, MAX_ARTIFACT_BYTES, Artifact, ArtifactInfo, Listing, utcnow
from autotune.cache.store._reading import Reader, checking

UNSIGNED = "unsigned"  # the signer filter and stats label of artifacts without a signature

# Columns of a listing: everything but the payload, which can be tens of MB.
_INFO_COLUMNS = (
    A.c.id, A.c.kind, A.c.key, A.c.size, A.c.digest, A.c.signer,
    A.c.torch_version, A.c.device, A.c.host, A.c.created_at,
)  # fmt: skip
_INFOS = Reader(*_INFO_COLUMNS)
# key_hash finds the row through the unique index; key == :key makes a hash collision a miss.
_BY_KEY = (A.c.kind == bindparam("kind"), A.c.key_hash == bindparam("key_hash"), A.c.key == bindparam("key"))
_EXISTS = select(A.c.id).where(*_BY_KEY)
_INFO_TYPES = {"id": int, "kind": str, "key": str, "size": int, "digest": str, "torch_version": str,
               "device": str, "host": str}

# An import writes artifacts in transactions of at most this many rows or bytes.
IMPORT_BATCH_ROWS = 100
IMPORT_BATCH_BYTES = 64 * 1024 * 1024


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _params(kind: str, key: str) -> dict[str, str]:
    return {"kind": kind, "key_hash": key_hash(key), "key": key}


def row_values(artifact: Artifact) -> dict[str, Any]:
    """The row of an artifact; ValueError (naming the fix) for one the table must not hold."""
    if artifact.kind not in ARTIFACT_KINDS:
        raise ValueError(f"artifact kind {artifact.kind!r} is not one of {', '.join(ARTIFACT_KINDS)}")
    if not artifact.key:
        raise ValueError(f"a {artifact.kind} artifact needs a non-empty key")
    if not isinstance(artifact.payload, (bytes, bytearray, memoryview)):
        raise TypeError(f"artifact payload must be bytes, got {type(artifact.payload).__name__}")
    payload = bytes(artifact.payload)
    return {
        "kind": artifact.kind,
        "key_hash": key_hash(artifact.key),
        "key": artifact.key,
        "digest": hashlib.sha256(payload).hexdigest(),
        "size": len(payload),
        "payload": payload,
        "signature": bytes(artifact.signature) if artifact.signature else None,
        "public_key": bytes(artifact.public_key) if artifact.public_key else None,
        "signer": artifact.signer,
        "torch_version": artifact.torch_version,
        "device": artifact.device,
        "host": artifact.host,
        "created_at": artifact.created_at,
    }


def insert_once(conn: Connection, insert: Any, values: dict[str, Any]) -> bool:
    """Insert unless (kind, key) is taken; True when this call wrote the row.

    ``insert`` is the dialect's INSERT for the table (it has on_conflict_do_nothing).
    """
    params = {"kind": values["kind"], "key_hash": values["key_hash"], "key": values["key"]}
    # Checked first so a publisher that lost the race does not ship megabytes for nothing.
    if conn.execute(_EXISTS, params).first() is not None:
        return False
    statement = (
        insert.values(**values)
        .on_conflict_do_nothing(index_elements=[A.c.kind, A.c.key_hash])
        .returning(A.c.id)
    )
    return conn.execute(statement).first() is not None


def get(conn: Connection, kind: str, key: str, max_bytes: int = MAX_ARTIFACT_BYTES) -> Artifact | None:
    """The artifact under (kind, key), or None. MalformedRow for a row that fails validation,
    a payload over ``max_bytes`` among them: its size is read first, its bytes never."""
    reader, query = _payload_query(conn.dialect.name)
    row = conn.execute(query.where(*_BY_KEY), {**_params(kind, key), "max_bytes": max_bytes}).first()
    return None if row is None else _artifact(reader, row, conn.dialect.name, max_bytes)


def exists(conn: Connection, kind: str, key: str) -> bool:
    return conn.execute(_EXISTS, _params(kind, key)).first() is not None


def next_after(conn: Connection, last_id: int) -> tuple[int, Artifact | MalformedRow] | None:
    """The artifact with the smallest id above last_id (export reads one payload at a time),
    or the MalformedRow that says why its row cannot be read."""
    reader, query = _payload_query(conn.dialect.name)
    query = query.where(A.c.id > bindparam("last_id")).order_by(A.c.id).limit(1)
    row = conn.execute(query, {"last_id": last_id, "max_bytes": None}).first()
    if row is None:
        return None
    try:
        return row.id, _artifact(reader, row, conn.dialect.name, None)
    except MalformedRow as error:
        return row.id, error


@functools.cache
def _payload_query(dialect: str) -> tuple[Reader, sa.Select[Any]]:
    """An artifact row with its payload's length in bytes, and the payload itself only when
    that length is at most :max_bytes (NULL: any). PostgreSQL's octet_length reads a stored
    value's header, not the value; SQLite's length() of a blob reads its record header, and a
    payload stored as anything but a blob has no length here (it is no payload)."""
    length: sa.ColumnElement[int]
    if dialect == "postgresql":
        length = func.octet_length(A.c.payload)
    else:
        length = sa.case((func.typeof(A.c.payload) == "blob", func.length(A.c.payload)))
    cap = bindparam("max_bytes", type_=sa.BigInteger)
    payload = sa.case((sa.or_(cap.is_(None), length <= cap), A.c.payload), else_=sa.null()).label("payload")
    reader = Reader(A.c.id, A.c.kind, A.c.key, payload, length.label("stored_bytes"), A.c.signature,
                    A.c.public_key, A.c.torch_version, A.c.device, A.c.host, A.c.created_at)
    return reader, reader.select(dialect)


def list_infos(
    conn: Connection,
    kind: str | None = None,
    device: str | None = None,
    signer: str | None = None,
    limit: int | None = 100,
) -> Listing[ArtifactInfo]:
    """Newest first, without payloads; rows that fail validation are left out, each in the
    listing's ``malformed``."""
    query = _INFOS.select(conn.dialect.name).where(*filters(device=device))
    query = query.order_by(A.c.created_at.desc(), A.c.id.desc())
    if kind:
        query = query.where(A.c.kind == kind)
    if signer:
        query = query.where(A.c.signer.is_(None) if signer == UNSIGNED else A.c.signer == signer)
    if limit:
        query = query.limit(limit)
    found: Listing[ArtifactInfo] = Listing()
    for row in conn.execute(query):
        try:
            found.append(_info(row, conn.dialect.name))
        except MalformedRow as error:
            found.set_aside(error)
    return found


def filters(
    torch_version: str | None = None, device: str | None = None, older_than: timedelta | None = None
) -> list[sa.ColumnElement[bool]]:
    """prune's filters on artifacts: torch version exact, device a case-insensitive
    substring, age by when the artifact was written (it is never rewritten)."""
    where: list[sa.ColumnElement[bool]] = []
    if torch_version:
        where.append(A.c.torch_version == torch_version)
    if device:
        where.append(func.lower(A.c.device).contains(device.lower(), autoescape=True))
    if older_than is not None:
        where.append(A.c.created_at < utcnow() - older_than)
    return where


def count(conn: Connection, where: Iterable[sa.ColumnElement[bool]]) -> int:
    return conn.execute(select(func.count()).select_from(A).where(*where)).scalar_one()


def delete(conn: Connection, where: Iterable[sa.ColumnElement[bool]]) -> int:
    where = list(where)
    removed = count(conn, where)
    conn.execute(sa.delete(A).where(*where))
    return removed


def stats(conn: Connection) -> dict[str, Any]:
    """Counts and bytes for Store.stats(), read from the small columns only."""
    by_kind: dict[str, int] = {kind: n for kind, n in conn.execute(select(A.c.kind, func.count()).group_by(A.c.kind))}
    by_signer = conn.execute(select(A.c.signer, func.count()).group_by(A.c.signer)).all()
    total = conn.execute(select(func.coalesce(func.sum(A.c.size), 0))).scalar_one()
    return {
        "artifacts": sum(by_kind.values()),
        "artifact_bytes": int(total),
        "artifacts_by_kind": dict(sorted(by_kind.items())),
        "artifact_signers": dict(sorted((signer or UNSIGNED, n) for signer, n in by_signer)),
    }


def batches(artifacts: Iterable[Artifact]) -> Iterator[list[Artifact]]:
    """Group artifacts for import transactions, bounded in rows and in bytes."""
    batch: list[Artifact] = []
    size = 0
    for artifact in artifacts:
        if batch and (len(batch) >= IMPORT_BATCH_ROWS or size + artifact.size > IMPORT_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(artifact)
        size += artifact.size
    if batch:
        yield batch


def _info(row: Any, dialect: str) -> ArtifactInfo:
    with checking("artifacts", row.id):
        return info_from_values(_INFOS.values(row, dialect))


def info_from_values(values: dict[str, Any]) -> ArtifactInfo:
    """An artifact's listing entry from its values by column name (a row's, or one local rank 0
    sent: autotune/job/node_wire.py); ValueError names a value of the wrong type."""
    if values.keys() != {c.name for c in _INFO_COLUMNS}:
        raise ValueError(f"an artifact's entry holds {sorted(values)}, not its columns")
    for name, kind in _INFO_TYPES.items():
        if not isinstance(values[name], kind) or isinstance(values[name], bool):
            raise ValueError(f"{name} is {values[name]!r}, not {kind.__name__}")
    if values["signer"] is not None and not isinstance(values["signer"], str):
        raise ValueError(f"signer is {values['signer']!r}, not a string")
    if not isinstance(values["created_at"], datetime):
        raise ValueError(f"created_at is {values['created_at']!r}, not a timestamp")
    return ArtifactInfo(**values)


def _artifact(reader: Reader, row: Any, dialect: str, max_bytes: int | None) -> Artifact:
    with checking("artifacts", row.id):
        values = reader.values(row, dialect)
        stored = values["stored_bytes"]
        if stored is None:
            raise ValueError("its payload is not bytes")
        if max_bytes is not None and stored > max_bytes:
            raise ValueError(f"its payload of {stored} bytes is over the cap of {max_bytes} bytes "
                             "(AUTOTUNE_MAX_ARTIFACT_BYTES), so it was not read")
        for name in ("signature", "public_key"):
            if values[name] is not None and not isinstance(values[name], (bytes, memoryview)):
                raise ValueError(f"{name} is {values[name]!r}, not bytes")
        for name in ("kind", "key", "torch_version", "device", "host"):
            if not isinstance(values[name], str):
                raise ValueError(f"{name} is {values[name]!r}, not a string")
        if not isinstance(values["created_at"], datetime):
            raise ValueError(f"created_at is {values['created_at']!r}, not a timestamp")
        return Artifact(
            kind=values["kind"],
            key=values["key"],
            payload=bytes(values["payload"]),
            signature=bytes(values["signature"]) if values["signature"] is not None else None,
            public_key=bytes(values["public_key"]) if values["public_key"] is not None else None,
            torch_version=values["torch_version"],
            device=values["device"],
            host=values["host"],
            created_at=values["created_at"],  # UTC-aware: UTCDateTime re-attaches the zone
        )
