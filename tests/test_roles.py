"""Least privilege, for real: the role SQL of docs/operations.md, run as written in the local
PostgreSQL, and what each role can and cannot do through the store and the hook."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import _admin_engine
from factories import make_env, make_request, make_result
from test_hook import job

from autotune.cache import CacheWriteRefused, Store

OPERATIONS = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
ROLES = ("autotune_sweep", "autotune_job", "autotune_writeback")


def roles_sql() -> str:
    text = OPERATIONS.read_text()
    block = re.search(r"<!-- roles-sql: begin -->\s*```sql\n(.*?)```\s*<!-- roles-sql: end -->", text, re.S)
    assert block, "docs/operations.md lost its roles-sql block"
    return block.group(1)


def _statements(sql: str) -> list[str]:
    """Statements and psql's \\connect lines, comments dropped."""
    out, current = [], ""
    for line in sql.splitlines():
        line = line.split("--", 1)[0].rstrip()
        if line.startswith("\\connect"):
            out.append(line)
        elif line:
            current += " " + line.strip()
            if current.endswith(";"):
                out.append(current.strip())
                current = ""
    return out


@pytest.fixture(scope="module")
def roles(_pg_database: sa.URL) -> Iterator[dict[str, str]]:
    """Run the documented SQL with unique role and database names; yield each role's URL."""
    suffix = uuid.uuid4().hex[:8]
    names = {role: f"{role}_{suffix}" for role in ROLES}
    database = f"kernels_{suffix}"
    sql = roles_sql()
    for role, name in names.items():
        sql = re.sub(rf"\b{role}\b", name, sql)
    sql = re.sub(r"\bkernels\b", database, sql)
    engine = _admin_engine()
    try:
        for statement in _statements(sql):
            if statement.startswith("\\connect"):
                engine.dispose()
                engine = _admin_engine(statement.split()[1])
                continue
            with engine.connect() as conn:
                conn.exec_driver_sql(statement)
        url = _pg_database.set(database=database, password=None)
        yield {role: url.set(username=name).render_as_string(hide_password=False) for role, name in names.items()}
    finally:
        engine.dispose()
        admin = _admin_engine()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            for name in names.values():
                conn.exec_driver_sql(f'DROP ROLE IF EXISTS "{name}"')
        admin.dispose()


@pytest.fixture(scope="module")
def swept(roles: dict[str, str]) -> dict[str, str]:
    """The sweep role creates the schema and stores a result, a miss and a config."""
    with Store(roles["autotune_sweep"]) as sweep:
        sweep.upgrade()
        sweep.put_result(make_result(m=1))
        sweep.record_miss(make_env(), make_request(m=2))
        sweep.put_kernel_configs(make_env(), {"k": {"XBLOCK": 64}})
    return roles


def _denied(statement: str, url: str) -> bool:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(statement)
        return False
    except sa.exc.ProgrammingError as error:
        return "permission denied" in str(error.orig)
    finally:
        engine.dispose()


def test_read_only_role_reads_everything_and_writes_nothing(swept: dict[str, str]) -> None:
    url = swept["autotune_job"]
    with Store(url) as store:  # not opened read-only: the database itself refuses
        assert store.lookup(make_env(), make_result(m=1).request.key) == make_result(m=1)
        assert store.kernel_configs(make_env()) == {"k": {"XBLOCK": 64}}
        assert len(store.misses()) == 1 and store.stats()["requests"] == 1
        for write in (lambda: store.put_result(make_result(m=3)),
                      lambda: store.record_miss(make_env(), make_request(m=4)),
                      lambda: store.put_kernel_configs(make_env(), {"j": {}}),
                      lambda: store.prune(older_than=None, device="x")):
            with pytest.raises(CacheWriteRefused, match="may not write"):
                write()
    assert _denied("DELETE FROM requests", url) and _denied("INSERT INTO misses (id) VALUES (1)", url)


def test_writeback_role_inserts_and_updates_but_never_deletes(swept: dict[str, str]) -> None:
    url = swept["autotune_writeback"]
    with Store(url) as store:
        store.record_miss(make_env(), make_request(m=5))  # a job logs a miss ...
        store.put_result(make_result(m=5))  # ... and writes back what it tuned: stored
        assert store.lookup(make_env(), make_result(m=5).request.key) == make_result(m=5)
        store.record_miss(make_env(), make_request(m=2))  # count += 1 is an UPDATE
        store.put_kernel_configs(make_env(), {"k": {"XBLOCK": 128}})
        with pytest.raises(CacheWriteRefused, match="may not write"):
            store.prune(torch_version=make_env().torch_version)
        with pytest.raises(CacheWriteRefused):
            store.prune_artifacts()
    for table in ("requests", "candidates", "misses", "kernel_configs", "environments", "artifacts"):
        assert _denied(f"DELETE FROM {table}", url), table
    with Store(swept["autotune_sweep"]) as sweep:  # the sweep role may prune
        assert sweep.prune(device="no such device", dry_run=True) == 0
        assert sweep.prune(torch_version="0.0-none") == 0


def test_a_job_with_read_only_credentials_warns_once_and_compiles(swept: dict[str, str], tmp_path: Path) -> None:
    """No AUTOTUNE_READ_ONLY: the hook tries to log its misses and write back, the
    database refuses, and the job still compiles and runs (exit 0, one warning)."""
    report = job(tmp_path, "--cache", swept["autotune_job"])
    assert report["returncode"] == 0
    assert report["stats"]["misses"] == 2 and report["stats"]["errors"] >= 1
    assert report["stderr"].count("kernel cache unavailable") == 1, report["stderr"][-2000:]
