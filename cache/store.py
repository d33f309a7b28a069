"""The persistent, shared kernel cache: SQLite or PostgreSQL behind one Store.

Many sweep workers on several hosts write at once and training jobs read at
compile time, so every write is an idempotent upsert inside one transaction
(retried on benign races), and the read path is two indexed queries with the
environment id cached in memory.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import random
import shutil
import socket
import sqlite3
import tempfile
import threading
import time
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import IO, TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, bindparam, delete, event, exc, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url

from cache import artifacts_store, jsonl, schema
from cache.errors import CacheError, CacheUnavailable, ReadOnlyError, SchemaOutdated
from cache.models import artifacts as A
from cache.models import candidates as C
from cache.models import environments as E
from cache.models import kernel_configs as K
from cache.models import misses as M
from cache.models import requests as R
from cache.records import (
    STATUS_OK,
    Artifact,
    ArtifactInfo,
    CandidateResult,
    Environment,
    InputLayout,
    MissRecord,
    Provenance,
    TuningRequest,
    TuningResult,
    utcnow,
)
from cache.url import resolve_cache_url

if TYPE_CHECKING:
    from cache.leases import Leases

log = logging.getLogger(__name__)

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_S = 30.0
_WRITE_ATTEMPTS = 6
_BATCH = 500  # results per write transaction / ids per IN (...) list
_WRITE_OPT = "autotune_write"  # execution option: open the transaction for writing
# PostgreSQL errors a retry fixes: serialization failure, deadlock detected.
_PG_TRANSIENT = {"40001", "40P01"}

_LOOKUP_REQUEST = select(R).where(R.c.env_id == bindparam("env_id"), R.c.key == bindparam("key"))
_LOOKUP_CANDIDATES = (
    select(C).where(C.c.request_id == bindparam("request_id")).order_by(C.c.position)
)
_CANDIDATE_FIELDS = (
    "choice_hash", "kind", "name", "description", "template_id",
    "params", "time_ms", "failure_kind", "failure_message",
)  # fmt: skip


def _pg_lookup_statement() -> sa.Select[Any]:
    """PostgreSQL: the request row and its candidates (as one JSON array) in one
    statement, so a lookup is one round trip and sees one consistent snapshot.
    (Not on SQLite: its JSON prints doubles with 15 digits, so times would not
    round-trip exactly; there a lookup is two in-process queries instead.)"""
    cand = C.alias("c")
    obj = func.json_build_object(
        *(arg for name in _CANDIDATE_FIELDS for arg in (sa.literal_column(f"'{name}'"), cand.c[name]))
    )
    cands = (
        select(func.json_agg(postgresql.aggregate_order_by(obj, cand.c.position), type_=sa.JSON))
        .where(cand.c.request_id == R.c.id)
        .scalar_subquery()
    )
    return select(R, cands.label("candidates_json")).where(
        R.c.env_id == bindparam("env_id"), R.c.key == bindparam("key")
    )


_PG_LOOKUP = _pg_lookup_statement()
_PG_LOOKUP_SQL = str(_PG_LOOKUP.compile(dialect=postgresql.psycopg.dialect()))
_PgLookupRow = namedtuple("_PgLookupRow", [*(c.name for c in R.c), "candidates_json"])  # type: ignore[misc]
_ENV_ID = select(E.c.id).where(E.c.key == bindparam("key"))


ExportReport = jsonl.ExportReport


@dataclass(frozen=True)
class ImportReport:
    imported: int  # results written (new or changed)
    unchanged: int  # results already stored with the same values
    kernel_configs: int = 0  # pointwise/reduction configs written (replacing equal keys)
    artifacts: int = 0  # artifacts written
    artifacts_skipped: int = 0  # artifacts whose (kind, key) was already stored (write once)

    @property
    def total(self) -> int:
        return self.imported + self.unchanged


def _one_line(error: BaseException) -> str:
    """The first line of the driver's message (SQLAlchemy appends SQL and a URL)."""
    orig = getattr(error, "orig", None) or error
    lines = [line.strip() for line in str(orig).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(orig).__name__


def _db_errors(method: Callable[..., T]) -> Callable[..., T]:
    """Turn driver errors into CacheError subclasses with one-line messages."""

    @functools.wraps(method)
    def wrapper(self: Store, *args: Any, **kwargs: Any) -> T:
        try:
            return method(self, *args, **kwargs)
        except CacheError:
            raise
        except (exc.OperationalError, exc.InterfaceError) as error:
            raise CacheUnavailable(self._unavailable_message(error)) from error
        except exc.SQLAlchemyError as error:
            raise CacheError(f"cache database error ({self.masked_url}): {_one_line(error)}") from error

    return wrapper


class Store:
    """The kernel cache. Cheap to construct: it connects on first use.

    Picklable (Ray ships it to workers): only the configuration travels and the
    engine is recreated lazily in the receiving process.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        read_only: bool = False,
        connect_timeout: float = 5.0,
        create: bool = True,
        migrations_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.url = resolve_cache_url(url)
        self.read_only = read_only
        self.connect_timeout = connect_timeout
        # A read-only store never creates anything, not even an empty file.
        self.create = create and not read_only
        # Another migration script directory; for tests of schema upgrades.
        self.migrations_dir = str(migrations_dir) if migrations_dir else None
        self._sa_url = _parse_url(self.url)
        self._lock = threading.RLock()
        self._engine_obj: Engine | None = None
        self._read_engine: Engine | None = None
        self._pid: int | None = None
        self._checked = False
        self._env_ids: dict[str, int] = {}

    # ------------------------------------------------------------------ basics

    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "read_only": self.read_only,
            "connect_timeout": self.connect_timeout,
            "create": self.create,
            "migrations_dir": self.migrations_dir,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        url = state.pop("url")
        self.__init__(url, **state)  # type: ignore[misc]

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "read-write"
        return f"Store({self.masked_url!r}, {mode})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def masked_url(self) -> str:
        return self._sa_url.render_as_string(hide_password=True)

    @property
    def dialect(self) -> str:
        return self._sa_url.get_backend_name()

    def close(self) -> None:
        with self._lock:
            if self._engine_obj is not None and self._pid == os.getpid():
                self._engine_obj.dispose()  # the read engine shares its pool
            self._engine_obj = self._read_engine = None
            self._checked = False
            self._env_ids.clear()

    # ------------------------------------------------------------------ engine

    def _engine(self) -> Engine:
        """The engine, created on first use (and again in a forked child); no schema check."""
        engine = self._engine_obj
        if engine is not None and self._pid == os.getpid():
            return engine
        with self._lock:
            if self._engine_obj is not None and self._pid != os.getpid():
                # Pooled connections belong to the parent process; never share them.
                self._engine_obj.dispose(close=False)
                self._engine_obj = self._read_engine = None
                self._checked = False
            if self._engine_obj is None:
                self._engine_obj = self._create_engine()
                self._read_engine = self._create_read_engine(self._engine_obj)
                self._pid = os.getpid()
            return self._engine_obj

    def _create_engine(self) -> Engine:
        if self.dialect == "sqlite":
            return self._create_sqlite_engine()
        connect_args: dict[str, Any] = {}
        if "connect_timeout" not in self._sa_url.query:
            # libpq takes whole seconds; a down server must fail fast, not hang.
            connect_args["connect_timeout"] = max(1, math.ceil(self.connect_timeout))
        if "application_name" not in self._sa_url.query:
            connect_args["application_name"] = "autotune"
        return sa.create_engine(
            self._sa_url,
            connect_args=connect_args,
            pool_size=8,
            max_overflow=16,
            pool_recycle=3600,
        )

    def _create_read_engine(self, engine: Engine) -> Engine:
        if self.dialect != "postgresql":
            return engine  # SQLite reads use a deferred transaction: one snapshot
        # Autocommit reads skip BEGIN/ROLLBACK round trips on the hot path. Same
        # pool as writes, so a process holds few server connections.
        return engine.execution_options(isolation_level="AUTOCOMMIT")

    def _sqlite_path(self) -> Path | None:
        database = self._sa_url.database
        if not database or database == ":memory:" or database.startswith("file:"):
            return None
        return Path(database)

    def _create_sqlite_engine(self) -> Engine:
        path = self._sqlite_path()
        if path is not None and not path.exists():
            if not self.create:
                raise CacheUnavailable(
                    f"no cache database at {path}; create it with "
                    f"`autotune cache upgrade --cache {path}` or by running a sweep"
                )
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise CacheUnavailable(
                    f"cannot create the cache directory {path.parent}: {error.strerror}; "
                    "choose a writable location with --cache or AUTOTUNE_CACHE"
                ) from error
        engine = sa.create_engine(self._sa_url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
        _install_sqlite_hooks(engine, wal=not self.read_only)
        return engine

    @_db_errors
    def connect(self) -> None:
        """Connect and check the schema now rather than at the first read or write."""
        self._ready()

    def _ready(self) -> Engine:
        """The engine, with the schema version checked once per engine."""
        engine = self._engine()
        if not self._checked:
            with self._lock:
                if not self._checked:
                    self._check_schema(engine)
                    self._checked = True
        return engine

    def _check_schema(self, engine: Engine) -> None:
        head = schema.head_revision(self.migrations_dir)
        for _ in range(2):
            with engine.connect() as conn:
                revision = schema.current_revision(conn)
                empty = revision is None and not schema.has_cache_tables(conn)
            if revision == head:
                return
            if not empty:
                raise self._schema_error(revision, head)
            if not self.create:
                raise SchemaOutdated(
                    f"cache database {self.masked_url} has no autotune schema yet; "
                    "create it with `autotune cache upgrade`"
                )
            self._migrate(engine, only_if_empty=True)
        raise self._schema_error(revision, head)

    def _schema_error(self, revision: str | None, head: str) -> SchemaOutdated:
        where = f"cache database {self.masked_url}"
        if revision is None:
            return SchemaOutdated(
                f"{where} has cache tables but no schema version; it was not created by "
                "autotune migrations: export what you need and recreate it "
                "(`autotune cache upgrade` cannot migrate it)"
            )
        if revision not in schema.known_revisions(self.migrations_dir):
            return SchemaOutdated(
                f"{where} is at schema revision {revision}, newer than this autotune knows "
                f"(head {head}); upgrade the autotune package"
            )
        return SchemaOutdated(
            f"{where} is at schema revision {revision} but this autotune needs {head}; "
            "run `autotune cache upgrade` to migrate it"
        )

    def _migrate(self, engine: Engine, *, only_if_empty: bool) -> None:
        with engine.connect() as conn:
            conn.execution_options(**{_WRITE_OPT: True})
            with conn.begin():
                schema.lock_for_migration(conn)
                if only_if_empty and (
                    schema.current_revision(conn) is not None or schema.has_cache_tables(conn)
                ):
                    return  # another process created it while we waited for the lock
                schema.upgrade(conn, self.migrations_dir)

    def _unavailable_message(self, error: BaseException) -> str:
        problem = _one_line(error)
        if self.dialect == "sqlite":
            return (
                f"cannot use SQLite cache {self._sqlite_path() or ':memory:'}: {problem}; "
                "check that its directory exists and is writable (and not on a network filesystem)"
            )
        return (
            f"cannot use cache database {self.masked_url}: {problem}; check that PostgreSQL is "
            "running and reachable and that the URL (--cache or AUTOTUNE_CACHE) is right"
        )

    # ------------------------------------------------------------ transactions

    def _require_writable(self, what: str = "write to") -> None:
        if self.read_only:
            raise ReadOnlyError(f"cannot {what} the cache: this store was opened read-only")

    def _write(self, work: Callable[[Connection], T]) -> T:
        """Run work(conn) in one write transaction, retrying benign races."""
        self._require_writable()
        engine = self._ready()
        for attempt in range(1, _WRITE_ATTEMPTS + 1):
            try:
                with engine.connect() as conn:
                    conn.execution_options(**{_WRITE_OPT: True})
                    with conn.begin():
                        return work(conn)
            except exc.IntegrityError:
                # A racing writer, or an env id cached before someone pruned it:
                # re-resolve ids and try once more; a second one is a real error.
                self._env_ids.clear()
                if attempt >= 2:
                    raise
            except exc.DBAPIError as error:
                if attempt == _WRITE_ATTEMPTS or not self._transient(error):
                    raise
            log.debug("retrying cache write (attempt %d)", attempt + 1)
            time.sleep(random.uniform(0, min(0.02 * 2**attempt, 1.0)))
        raise AssertionError("unreachable")

    def _read(self, work: Callable[[Connection], T]) -> T:
        """Run work(conn) on a read connection, once more if the pooled one had died."""
        self._ready()
        assert self._read_engine is not None
        for attempt in (1, 2):
            try:
                with self._read_engine.connect() as conn:
                    return work(conn)
            except exc.DBAPIError as error:
                if attempt == 2 or not error.connection_invalidated:
                    raise
                log.info("cache connection lost (%s); retrying on a new one", _one_line(error))
        raise AssertionError("unreachable")

    def _transient(self, error: exc.DBAPIError) -> bool:
        if error.connection_invalidated:
            return True
        if self.dialect == "sqlite":
            text = str(error.orig).lower()
            return "locked" in text or "busy" in text
        return getattr(error.orig, "sqlstate", None) in _PG_TRANSIENT

    def _insert(self, table: sa.Table) -> Any:
        dialect = postgresql if self.dialect == "postgresql" else sqlite
        return dialect.insert(table)

    # -------------------------------------------------------------- env ids

    def _env_id(self, conn: Connection, env: Environment, env_key: str | None = None) -> int | None:
        env_key = env_key or env.key  # a sha256 per call: callers on the hot path pass it in
        env_id = self._env_ids.get(env_key)
        if env_id is None:
            env_id = conn.execute(_ENV_ID, {"key": env_key}).scalar_one_or_none()
            if env_id is not None:
                self._env_ids[env_key] = env_id
        return env_id

    def _env_id_for_write(self, conn: Connection, env: Environment) -> int:
        env_id = self._env_ids.get(env.key)
        if env_id is not None:
            return env_id
        # DO NOTHING (not DO UPDATE) so writers never hold a lock on the shared env row.
        conn.execute(self._insert(E).values(**_env_values(env)).on_conflict_do_nothing())
        env_id = conn.execute(_ENV_ID, {"key": env.key}).scalar_one()
        self._env_ids[env.key] = env_id
        return env_id

    def leases(self, holder: str | None = None, seconds: float = 60.0) -> Leases:
        """Leases of one sweep (``holder``) on this database's requests; see cache/leases.py."""
        from cache.leases import Leases, new_holder_id

        return Leases(self, holder or new_holder_id(), seconds)

    # ------------------------------------------------------------------ writes

    @_db_errors
    def put_result(self, result: TuningResult) -> None:
        """Store (or replace) one result; clears any logged miss for it."""
        self.put_results([result])

    @_db_errors
    def put_results(self, results: Iterable[TuningResult]) -> int:
        """Store many results, a batch per transaction; returns how many were given."""
        self._require_writable()
        # The last result for a key wins; a fixed order keeps PostgreSQL lock order
        # the same in every writer, so overlapping batches do not deadlock.
        unique = {(r.env.key, r.request.key): r for r in results}
        ordered = [unique[k] for k in sorted(unique)]
        for batch in _chunks(ordered, _BATCH):
            self._write(lambda conn, batch=batch: self._put_batch(conn, batch))
        return len(ordered)

    def _put_batch(self, conn: Connection, batch: Sequence[TuningResult]) -> None:
        now = utcnow()
        for result in batch:
            self._put(conn, result, now)

    def _put(self, conn: Connection, result: TuningResult, now: datetime) -> None:
        env_id = self._env_id_for_write(conn, result.env)
        values = _result_values(result, env_id, now)
        insert = self._insert(R).values(**values)
        insert = insert.on_conflict_do_update(
            index_elements=[R.c.env_id, R.c.key],
            set_={name: insert.excluded[name] for name in values if name not in ("env_id", "key")},
        ).returning(R.c.id)
        request_id = conn.execute(insert).scalar_one()
        candidates = _dedupe(result.candidates)
        # A re-tune replaces the candidate set: drop the ones not in the new result.
        conn.execute(
            delete(C).where(
                C.c.request_id == request_id,
                C.c.choice_hash.not_in([c.choice_hash for c in candidates]),
            )
        )
        if candidates:
            rows = [_candidate_values(c, i, request_id) for i, c in enumerate(candidates)]
            insert = self._insert(C)
            insert = insert.on_conflict_do_update(
                index_elements=[C.c.request_id, C.c.choice_hash],
                set_={name: insert.excluded[name] for name in rows[0] if name != "choice_hash"},
            )
            conn.execute(insert, rows)
        conn.execute(delete(M).where(M.c.env_id == env_id, M.c.key == result.request.key))

    @_db_errors
    def record_miss(
        self, env: Environment, request: TuningRequest, host: str | None = None
    ) -> None:
        """Log a request the cache could not answer (upsert: count += 1, last_seen = now)."""
        now = utcnow()
        host = socket.gethostname() if host is None else host

        def work(conn: Connection) -> None:
            values = {
                **_request_values(request),
                "env_id": self._env_id_for_write(conn, env),
                "first_seen": now,
                "last_seen": now,
                "count": 1,
                "host": host,
            }
            insert = self._insert(M).values(**values)
            conn.execute(
                insert.on_conflict_do_update(
                    index_elements=[M.c.env_id, M.c.key],
                    set_={
                        "count": M.c.count + 1,
                        "last_seen": insert.excluded.last_seen,
                        "host": insert.excluded.host,
                        "inputs": insert.excluded.inputs,
                        "params": insert.excluded.params,
                        "choice_hashes": insert.excluded.choice_hashes,
                    },
                )
            )

        self._write(work)

    @_db_errors
    def put_kernel_config(self, env: Environment, key: str, value: dict[str, Any]) -> None:
        """Store a data-only config (JSON object) under (env, key), replacing any old one."""
        if not isinstance(value, dict):
            raise TypeError(f"kernel config value must be a dict, got {type(value).__name__}")
        self.put_kernel_configs(env, {key: value})

    @_db_errors
    def prune(
        self,
        torch_version: str | None = None,
        device: str | None = None,
        older_than: timedelta | None = None,
        dry_run: bool = False,
    ) -> int:
        """Remove matching requests (all filters must hold; none given matches all).

        device matches the device name as a case-insensitive substring, or the
        device kind exactly; older_than compares with when the row was last
        written. Misses matching the same filters go too, and environments left
        with nothing in them, and artifacts matching them (see prune_artifacts).
        Returns the number of requests (to be) removed; count artifacts with
        prune_artifacts(..., dry_run=True) first.
        """
        if not dry_run:
            self._require_writable("prune")
        env_ids = _env_filter(torch_version, device)
        cutoff = utcnow() - older_than if older_than is not None else None
        req_where = [R.c.env_id.in_(env_ids)] if env_ids is not None else []
        miss_where = [M.c.env_id.in_(env_ids)] if env_ids is not None else []
        if cutoff is not None:
            req_where.append(R.c.updated_at < cutoff)
            miss_where.append(M.c.last_seen < cutoff)
        count_query = select(func.count()).select_from(R).where(*req_where)
        artifact_where = artifacts_store.filters(torch_version, device, older_than)
        if dry_run:
            return self._read(lambda conn: conn.execute(count_query).scalar_one())

        def work(conn: Connection) -> int:
            removed = conn.execute(count_query).scalar_one()
            conn.execute(delete(C).where(C.c.request_id.in_(select(R.c.id).where(*req_where))))
            conn.execute(delete(R).where(*req_where))
            conn.execute(delete(M).where(*miss_where))
            conn.execute(delete(A).where(*artifact_where))
            conn.execute(
                delete(E).where(
                    *(~sa.exists().where(t.c.env_id == E.c.id) for t in (R, M, K))
                )
            )
            return removed

        removed = self._write(work)
        self._env_ids.clear()
        log.info("pruned %d cached requests", removed)
        return removed

    @_db_errors
    def prune_artifacts(
        self,
        torch_version: str | None = None,
        device: str | None = None,
        older_than: timedelta | None = None,
        dry_run: bool = False,
    ) -> int:
        """Remove matching artifacts only (all filters must hold; none given matches all).

        torch_version matches exactly, device as a case-insensitive substring of
        the artifact's device, older_than compares with when it was written.
        Returns the number of artifacts (to be) removed.
        """
        where = artifacts_store.filters(torch_version, device, older_than)
        if dry_run:
            return self._read(lambda conn: artifacts_store.count(conn, where))
        self._require_writable("prune")
        removed = self._write(lambda conn: artifacts_store.delete(conn, where))
        log.info("pruned %d cached artifacts", removed)
        return removed

    # --------------------------------------------------------------- artifacts

    @_db_errors
    def put_artifact(self, artifact: Artifact) -> bool:
        """Store a compiled artifact unless its (kind, key) is already stored.

        Write once: the first writer wins and the row never changes. Returns
        True when this call wrote it. The signature is stored as given: the store
        never verifies it (readers do, before loading anything).
        """
        self._require_writable()
        values = artifacts_store.row_values(artifact)
        return self._write(lambda conn: artifacts_store.insert_once(conn, self._insert(A), values))

    @_db_errors
    def get_artifact(self, kind: str, key: str) -> Artifact | None:
        """The artifact stored under (kind, key), payload and signature as stored, or None.

        One indexed query; works on read-only stores and with SELECT-only roles.
        """
        return self._read(lambda conn: artifacts_store.get(conn, kind, key))

    @_db_errors
    def has_artifact(self, kind: str, key: str) -> bool:
        """Whether (kind, key) is stored, without reading the payload."""
        return self._read(lambda conn: artifacts_store.exists(conn, kind, key))

    @_db_errors
    def artifacts(
        self,
        kind: str | None = None,
        device: str | None = None,
        signer: str | None = None,
        limit: int | None = 100,
    ) -> list[ArtifactInfo]:
        """Stored artifacts newest first, without payloads.

        device is a case-insensitive substring; signer a key fingerprint, or
        "unsigned"; limit None or 0 lists all.
        """
        return self._read(lambda conn: artifacts_store.list_infos(conn, kind, device, signer, limit))

    def iter_artifacts(self) -> Iterator[Artifact]:
        """Every stored artifact in id order, one query and one payload at a time."""
        last_id = 0
        while (found := self._artifact_after(last_id)) is not None:
            last_id, artifact = found
            yield artifact

    @_db_errors
    def _artifact_after(self, last_id: int) -> tuple[int, Artifact] | None:
        return self._read(lambda conn: artifacts_store.next_after(conn, last_id))

    def _put_artifacts(self, artifacts: Iterable[Artifact]) -> tuple[int, int]:
        """(written, already stored), a bounded batch per transaction."""
        written = skipped = 0
        for batch in artifacts_store.batches(artifacts):
            rows = [artifacts_store.row_values(a) for a in batch]
            done = self._write(
                lambda conn, rows=rows: sum(artifacts_store.insert_once(conn, self._insert(A), r) for r in rows)
            )
            written, skipped = written + done, skipped + len(rows) - done
        return written, skipped

    # ------------------------------------------------------------------- reads

    @_db_errors
    def lookup(self, env: Environment, request_key: str) -> TuningResult | None:
        """The stored result (any status) for (env, request key), or None. Hot path."""
        return self._read(lambda conn: self._lookup(conn, env, request_key))

    def _lookup(self, conn: Connection, env: Environment, key: str) -> TuningResult | None:
        env_key = env.key
        cached = env_key in self._env_ids
        env_id = self._env_id(conn, env, env_key)
        if env_id is None:
            return None
        params = {"env_id": env_id, "key": key}
        if self.dialect == "postgresql":
            row = _pg_lookup_row(conn, params)
            cands: list[Any] = [SimpleNamespace(**c) for c in (row.candidates_json if row else None) or ()]
        else:  # SQLite reads run in one transaction: both queries see one snapshot
            row = conn.execute(_LOOKUP_REQUEST, params).one_or_none()
            cands = [] if row is None else conn.execute(_LOOKUP_CANDIDATES, {"request_id": row.id}).all()
        if row is None:
            if cached:
                # The env may have been pruned and re-created under a new id.
                self._env_ids.pop(env_key, None)
            return None
        return _result_from_rows(env, row, cands)

    @_db_errors
    def get(self, request_id: int) -> TuningResult | None:
        """The result stored under an integer row id (as listed by list_results)."""
        found = self._read(lambda conn: self._results_for(conn, select(R).where(R.c.id == request_id)))
        return found[0][1] if found else None

    @_db_errors
    def list_results(
        self,
        op: str | None = None,
        device: str | None = None,
        limit: int | None = None,
        status: str | None = None,
    ) -> list[tuple[int, TuningResult]]:
        """(row id, result) pairs in id order, optionally filtered."""
        query = select(R).order_by(R.c.id)
        if op:
            query = query.where(R.c.op == op)
        if status:
            query = query.where(R.c.status == status)
        if device:
            query = query.where(R.c.env_id.in_(_env_filter(None, device)))
        if limit:
            query = query.limit(limit)
        return self._read(lambda conn: self._results_for(conn, query))

    def iter_results(self, batch: int = 1000) -> Iterator[tuple[int, TuningResult]]:
        """Every stored result in id order, a batch per query (for export)."""
        last_id = 0
        while rows := self._results_after(last_id, batch):
            yield from rows
            last_id = rows[-1][0]

    @_db_errors
    def _results_after(self, last_id: int, batch: int) -> list[tuple[int, TuningResult]]:
        query = select(R).where(R.c.id > last_id).order_by(R.c.id).limit(batch)
        return self._read(lambda conn: self._results_for(conn, query))

    def _results_for(self, conn: Connection, query: sa.Select[Any]) -> list[tuple[int, TuningResult]]:
        rows = conn.execute(query).all()
        if not rows:
            return []
        env_rows = conn.execute(select(E).where(E.c.id.in_({r.env_id for r in rows}))).all()
        envs = {e.id: _env_from_row(e) for e in env_rows}
        cands: dict[int, list[Any]] = {r.id: [] for r in rows}
        for chunk in _chunks([r.id for r in rows], _BATCH):
            query = select(C).where(C.c.request_id.in_(chunk)).order_by(C.c.request_id, C.c.position)
            for cand in conn.execute(query):
                cands[cand.request_id].append(cand)
        return [(r.id, _result_from_rows(envs[r.env_id], r, cands[r.id])) for r in rows]

    @_db_errors
    def cached_request_keys(self, env: Environment) -> set[str]:
        """Keys of requests stored with status ok for env (work a sweep can skip)."""

        def work(conn: Connection) -> set[str]:
            env_id = self._env_id(conn, env)
            if env_id is None:
                return set()
            query = select(R.c.key).where(R.c.env_id == env_id, R.c.status == STATUS_OK)
            return set(conn.execute(query).scalars())

        return self._read(work)

    @_db_errors
    def misses(self, env: Environment | None = None) -> list[MissRecord]:
        """Logged misses, most frequent first; all environments unless env is given."""

        def work(conn: Connection) -> list[MissRecord]:
            query = select(M).order_by(M.c.count.desc(), M.c.id)
            if env is not None:
                env_id = self._env_id(conn, env)
                if env_id is None:
                    return []
                query = query.where(M.c.env_id == env_id)
            rows = conn.execute(query).all()
            env_rows = conn.execute(select(E).where(E.c.id.in_({r.env_id for r in rows}))).all()
            envs = {e.id: _env_from_row(e) for e in env_rows}
            return [_miss_from_row(envs[r.env_id], r) for r in rows]

        return self._read(work)

    @_db_errors
    def results_for_env(self, env: Environment, status: str | None = STATUS_OK) -> list[TuningResult]:
        """Every result stored for env (status ok unless told), with candidates.

        The warm-start hook reads this once per process to learn which Triton
        configs won, so it can skip generating the ones that lost.
        """

        def work(conn: Connection) -> list[TuningResult]:
            env_id = self._env_id(conn, env)
            if env_id is None:
                return []
            query = select(R).where(R.c.env_id == env_id).order_by(R.c.id)
            if status:
                query = query.where(R.c.status == status)
            return [result for _, result in self._results_for(conn, query)]

        return self._read(work)

    @_db_errors
    def kernel_configs(self, env: Environment, prefix: str = "") -> dict[str, dict[str, Any]]:
        """Every kernel config stored for env whose key starts with prefix."""

        def work(conn: Connection) -> dict[str, dict[str, Any]]:
            env_id = self._env_id(conn, env)
            if env_id is None:
                return {}
            query = select(K.c.key, K.c.value).where(K.c.env_id == env_id)
            if prefix:
                query = query.where(K.c.key.startswith(prefix, autoescape=True))
            return {key: value for key, value in conn.execute(query)}

        return self._read(work)

    @_db_errors
    def put_kernel_configs(self, env: Environment, items: dict[str, dict[str, Any]]) -> int:
        """Store many data-only configs for env in one transaction; returns how many."""
        for key, value in items.items():
            if not isinstance(value, dict):
                raise TypeError(f"kernel config {key!r} must be a dict, got {type(value).__name__}")
        rows = [(key, _json_safe(value, "value")) for key, value in items.items()]
        if not rows:
            return 0

        def work(conn: Connection) -> int:
            env_id = self._env_id_for_write(conn, env)
            now = utcnow()
            for key, value in rows:
                insert = self._insert(K).values(env_id=env_id, key=key, value=value, updated_at=now)
                conn.execute(insert.on_conflict_do_update(
                    index_elements=[K.c.env_id, K.c.key],
                    set_={"value": insert.excluded.value, "updated_at": insert.excluded.updated_at},
                ))
            return len(rows)

        return self._write(work)

    @_db_errors
    def get_kernel_config(self, env: Environment, key: str) -> dict[str, Any] | None:
        def work(conn: Connection) -> dict[str, Any] | None:
            env_id = self._env_id(conn, env)
            if env_id is None:
                return None
            query = select(K.c.value).where(K.c.env_id == env_id, K.c.key == key)
            return conn.execute(query).scalar_one_or_none()

        return self._read(work)

    @_db_errors
    def stats(self) -> dict[str, Any]:
        """Row counts, schema revision, masked URL and size on disk."""

        def work(conn: Connection) -> dict[str, Any]:
            def count(table: sa.Table) -> int:
                return conn.execute(select(func.count()).select_from(table)).scalar_one()

            by_status = dict(conn.execute(select(R.c.status, func.count()).group_by(R.c.status)).all())
            return {
                "url": self.masked_url,
                "backend": self.dialect,
                "schema_revision": schema.current_revision(conn),
                "environments": count(E),
                "requests": sum(by_status.values()),
                "requests_by_status": dict(sorted(by_status.items())),
                "candidates": count(C),
                "misses": count(M),
                "miss_events": conn.execute(select(func.coalesce(func.sum(M.c.count), 0))).scalar_one(),
                "kernel_configs": count(K),
                **artifacts_store.stats(conn),
                "size_bytes": self._size_bytes(conn),
            }

        return self._read(work)

    def _size_bytes(self, conn: Connection) -> int | None:
        if self.dialect == "postgresql":
            size = sa.text("SELECT pg_total_relation_size(CAST(:name AS regclass))")
            return int(sum(conn.execute(size, {"name": t.name}).scalar_one() for t in (E, R, C, M, K, A)))
        path = self._sqlite_path()
        if path is None:
            return None
        files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
        return sum(f.stat().st_size for f in files if f.exists())

    # ----------------------------------------------------------- schema, io

    @_db_errors
    def current_revision(self) -> str | None:
        """The database's schema revision, read without the version check."""
        with self._engine().connect() as conn:
            return schema.current_revision(conn)

    @_db_errors
    def upgrade(self) -> str:
        """Migrate the database to the newest schema; returns that revision."""
        self._require_writable("upgrade")
        engine = self._engine()
        try:
            self._migrate(engine, only_if_empty=False)
        except CommandError as error:
            raise SchemaOutdated(
                f"cannot migrate cache database {self.masked_url}: {_one_line(error)}; "
                "it may come from a newer autotune: upgrade the autotune package"
            ) from error
        self._checked = False
        self._ready()
        return schema.head_revision(self.migrations_dir)

    @_db_errors
    def export_jsonl(self, fp: IO[str]) -> ExportReport:
        """Write a header line, one TuningResult per line, every kernel config, then
        every artifact (read and written one at a time); returns the counts."""
        results = (result for _, result in self.iter_results())
        return jsonl.write(fp, results, self._all_kernel_configs(), self.iter_artifacts())

    def _all_kernel_configs(self) -> list[jsonl.KernelConfig]:
        def work(conn: Connection) -> list[jsonl.KernelConfig]:
            envs = {e.id: _env_from_row(e) for e in conn.execute(select(E))}
            rows = conn.execute(select(K.c.env_id, K.c.key, K.c.value).order_by(K.c.id))
            return [jsonl.KernelConfig(envs[row.env_id], row.key, row.value) for row in rows]

        return self._read(work)

    @_db_errors
    def import_jsonl(self, fp: IO[str]) -> ImportReport:
        """Validate every line, then store the results, kernel configs and artifacts;
        re-importing changes nothing.

        Raises ImportValidationError (line number and problem) before writing
        anything if any line is bad. Artifacts keep their signatures as they are
        (readers verify them); a (kind, key) already stored is left alone.
        """
        self._require_writable("import into")
        with _rewindable(fp) as source:
            start = source.tell()
            contents = jsonl.read(source)
            report = self._import_contents(contents)
            written = skipped = 0
            if contents.artifacts:
                # A second pass: the first one only checked the artifacts, so that
                # at most one payload (tens of MB) is in memory at a time.
                source.seek(start)
                written, skipped = self._put_artifacts(jsonl.read_artifacts(source))
        return dataclasses.replace(report, artifacts=written, artifacts_skipped=skipped)

    def _import_contents(self, contents: jsonl.Contents) -> ImportReport:
        unique = {(r.env.key, r.request.key): r for r in contents.results}
        ordered = [unique[k] for k in sorted(unique)]
        imported = 0
        for batch in _chunks(ordered, _BATCH):
            imported += self._write(lambda conn, batch=batch: self._import_batch(conn, batch))
        by_env: dict[str, tuple[Environment, dict[str, dict[str, Any]]]] = {}
        for config in contents.kernel_configs:
            by_env.setdefault(config.env.key, (config.env, {}))[1][config.key] = config.value
        configs = sum(self.put_kernel_configs(env, items) for env, items in by_env.values())
        return ImportReport(imported=imported, unchanged=len(ordered) - imported, kernel_configs=configs)

    def _import_batch(self, conn: Connection, batch: Sequence[TuningResult]) -> int:
        now, written = utcnow(), 0
        for result in batch:
            existing = self._lookup(conn, result.env, result.request.key)
            if existing is None or not _same(existing, result):
                self._put(conn, result, now)
                written += 1
        return written


# --------------------------------------------------------------------- helpers


def _mask_raw(url: str) -> str:
    """Hide a password in a URL that SQLAlchemy could not parse."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, at, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}{':***' if ':' in creds else ''}@{host}"


def _parse_url(url: str) -> URL:
    hint = "use sqlite:///PATH, a file path, or postgresql://USER@HOST[:PORT]/DB"
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 - a bad port only surfaces when read
    except (exc.ArgumentError, ValueError) as error:
        raise CacheUnavailable(f"malformed cache URL {_mask_raw(url)!r} ({_one_line(error)}); {hint}") from None
    masked = parsed.render_as_string(hide_password=True)
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise CacheUnavailable(f"unsupported cache database {backend!r} in {masked}; {hint}")
    try:
        parsed.get_dialect().import_dbapi()  # a missing driver fails here, not mid-run
    except (exc.NoSuchModuleError, ImportError) as error:
        raise CacheUnavailable(
            f"no database driver for {masked} ({_one_line(error)}); "
            "use postgresql+psycopg:// (psycopg 3) or sqlite:///PATH"
        ) from None
    return parsed


def _pg_lookup_row(conn: Connection, params: dict[str, Any]) -> Any | None:
    """Run the PostgreSQL lookup on the driver's cursor directly.

    SQLAlchemy's per-statement machinery costs about 0.1 ms of CPU here, a third
    of a lookup on the compile-time hot path. Errors still come out as
    SQLAlchemy's exception classes, and a dead connection is invalidated, as
    conn.execute() would do.
    """
    import psycopg  # the postgresql+psycopg dialect has already imported it

    driver = conn.connection.driver_connection
    try:
        with driver.cursor() as cursor:
            cursor.execute(_PG_LOOKUP_SQL, params)
            record = cursor.fetchone()
    except psycopg.Error as error:
        dead = driver.closed or driver.broken
        if dead:
            conn.invalidate(error)
        raise exc.DBAPIError.instance(
            _PG_LOOKUP_SQL, params, error, psycopg.Error, connection_invalidated=dead
        ) from error
    if record is None:
        return None
    row = _PgLookupRow(*record)
    # The driver returns the session's time zone; records use UTC.
    return row._replace(created_at=_utc(row.created_at), updated_at=_utc(row.updated_at))


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _install_sqlite_hooks(engine: Engine, *, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event below issue BEGIN, so writes can use
        # BEGIN IMMEDIATE: a deferred transaction that upgrades to a write lock
        # gets SQLITE_BUSY at once in WAL mode, without waiting busy_timeout.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
            cursor.execute("PRAGMA foreign_keys=ON")
            if wal:  # WAL lets readers run while one process writes (persistent setting)
                _ensure_wal(cursor)
            cursor.execute("PRAGMA synchronous=NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get(_WRITE_OPT, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _ensure_wal(cursor: Any) -> None:
    """Switch the file to WAL once; retry by hand, because SQLite may answer a
    concurrent journal-mode change with "database is locked" at once, without
    waiting busy_timeout (seen when several processes create the cache together)."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            transient = "locked" in str(error) or "busy" in str(error)
            if not transient or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.005, 0.05))


@contextmanager
def _rewindable(fp: IO[str]) -> Iterator[IO[str]]:
    """fp itself if it can seek back, else a temporary copy of it (stdin, a pipe):
    import reads the file twice rather than hold every artifact in memory."""
    try:
        seekable = fp.seekable() and fp.tell() >= 0
    except (OSError, ValueError, AttributeError):
        seekable = False
    if seekable:
        yield fp
        return
    with tempfile.TemporaryFile("w+", encoding="utf-8") as copy:
        shutil.copyfileobj(fp, copy)
        copy.seek(0)
        yield copy


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _env_filter(torch_version: str | None, device: str | None) -> sa.Select[Any] | None:
    """Ids of environments matching the filters, or None when there is no filter."""
    where = []
    if torch_version:
        where.append(E.c.torch_version == torch_version)
    if device:
        needle = device.lower()
        where.append(
            sa.or_(
                func.lower(E.c.device_name).contains(needle, autoescape=True),
                func.lower(E.c.device_kind) == needle,
            )
        )
    return select(E.c.id).where(*where) if where else None


def _json_safe(value: Any, where: str) -> Any:
    """JSON data only: reject other objects, and store non-finite floats as null
    (PostgreSQL's json type has no NaN or Infinity)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        log.warning("cache stores non-finite %s=%r as null", where, value)
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"{where} is a {type(value).__name__}; the cache stores JSON data only")


def _dedupe(candidates: Sequence[CandidateResult]) -> list[CandidateResult]:
    seen: dict[str, CandidateResult] = {}
    for cand in candidates:
        if cand.choice_hash in seen:
            log.warning("duplicate candidate %s in one result; keeping the first", cand.choice_hash)
            continue
        seen[cand.choice_hash] = cand
    return list(seen.values())


def _same(a: TuningResult, b: TuningResult) -> bool:
    """Equal including the fields dataclass equality ignores (params, config)."""
    return (
        a == b
        and a.request.params == b.request.params
        and [c.params for c in a.candidates] == [c.params for c in b.candidates]
    )


def _env_values(env: Environment) -> dict[str, Any]:
    return {
        "key": env.key,
        "device_kind": env.device_kind,
        "device_name": env.device_name,
        "torch_version": env.torch_version,
        "triton_version": env.triton_version,
        "cuda_version": env.cuda_version,
        "system_hash": env.system_hash,
        "config_fingerprint": env.config_fingerprint,
        "config": _json_safe(env.config, "env.config"),
        "created_at": utcnow(),
    }


def _env_from_row(row: Any) -> Environment:
    return Environment(
        device_kind=row.device_kind,
        device_name=row.device_name,
        torch_version=row.torch_version,
        triton_version=row.triton_version,
        cuda_version=row.cuda_version,
        system_hash=row.system_hash,
        config_fingerprint=row.config_fingerprint,
        config=dict(row.config or {}),
    )


def _request_values(request: TuningRequest) -> dict[str, Any]:
    return {
        "key": request.key,
        "op": request.op,
        "inputs_key": request.inputs_key,
        "precision": request.precision,
        "inputs": [layout.to_json() for layout in request.inputs],
        "params": _json_safe(request.params, "request.params"),
        "choice_hashes": list(request.choice_hashes),
    }


def _request_from_row(row: Any) -> TuningRequest:
    # Built directly (not from_json, which sorts) so choice_hashes keep their order.
    return TuningRequest(
        op=row.op,
        inputs_key=row.inputs_key,
        precision=row.precision,
        inputs=tuple(InputLayout.from_json(i) for i in row.inputs or ()),
        params=dict(row.params or {}),
        choice_hashes=tuple(row.choice_hashes or ()),
    )


def _result_values(result: TuningResult, env_id: int, now: datetime) -> dict[str, Any]:
    prov = result.provenance
    return {
        **_request_values(result.request),
        "env_id": env_id,
        "status": result.status,
        "winner_hash": result.winner_hash,
        "validation": _json_safe(result.validation, "validation"),
        "error": result.error,
        "created_at": prov.created_at,
        "updated_at": now,
        "host": prov.host,
        "sweep_id": prov.sweep_id,
        "tuning_seconds": prov.tuning_seconds,
        "source": prov.source,
    }


def _candidate_values(cand: CandidateResult, position: int, request_id: int) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "position": position,
        "choice_hash": cand.choice_hash,
        "kind": cand.kind,
        "name": cand.name,
        "description": cand.description,
        "template_id": cand.template_id,
        "params": _json_safe(cand.params, f"candidate {cand.name} params"),
        "time_ms": cand.time_ms,
        "failure_kind": cand.failure_kind,
        "failure_message": cand.failure_message,
    }


def _candidate_from_row(row: Any) -> CandidateResult:
    return CandidateResult(
        choice_hash=row.choice_hash,
        kind=row.kind,
        name=row.name,
        description=row.description,
        template_id=row.template_id,
        params=dict(row.params or {}),
        time_ms=row.time_ms,
        failure_kind=row.failure_kind,
        failure_message=row.failure_message,
    )


def _result_from_rows(env: Environment, row: Any, cands: Iterable[Any]) -> TuningResult:
    return TuningResult(
        env=env,
        request=_request_from_row(row),
        candidates=tuple(_candidate_from_row(c) for c in cands),
        winner_hash=row.winner_hash,
        status=row.status,
        validation=row.validation,
        error=row.error,
        provenance=Provenance(
            created_at=row.created_at,
            host=row.host,
            sweep_id=row.sweep_id,
            tuning_seconds=row.tuning_seconds,
            source=row.source,
        ),
    )


def _miss_from_row(env: Environment, row: Any) -> MissRecord:
    return MissRecord(
        env=env,
        request=_request_from_row(row),
        first_seen=row.first_seen,
        last_seen=row.last_seen,
        count=row.count,
        host=row.host,
    )
