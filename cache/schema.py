"""Schema versioning: Alembic driven from code (no alembic.ini at runtime)."""

from __future__ import annotations

import functools
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text

if TYPE_CHECKING:
    from alembic.config import Config

from autotune.cache import models

log = logging.getLogger(__name__)
_UPGRADE_LOCK = threading.Lock()  # see upgrade()

VERSION_TABLE = "alembic_version"
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# Any 64-bit constant: serialises concurrent migrations on one PostgreSQL database.
# Migrations take it exclusively, writers shared (see StoreBase._guard_schema).
PG_MIGRATION_LOCK = 0x6175746F74756E65  # "autotune"
_PG_LOCK_NOT_AVAILABLE = "55P03"


# The newest revision in cache/migrations/versions, known without Alembic: every job's
# warm start checks the schema, and importing Alembic and parsing the version scripts
# there cost seconds on a busy node (past the hook's lookup timeout). A test keeps it
# equal to the scripts' head; Alembic is imported only to migrate.
HEAD_REVISION = "0005"


def alembic_config(migrations_dir: str | Path | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir or MIGRATIONS_DIR))
    return cfg


def head_revision(migrations_dir: str | None = None) -> str:
    if migrations_dir is None or Path(migrations_dir).resolve() == MIGRATIONS_DIR:
        return HEAD_REVISION
    return scripted_head(migrations_dir)


@functools.lru_cache(maxsize=8)
def scripted_head(migrations_dir: str | Path | None = None) -> str:
    """The head revision as Alembic reads it from the version scripts."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(alembic_config(migrations_dir)).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"expected one migration head, found {heads}")
    return heads[0]


@functools.lru_cache(maxsize=8)
def known_revisions(migrations_dir: str | None = None) -> frozenset[str]:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config(migrations_dir))
    return frozenset(rev.revision for rev in script.walk_revisions())


def current_revision(conn: Connection) -> str | None:
    # Read the version table directly: MigrationContext.configure() is slower and
    # logs at INFO on every call, and this runs once per Store.
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    versions = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    return versions[0] if len(versions) == 1 else None


def has_cache_tables(conn: Connection) -> bool:
    names = set(inspect(conn).get_table_names())
    return bool(names & set(models.metadata.tables))


def lock_for_migration(conn: Connection, wait_s: float) -> None:
    """Take the database-wide migration lock for the rest of conn's transaction,
    waiting at most wait_s for a migration in progress (then lock_timed_out(error)).

    SQLite needs nothing here: the store opens writing transactions with
    BEGIN IMMEDIATE, which already excludes every other writer.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text(f"SET LOCAL lock_timeout = {int(wait_s * 1000)}"))
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_MIGRATION_LOCK})
        # The migration itself may take its time: neither the session's lock timeout nor its
        # statement timeout (cache/store/_engine.py) applies to it.
        conn.execute(text("SET LOCAL lock_timeout = 0"))
        conn.execute(text("SET LOCAL statement_timeout = 0"))


def lock_timed_out(error: BaseException) -> bool:
    return getattr(getattr(error, "orig", None), "sqlstate", None) == _PG_LOCK_NOT_AVAILABLE


def upgrade(conn: Connection, migrations_dir: str | None = None, target: str = "head") -> None:
    """Migrate to target inside conn's current transaction (caller commits)."""
    from alembic import command

    cfg = alembic_config(migrations_dir)
    cfg.attributes["connection"] = conn
    log.info("migrating cache schema from %s to %s", current_revision(conn), target)
    # Alembic's EnvironmentContext installs and removes module-global proxies: two migrations
    # at once in one process (a job's prefetch thread and its script's thread, each opening a
    # fresh cache) removed each other's and failed with KeyError.
    with _UPGRADE_LOCK:
        command.upgrade(cfg, target)
