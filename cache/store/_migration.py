"""Schema checks and migrations: safe on first use by many processes at once.

Creating the schema and stamping its version happen in one transaction, under
the migration lock (a PostgreSQL advisory lock; on SQLite the exclusive write
lock of BEGIN IMMEDIATE). A process that finds the schema missing or not at
head looks again holding that lock, so it waits for a migration in progress
(up to MIGRATION_WAIT_S) and then sees its result, never the half-way state.
A schema newer than this code is refused, and ``StoreBase._guard_schema``
re-checks the version inside every write transaction.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, exc

from autotune.cache import schema
from autotune.cache.errors import CacheUnavailable, SchemaOutdated, one_line
from autotune.cache.store._connection import StoreBase, db_errors
from autotune.cache.store._engine import SQLITE_BUSY_TIMEOUT_S, WRITE_OPT

log = logging.getLogger(__name__)

# How long a process waits for another one's migration before it gives up.
MIGRATION_WAIT_S = 120.0


class MigrationMixin(StoreBase):
    def _check_schema(self, engine: Engine) -> None:
        head = schema.head_revision(self.migrations_dir)
        with engine.connect() as conn:
            revision = schema.current_revision(conn)
        if revision == head:
            return  # the version row commits with the tables: they are all there
        self._refuse_unknown(revision, head)
        # Empty, older, or being created by another process right now: look again
        # under the lock, which waits for that migration to commit.
        with self._migration_lock(engine, write=self.create) as conn:
            revision = schema.current_revision(conn)
            if revision == head:
                return
            if revision is not None or schema.has_cache_tables(conn):
                raise self._schema_error(revision, head)
            if not self.create:
                raise SchemaOutdated(
                    f"cache database {self.masked_url} has no autotune schema yet; "
                    "create it with `autotune cache upgrade`"
                )
            schema.upgrade(conn, self.migrations_dir)

    @contextmanager
    def _migration_lock(self, engine: Engine, *, write: bool) -> Iterator[Connection]:
        """A connection in a transaction that holds the migration lock (bounded wait);
        the transaction commits when the block ends without an error."""
        deadline = time.monotonic() + MIGRATION_WAIT_S
        while True:
            conn = engine.connect()
            try:
                conn.execution_options(**{WRITE_OPT: write})
                if self.dialect == "sqlite":  # BEGIN IMMEDIATE waits busy_timeout: bound it too
                    _busy_timeout(conn, min(SQLITE_BUSY_TIMEOUT_S, max(0.1, deadline - time.monotonic())))
                transaction = conn.begin()
                schema.lock_for_migration(conn, MIGRATION_WAIT_S)
                break
            except exc.OperationalError as error:
                conn.close()
                # SQLite: BEGIN IMMEDIATE gave up after busy_timeout; try until the deadline.
                locked = self.dialect == "sqlite" and "locked" in str(error.orig)
                if not (locked and time.monotonic() < deadline):
                    raise self._lock_error(error) from error
                time.sleep(random.uniform(0.05, 0.2))
            except BaseException:
                conn.close()
                raise
        try:
            with transaction:
                yield conn
        finally:
            if self.dialect == "sqlite":
                _busy_timeout(conn, SQLITE_BUSY_TIMEOUT_S)
            conn.close()

    def _lock_error(self, error: exc.OperationalError) -> CacheUnavailable:
        if schema.lock_timed_out(error) or "locked" in str(error.orig):
            return CacheUnavailable(
                f"cache database {self.masked_url}: another process has been creating or migrating "
                f"the schema for more than {MIGRATION_WAIT_S:.0f} s; wait for it, or stop it and "
                "run `autotune cache upgrade`"
            )
        return CacheUnavailable(self._unavailable_message(error))

    def _refuse_unknown(self, revision: str | None, head: str) -> None:
        if revision is not None and revision not in schema.known_revisions(self.migrations_dir):
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
                f"(head {head}); upgrade the autotune package (this one never writes to it)"
            )
        return SchemaOutdated(
            f"{where} is at schema revision {revision} but this autotune needs {head}; "
            "run `autotune cache upgrade` to migrate it"
        )

    # ------------------------------------------------------------------ public

    @db_errors
    def current_revision(self) -> str | None:
        """The database's schema revision, read without the version check."""
        with self._engine().connect() as conn:
            return schema.current_revision(conn)

    @db_errors
    def upgrade(self) -> str:
        """Migrate the database to the newest schema; returns that revision."""
        self._require_writable("upgrade")
        head = schema.head_revision(self.migrations_dir)
        with self._migration_lock(self._engine(), write=True) as conn:
            revision = schema.current_revision(conn)
            self._refuse_unknown(revision, head)
            if revision is None and schema.has_cache_tables(conn):
                raise self._schema_error(revision, head)
            from alembic.util import CommandError

            try:
                schema.upgrade(conn, self.migrations_dir)
            except CommandError as error:
                raise SchemaOutdated(
                    f"cannot migrate cache database {self.masked_url}: {one_line(error)}; "
                    "it may come from a newer autotune: upgrade the autotune package"
                ) from error
        self._checked = False
        self._ready()
        return head


def _busy_timeout(conn: Connection, seconds: float) -> None:
    # On the driver's connection: through SQLAlchemy the PRAGMA would begin a transaction.
    driver: Any = conn.connection.driver_connection
    driver.execute(f"PRAGMA busy_timeout={int(seconds * 1000)}")
