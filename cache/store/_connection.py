"""StoreBase: engines, transactions, retries and error translation.

Every concern of the store (``_results``, ``_misses``, ...) is a mixin on this
base; ``Store`` (``__init__.py``) composes them. Schema checks and migrations
live in ``_migration``.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import Connection, Engine, exc, text
from sqlalchemy.dialects import postgresql, sqlite

from autotune.cache import schema
from autotune.cache.errors import (
    CacheError,
    CacheUnavailable,
    CacheWriteRefused,
    ReadOnlyError,
    SchemaOutdated,
    one_line,
)
from autotune.cache.store._engine import (
    LOCK_TIMEOUT_S,
    SQLITE_BUSY_TIMEOUT_S,
    STATEMENT_TIMEOUT_S,
    WRITE_OPT,
    install_postgres_timeouts,
    install_sqlite_hooks,
    parse_url,
)
from autotune.cache.url import resolve_cache_url

log = logging.getLogger(__name__)

T = TypeVar("T")
S = TypeVar("S", bound="StoreBase")

# A write that loses a race (SQLite busy, PostgreSQL serialization failure or
# deadlock) or its connection (a server restart) is retried with backoff for
# up to this long; then it fails.
WRITE_RETRY_S = 30.0
# PostgreSQL errors a retry fixes: serialization failure, deadlock detected.
_PG_TRANSIENT = {"40001", "40P01"}
# PostgreSQL classes of "the server is going away or not there yet": admin shutdown,
# starting up, connection failures. A restart shows these for a few seconds.
_PG_RECONNECT_CLASSES = ("08", "57")
# The server gave up on a statement: it waited too long for a lock, or ran too long.
_PG_LOCK_TIMEOUT, _PG_CANCELED = "55P03", "57014"
# Errors that no retry fixes: the write itself is refused.
_PG_REFUSED = {
    "53100": "the database server's disk is full",
    "25006": "the database is in read-only mode",
    "42501": "this database role may not write here",
}
_SQLITE_REFUSED = {
    "database or disk is full": "the disk holding the SQLite file is full",
    "readonly database": "the SQLite file (or its directory) is read-only",
}


def refused_reason(error: BaseException) -> str | None:
    """Why the database refuses this write for good (disk full, read-only,
    no privilege), or None for errors that might pass."""
    orig = getattr(error, "orig", None)
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate in _PG_REFUSED:
        return _PG_REFUSED[sqlstate]
    message = str(orig or error).lower()
    return next((why for needle, why in _SQLITE_REFUSED.items() if needle in message), None)


def db_errors(method: Callable[..., T]) -> Callable[..., T]:
    """Turn driver errors into CacheError subclasses with one-line messages."""

    @functools.wraps(method)
    def wrapper(self: StoreBase, *args: Any, **kwargs: Any) -> T:
        try:
            return method(self, *args, **kwargs)
        except CacheError:
            raise
        except exc.SQLAlchemyError as error:
            raise self._translate(error) from error

    return wrapper


class StoreBase:
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
        statement_timeout: float = STATEMENT_TIMEOUT_S,
        lock_timeout: float = LOCK_TIMEOUT_S,
    ) -> None:
        self.url = resolve_cache_url(url)
        self.read_only = read_only
        self.connect_timeout = connect_timeout
        # PostgreSQL: seconds a statement may run, and wait for a lock (0: no limit); set on
        # every session (_engine.install_postgres_timeouts). SQLite's lock wait is its busy timeout.
        self.statement_timeout = statement_timeout
        self.lock_timeout = lock_timeout
        # A read-only store never creates anything, not even an empty file.
        self.create = create and not read_only
        # Another migration script directory; for tests of schema upgrades.
        self.migrations_dir = str(migrations_dir) if migrations_dir else None
        self._sa_url = parse_url(self.url)
        self._lock = threading.RLock()
        self._engine_obj: Engine | None = None
        self._read_engine: Engine | None = None
        self._pid: int | None = None
        self._checked = False
        self._env_ids: dict[str, int] = {}
        # Write attempts that failed and were retried (benign races, a restarting
        # server); the fault benchmark reports it.
        self.write_retries = 0

    # ------------------------------------------------------------------ basics

    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "read_only": self.read_only,
            "connect_timeout": self.connect_timeout,
            "create": self.create,
            "migrations_dir": self.migrations_dir,
            "statement_timeout": self.statement_timeout,
            "lock_timeout": self.lock_timeout,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        url = state.pop("url")
        self.__init__(url, **state)  # type: ignore[misc]

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "read-write"
        return f"Store({self.masked_url!r}, {mode})"

    def __enter__(self: S) -> S:
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
        engine = sa.create_engine(
            self._sa_url,
            connect_args=connect_args,
            pool_size=8,
            max_overflow=16,
            pool_recycle=3600,
        )
        install_postgres_timeouts(engine, self._sa_url, statement_s=self.statement_timeout, lock_s=self.lock_timeout)
        return engine

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
        install_sqlite_hooks(engine, wal=not self.read_only)
        return engine

    def _check_schema(self, engine: Engine) -> None:
        raise NotImplementedError  # MigrationMixin

    @db_errors
    def connect(self) -> None:
        """Connect and check the schema now rather than at the first read or write."""
        self._ready()

    @db_errors
    def check_writable(self) -> None:
        """Connect, check the schema and try a write that adds nothing, now: a writer (a sweep)
        whose cache cannot be reached or written fails in seconds, before any work."""
        self._require_writable()
        engine = self._ready()
        with engine.connect() as conn:
            conn.execution_options(**{WRITE_OPT: True})
            with conn.begin() as transaction:
                self._guard_schema(conn)
                # Inserts no row, but needs the write lock (SQLite) and the privilege (PostgreSQL).
                conn.execute(text("INSERT INTO requests SELECT * FROM requests WHERE 1 = 0"))
                transaction.rollback()

    def _ready(self) -> Engine:
        """The engine, with the schema version checked once per engine."""
        engine = self._engine()
        if not self._checked:
            with self._lock:
                if not self._checked:
                    self._check_schema(engine)
                    self._checked = True
        return engine

    def _unavailable_message(self, error: BaseException) -> str:
        problem = one_line(error)
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

    def _translate(self, error: exc.SQLAlchemyError) -> CacheError:
        reason = refused_reason(error)
        if reason is not None:
            return CacheWriteRefused(
                f"cannot write to cache database {self.masked_url}: {reason} ({one_line(error)}); "
                "free space, fix its permissions, or use a role that may write"
            )
        gave_up = self._gave_up_message(error)
        if gave_up is not None:
            return CacheUnavailable(gave_up)
        if "file is not a database" in str(getattr(error, "orig", error)):
            return CacheUnavailable(
                f"{self._sqlite_path()} is not an SQLite database (or it is encrypted or damaged); "
                "point --cache or AUTOTUNE_CACHE at a cache file, or move this file away"
            )
        if isinstance(error, (exc.OperationalError, exc.InterfaceError)):
            return CacheUnavailable(self._unavailable_message(error))
        return CacheError(f"cache database error ({self.masked_url}): {one_line(error)}")

    def _gave_up_message(self, error: exc.SQLAlchemyError) -> str | None:
        """The server's statement or lock timeout, in words (None for any other error)."""
        orig = getattr(error, "orig", None)
        sqlstate = getattr(orig, "sqlstate", None)
        if sqlstate == _PG_LOCK_TIMEOUT:
            return (f"cache database {self.masked_url}: a statement waited more than {self.lock_timeout:g} s for a "
                    f"lock another session holds ({one_line(error)}); find that session in pg_locks and "
                    "pg_stat_activity, or wait for it to end")
        if sqlstate == _PG_CANCELED and "statement timeout" in str(orig):  # not a cancel by hand
            return (f"cache database {self.masked_url}: a statement ran longer than {self.statement_timeout:g} s "
                    f"({one_line(error)}); the server is overloaded or stalled: check it, then run again")
        return None

    def _require_writable(self, what: str = "write to") -> None:
        if self.read_only:
            raise ReadOnlyError(f"cannot {what} the cache: this store was opened read-only")

    def _write(self, work: Callable[[Connection], T]) -> T:
        """Run work(conn) in one write transaction, retrying benign races and a
        lost server (with backoff, for up to WRITE_RETRY_S)."""
        self._require_writable()
        engine = self._ready()
        deadline = time.monotonic() + WRITE_RETRY_S
        attempt = 0
        while True:
            attempt += 1
            try:
                with engine.connect() as conn:
                    conn.execution_options(**{WRITE_OPT: True})
                    with conn.begin():
                        self._guard_schema(conn)
                        return work(conn)
            except exc.IntegrityError:
                # A racing writer, or an env id cached before someone pruned it:
                # re-resolve ids and try once more; a second one is a real error.
                self._env_ids.clear()
                if attempt >= 2:
                    raise
            except exc.DBAPIError as error:
                if not self._transient(error) or time.monotonic() > deadline:
                    raise
                log.info("cache write failed (%s); retrying", one_line(error))
            self.write_retries += 1
            time.sleep(random.uniform(0.5, 1.0) * min(0.02 * 2**attempt, 2.0))

    def _guard_schema(self, conn: Connection) -> None:
        """Never write into a schema other than the one this code knows.

        The version is read inside the write transaction. On PostgreSQL a shared
        advisory lock also waits for a migration in progress (which holds it
        exclusively) and keeps one from starting until this transaction ends.
        """
        if self.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock_shared(:k)"), {"k": schema.PG_MIGRATION_LOCK})
        revision = schema.current_revision(conn)
        head = schema.head_revision(self.migrations_dir)
        if revision != head:
            self._checked = False
            raise SchemaOutdated(
                f"cache database {self.masked_url} changed to schema revision {revision} while this "
                f"process ran (this autotune writes {head}); nothing was written: upgrade the autotune package"
            )

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
                log.info("cache connection lost (%s); retrying on a new one", one_line(error))
        raise AssertionError("unreachable")

    def _transient(self, error: exc.DBAPIError) -> bool:
        if error.connection_invalidated:
            return True
        if self.dialect == "sqlite":
            message = str(error.orig).lower()
            return "locked" in message or "busy" in message
        sqlstate = getattr(error.orig, "sqlstate", None)
        if sqlstate in _PG_TRANSIENT:
            return True
        if sqlstate == _PG_CANCELED:  # the statement timeout: the same statement would time out again
            return False
        # No connection at all (sqlstate None: refused, reset) or the server going down.
        reconnect = sqlstate is None or sqlstate.startswith(_PG_RECONNECT_CLASSES)
        return isinstance(error, exc.OperationalError) and reconnect

    def _insert(self, table: sa.Table) -> Any:
        dialect = postgresql if self.dialect == "postgresql" else sqlite
        return dialect.insert(table)
