"""First use and upgrades under concurrency: the migration lock, its bounded wait,
and refusing a schema newer than the code, on both backends."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import _admin_engine
from factories import make_env, make_result

from autotune.cache import CacheUnavailable, SchemaOutdated, Store, schema
from autotune.cache.store import _migration

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_pg_database(_pg_database: sa.URL) -> Iterator[str]:
    """A new, empty PostgreSQL database (not a schema): the very first use of a team cache."""
    name = f"autotune_fresh_{uuid.uuid4().hex[:10]}"
    admin = _admin_engine()
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield _pg_database.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def _export_file(tmp_path: Path, count: int = 40) -> Path:
    path = tmp_path / "seed.jsonl"
    with Store(str(tmp_path / "seed.db")) as seed:
        seed.put_results(make_result(m=16 * (i + 1)) for i in range(count))
        with path.open("w") as fp:
            seed.export_jsonl(fp)
    return path


def test_six_importers_into_a_fresh_postgres_database(fresh_pg_database: str, tmp_path: Path) -> None:
    """The issue's first-use race: six `autotune cache import` at once into an empty database."""
    path = _export_file(tmp_path)
    command = [sys.executable, "-m", "autotune.cli", "cache", "--cache", fresh_pg_database, "import", str(path)]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(6)]
    outcomes = [(p.wait(timeout=180), p.stderr.read() if p.stderr else "") for p in procs]
    assert [code for code, _ in outcomes] == [0] * 6, outcomes
    with Store(fresh_pg_database, read_only=True) as store:
        stats = store.stats()
    assert stats["requests"] == 40 and stats["schema_revision"] == schema.head_revision()


def test_first_use_waits_for_a_migration_in_progress(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """While another process holds the migration lock with the schema half-made, a new
    store waits; once that commits, it goes on with the finished schema."""
    monkeypatch.setattr(_migration, "MIGRATION_WAIT_S", 20.0)
    other = Store(store_url)
    engine = other._engine()
    with engine.connect() as conn:
        conn.execution_options(autotune_write=True)
        with conn.begin():
            schema.lock_for_migration(conn, 5.0)
            schema.upgrade(conn)  # tables and version exist, not yet committed
            done: list[BaseException | None] = []
            waiter = threading.Thread(target=lambda: done.append(_connect(store_url)))
            waiter.start()
            time.sleep(1.0)
            assert waiter.is_alive(), "the store did not wait for the migration in progress"
        waiter.join(timeout=30)
    assert done == [None]
    other.close()


def _connect(url: str) -> BaseException | None:
    try:
        with Store(url) as store:
            store.put_result(make_result())
        return None
    except BaseException as error:  # handed to the test's thread
        return error


def test_a_stuck_migration_is_waited_for_only_so_long(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_migration, "MIGRATION_WAIT_S", 1.0)
    engine = Store(store_url)._engine()
    with engine.connect() as conn:
        conn.execution_options(autotune_write=True)
        with conn.begin():
            schema.lock_for_migration(conn, 5.0)
            started = time.monotonic()
            with pytest.raises(CacheUnavailable, match="creating or migrating the schema") as error:
                Store(store_url).connect()
            assert "\n" not in str(error.value)
            assert time.monotonic() - started < 10
            conn.rollback()
    engine.dispose()


def _stamp(url: str, revision: str) -> None:
    with Store(url)._engine().begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = :r"), {"r": revision})


def test_a_newer_schema_is_refused_and_never_written(store_url: str) -> None:
    with Store(store_url) as store:
        store.put_result(make_result(m=1))
        _stamp(store_url, "0099_future")
        # A process already running when a newer autotune migrated: its writes stop.
        with pytest.raises(SchemaOutdated, match="changed to schema revision 0099_future"):
            store.put_result(make_result(m=2))
    for opened in (Store(store_url), Store(store_url, read_only=True)):
        with pytest.raises(SchemaOutdated, match="newer than this autotune knows"):
            opened.connect()
        opened.close()
    with pytest.raises(SchemaOutdated, match="newer than this autotune knows"):
        Store(store_url).upgrade()
    _stamp(store_url, schema.head_revision())
    with Store(store_url) as store:
        keys = {r.request.key for _, r in store.list_results()}
    assert keys == {make_result(m=1).request.key}  # the refused write left nothing


def test_tables_without_a_version_are_refused(store_url: str) -> None:
    with Store(store_url) as store:
        store.connect()
    with Store(store_url)._engine().begin() as conn:
        conn.execute(sa.text("DELETE FROM alembic_version"))
    with pytest.raises(SchemaOutdated, match="no schema version"):
        Store(store_url).lookup(make_env(), "k")


def test_the_head_readers_check_against_is_the_migration_scripts_head() -> None:
    """Readers compare with schema.HEAD_REVISION (no Alembic import on a job's path);
    it must name the newest script, or every reader would refuse a current database."""
    assert schema.HEAD_REVISION == schema.scripted_head(schema.MIGRATIONS_DIR)


def test_opening_a_store_to_read_imports_no_alembic(tmp_path: Path) -> None:
    """A warm start's first lookup pays for the store's imports within the lookup timeout."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with Store(url) as store:
        store.upgrade()
    probe = ("import sys; from autotune.cache.store import Store; s = Store(sys.argv[1], read_only=True); "
             "s.stats(); print(sorted(m for m in sys.modules if m.startswith('alembic')))")
    done = subprocess.run([sys.executable, "-c", probe, url], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
