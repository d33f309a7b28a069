"""Fixtures: a fresh SQLite file or PostgreSQL schema per test, on both backends.

PostgreSQL comes from $AUTOTUNE_TEST_POSTGRES (default: the local server's
`test` database). Each session creates its own scratch database from it and
drops it at the end; each test gets its own schema inside it, selected with
``?options=-csearch_path=...`` (which also exercises that URL form). If the
server cannot be reached the PostgreSQL tests are skipped, except on CI
(``$CI`` set) where that is a failure.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/factories.py

from private_postgres import PrivatePostgres  # noqa: E402
from private_postgres import unavailable as private_postgres_unavailable  # noqa: E402

from autotune.cache import Store  # noqa: E402

# Inductor checks each vector ISA by loading a probe library in a fresh Python under a time limit.
# On a loaded 2-core CI host the probe timed out in a warm job, which then picked a narrower ISA
# than the sweep it warm-started from: another environment key, and every lookup missed. The
# tests trust the CPU's flags, as TORCHINDUCTOR_VEC_ISA_OK=1 lets a user (docs/troubleshooting.md).
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

TINY = str(Path(__file__).resolve().parent / "models" / "tiny_mlp.py")
REPO = Path(__file__).resolve().parents[1]

ADMIN_URL = os.environ.get(
    "AUTOTUNE_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def _admin_engine(database: str | None = None) -> sa.Engine:
    url = sa.make_url(ADMIN_URL)
    if database:
        url = url.set(database=database)
    return sa.create_engine(
        url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}, poolclass=sa.NullPool
    )


@pytest.fixture(scope="session")
def _pg_database() -> Iterator[sa.URL]:
    admin = _admin_engine()
    name = f"autotune_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except sa.exc.OperationalError as error:
        reason = f"PostgreSQL not reachable at {ADMIN_URL}: {str(error.orig).splitlines()[0]}"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set, so a missing PostgreSQL is a failure)")
        print(f"\nskipping PostgreSQL tests: {reason}", file=sys.stderr)
        pytest.skip(reason)
    try:
        yield sa.make_url(ADMIN_URL).set(database=name)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def postgres_url(_pg_database: sa.URL) -> Iterator[str]:
    """A fresh, empty schema in the session's scratch database."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    engine = _admin_engine(_pg_database.database)
    with engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    base = _pg_database.render_as_string(hide_password=False)
    yield f"{base}?options=-csearch_path%3D{schema}"
    with engine.connect() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
    engine.dispose()


@pytest.fixture
def readonly_postgres_url(postgres_url: str, _pg_database: sa.URL) -> Iterator[tuple[str, str]]:
    """(writer_url, reader_url) for one fresh schema, already migrated to head.

    The writer is the admin user; the reader logs in as a new role that may only
    SELECT in that schema (as a training job's credentials would), including
    tables a later migration creates. The role is dropped at teardown.
    """
    schema = sa.make_url(postgres_url).query["options"].split("=", 1)[1]
    role = f"autotune_ro_{uuid.uuid4().hex[:12]}"
    with Store(postgres_url) as writer:
        writer.upgrade()
    engine = _admin_engine(_pg_database.database)
    with engine.connect() as conn:
        for statement in (
            f'CREATE ROLE "{role}" LOGIN',
            f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"',
            f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"',
            f'ALTER DEFAULT PRIVILEGES IN SCHEMA "{schema}" GRANT SELECT ON TABLES TO "{role}"',
        ):
            conn.exec_driver_sql(statement)
    reader = _pg_database.set(username=role, password=None).render_as_string(hide_password=False)
    try:
        yield postgres_url, f"{reader}?options=-csearch_path%3D{schema}"
    finally:
        with engine.connect() as conn:
            # A store the test left open still holds the role's sessions; DROP ROLE would fail.
            conn.exec_driver_sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
            conn.exec_driver_sql(f'REASSIGN OWNED BY "{role}" TO CURRENT_USER')
            conn.exec_driver_sql(f'DROP OWNED BY "{role}"')  # its grants and default privileges
            conn.exec_driver_sql(f'DROP ROLE "{role}"')
        engine.dispose()


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL cluster of this test's own (tests/private_postgres.py), started: a test that
    stops or restarts a server stops this one, never the shared one. Skipped, with the reason
    printed, where no cluster can start here (no server binaries, or root without a postgres user)."""
    why = private_postgres_unavailable()
    if why is not None:
        print(f"\nskipping: no private PostgreSQL cluster: {why}", file=sys.stderr)
        pytest.skip(f"no private PostgreSQL cluster: {why}")
    with PrivatePostgres() as cluster:
        cluster.start()
        yield cluster


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cache' / 'cache.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with Store(store_url) as s:
        yield s


@pytest.fixture(autouse=True)
def _no_ambient_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Never touch the developer's real cache: no $AUTOTUNE_CACHE, a private XDG dir."""
    monkeypatch.delenv("AUTOTUNE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    # A second sweep in a test must find what the first stored, however busy the host was
    # for either: retiming is tested where it is asked for (tests/test_noise_load.py).
    monkeypatch.setenv("AUTOTUNE_RETIME_BUSY", "0")


@pytest.fixture(scope="session", autouse=True)
def _shared_compiled_kernels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One directory of compiled kernels for the session's hook jobs (tests/hook_job.py says
    what is shared and what is not); shared by the xdist workers of one run."""
    directory = _run_root(tmp_path_factory) / "shared-kernels"
    directory.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AUTOTUNE_TEST_SHARED_KERNELS", str(directory))
        yield


@pytest.fixture(scope="session", autouse=True)
def _cached_cxx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """``CXX`` for every process the tests start: g++ behind a cache of identical compiles,
    shared by the xdist workers of one run (tests/tools/cached_cxx.py says why and what is
    keyed). AUTOTUNE_TEST_NO_CXX_CACHE=1 compiles everything afresh."""
    # A pytest started by a test (its CXX is the shim already) keeps the compiler behind it
    real = os.environ.get("AUTOTUNE_TEST_REAL_CXX") or shutil.which(os.environ.get("CXX", "g++"))
    if real is None or os.environ.get("AUTOTUNE_TEST_NO_CXX_CACHE") == "1":
        yield
        return
    root = _run_root(tmp_path_factory)
    shim = root / "cxx" / "g++"  # Inductor tells gcc from clang by the compiler's name
    if not shim.exists():
        shim.parent.mkdir(exist_ok=True)
        partial = shim.with_suffix(f".{os.getpid()}")
        partial.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "{REPO / "tests" / "tools" / "cached_cxx.py"}" '
                           f'"{root / "cxx-cache"}" "{real}" "$@"\n')
        partial.chmod(0o755)
        partial.replace(shim)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CXX", str(shim))
        patch.setenv("AUTOTUNE_TEST_REAL_CXX", real)
        yield


@pytest.fixture
def uncached_cxx(monkeypatch: pytest.MonkeyPatch) -> None:
    """g++ itself for this test's processes: a test that kills a tuning child mid-benchmark
    needs each compile to take its real time (from the cache, a job is done before the kill)."""
    real = os.environ.get("AUTOTUNE_TEST_REAL_CXX")
    if real:
        monkeypatch.setenv("CXX", real)


# ------------------------------------------------------------ one signed sweep per run


def _run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of this pytest run that all its xdist workers share."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def _once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[Path, bool]]:
    """``(directory, made)``: a directory shared by every xdist worker of this run. The first
    worker to get here makes its content (``made`` False: fill it); the others wait for it
    and reuse it. The suite's modules that share a sweep then run on several workers at
    once without each sweeping again (a signed CPU sweep costs a minute or more)."""
    root = _run_root(tmp_path_factory)
    directory, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = done.exists()
        directory.mkdir(exist_ok=True)
        yield directory, made
        done.touch()  # not reached when making it failed: the next worker tries and says why


@pytest.fixture(scope="session")
def signing_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A trusted writer's key pair and a stranger's, from `autotune keys new`; one pair per
    run, since the shared signed sweep below is signed with it."""
    from click.testing import CliRunner

    from autotune import cli

    with _once_per_run(tmp_path_factory, "keys") as (root, made):
        for name in ("writer", "stranger") if not made else ():
            result = CliRunner().invoke(cli.main, ["keys", "new", str(root / name)])
            assert result.exit_code == 0, result.output
    return {"writer": root / "writer", "writer.pub": root / "writer.pub",
            "stranger": root / "stranger", "stranger.pub": root / "stranger.pub"}


@pytest.fixture(scope="session")
def _signed_tiny_cache(tmp_path_factory: pytest.TempPathFactory, signing_keys: dict[str, Path]) -> Path:
    """`autotune sweep --signing-key` of tests/models/tiny_mlp.py into SQLite, once per
    run (a CPU sweep is about a minute): winners and signed artifacts. Tests get copies."""
    with _once_per_run(tmp_path_factory, "signed") as (directory, made):
        path = directory / "cache.db"
        if not made:
            proc = subprocess.run([sys.executable, "-m", "autotune.cli", "sweep", TINY, "--device", "cpu",
                                   "--cache", f"sqlite:///{path}", "--signing-key", str(signing_keys["writer"])],
                                  capture_output=True, text=True, timeout=600, cwd=REPO)
            assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
            assert "2 tuned" in proc.stdout and "signed artifacts published" in proc.stdout, proc.stdout
            (directory / "sweep.stdout").write_text(proc.stdout)  # what its terminal showed (test_cli_sweep.py)
            (directory / "sweep.stderr").write_text(proc.stderr)
    return path


def env_without(module: str, directory: Path) -> dict[str, str]:
    """The environment of a process in which ``import MODULE`` fails as it does where MODULE is
    not installed (the lean install: no Ray, no psycopg): a package of that name, first on
    PYTHONPATH, that raises the same ImportError."""
    package = directory / "without" / module
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(f"raise ModuleNotFoundError({f'No module named {module!r}'!r}, name={module!r})\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(package.parent), os.environ.get("PYTHONPATH")]))}


def dynamic_sweep(model: str, directory: Path) -> str:
    """`autotune sweep MODEL --dynamic` on CPU into a new SQLite file in ``directory``; its URL."""
    url = f"sqlite:///{directory / 'cache.db'}"
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", "sweep", model, "--device", "cpu", "--cache", url,
                           "--dynamic", "--json"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return url


def copy_sqlite(source: Path, target: Path) -> str:
    """A consistent copy of a SQLite cache (its WAL included), as a URL."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    return f"sqlite:///{target}"


@pytest.fixture(scope="module")
def signed_tiny_sweep(_signed_tiny_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """This module's own copy of the session's signed sweep of the tiny model."""
    return copy_sqlite(_signed_tiny_cache, tmp_path_factory.mktemp("swept") / "cache.db")


# ------------------------------------------------------------ the full suite and CI's


FULL_SUITE = os.environ.get("AUTOTUNE_TEST_FULL") == "1"
SLOW_REASON = ("slow: a scenario another test covers in part; runs in the full suite "
               "(AUTOTUNE_TEST_FULL=1 python -m pytest tests -n 2 --dist loadgroup), not in CI's 15 minutes")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` are skipped, with the reason printed, unless AUTOTUNE_TEST_FULL=1."""
    if FULL_SUITE:
        return
    skip = pytest.mark.skip(reason=SLOW_REASON)
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)
