"""Engines: parsing the cache URL and the SQLite connection settings.

Plain functions; StoreBase (``_connection.py``) owns the engines they build.
"""

from __future__ import annotations

import random
import sqlite3
import time
from typing import Any

from sqlalchemy import Connection, Engine, event, exc
from sqlalchemy.engine import URL, make_url

from autotune.cache.errors import CacheUnavailable, one_line

SQLITE_BUSY_TIMEOUT_S = 30.0
# PostgreSQL, every session of the store (the CLI's, a sweep's): how long one statement may wait
# for a lock (SQLite's busy timeout plays this part there: the same 30 s), and how long it may run
# in all. No statement of ours runs for minutes (an import and a prune work in batches of rows);
# a schema migration lifts both for its own transaction (cache/schema.py). A job's store sets
# both from its lookup timeout (autotune/job/serve_policy.py).
LOCK_TIMEOUT_S = SQLITE_BUSY_TIMEOUT_S
STATEMENT_TIMEOUT_S = 300.0
WRITE_OPT = "autotune_write"  # execution option: open the transaction for writing


def _mask_raw(url: str) -> str:
    """Hide a password in a URL that SQLAlchemy could not parse."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, at, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}{':***' if ':' in creds else ''}@{host}"


def parse_url(url: str) -> URL:
    hint = "use sqlite:///PATH, a file path, or postgresql://USER@HOST[:PORT]/DB"
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 - a bad port only surfaces when read
    except (exc.ArgumentError, ValueError) as error:
        raise CacheUnavailable(f"malformed cache URL {_mask_raw(url)!r} ({one_line(error)}); {hint}") from None
    masked = parsed.render_as_string(hide_password=True)
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise CacheUnavailable(f"unsupported cache database {backend!r} in {masked}; {hint}")
    try:
        parsed.get_dialect().import_dbapi()  # a missing driver fails here, not mid-run
    except (exc.NoSuchModuleError, ImportError) as error:
        if backend == "postgresql" and parsed.get_driver_name() == "psycopg":
            raise CacheUnavailable(
                f"psycopg is not installed, and {masked} needs it: pip install 'inductor-autotune[postgres]'"
            ) from None
        raise CacheUnavailable(
            f"no database driver for {masked} ({one_line(error)}); "
            "use postgresql+psycopg:// (psycopg 3) or sqlite:///PATH"
        ) from None
    return parsed


def install_postgres_timeouts(engine: Engine, url: URL, *, statement_s: float, lock_s: float) -> None:
    """Give every new session a statement and a lock timeout (0: none), so that a stalled server
    (a table lock another session holds, a query that never ends) frees the session and its
    thread: set once per connection, in one round trip. A timeout the URL already sets (its
    ``options``, e.g. ``?options=-c%20lock_timeout%3D5s``) is left to the URL."""
    given = " ".join(_options(url))
    wanted = {name: f"{int(seconds * 1000)}ms" for name, seconds in
              (("statement_timeout", statement_s), ("lock_timeout", lock_s)) if name not in given}
    if not wanted:
        return
    query = "SELECT " + ", ".join(f"set_config('{name}', %s, false)" for name in wanted)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        autocommit = dbapi_conn.autocommit
        dbapi_conn.autocommit = True  # a session setting, not one a rolled-back transaction undoes
        try:
            dbapi_conn.execute(query, tuple(wanted.values()))
        finally:
            dbapi_conn.autocommit = autocommit


def _options(url: URL) -> tuple[str, ...]:
    given = url.query.get("options", ())
    return (given,) if isinstance(given, str) else tuple(given)


def install_sqlite_hooks(engine: Engine, *, wal: bool) -> None:
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
        write = conn.get_execution_options().get(WRITE_OPT, False)
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
