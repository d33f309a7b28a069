"""The Store contract, run against SQLite and PostgreSQL alike."""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
import shutil
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from factories import make_env, make_request, make_result

from autotune.cache import (
    CacheUnavailable,
    ImportValidationError,
    ReadOnlyError,
    SchemaOutdated,
    Store,
    TuningResult,
    default_cache_url,
    resolve_cache_url,
)
from autotune.cache.models import metadata
from autotune.cache.models import requests as requests_table
from autotune.cache.records import STATUS_FAILED, STATUS_OK, digest
from autotune.cache.schema import MIGRATIONS_DIR, head_revision
from autotune.cache.url import local_directory
from autotune.settings import Settings

# The fast subset CI also runs on the oldest supported torch (.ci/run).
pytestmark = pytest.mark.torch_subset

# ------------------------------------------------------------------ round trip


def test_round_trip(store: Store) -> None:
    result = make_result()
    store.put_result(result)
    got = store.lookup(result.env, result.request.key)
    assert got == result
    # Fields dataclass equality ignores must survive too.
    assert got.request.params == result.request.params
    assert [c.params for c in got.candidates] == [c.params for c in result.candidates]
    assert got.provenance.created_at.tzinfo is not None
    [(row_id, listed)] = store.list_results()
    assert listed == result and listed.env.config == result.env.config
    assert store.get(row_id) == result
    assert store.get(row_id + 1000) is None


def test_round_trip_of_every_op_and_failure(store: Store) -> None:
    results = [
        make_result(op="addmm", m=512),
        make_result(op="bmm"),
        make_result(op="convolution", m=56, n=64, times=[1.0, None, 0.5, 0.9]),
        make_result(op="mm", m=8, status="failed", times=[None, None, None, None]),
    ]
    assert store.put_results(results) == 4
    for result in results:
        assert store.lookup(result.env, result.request.key) == result


def test_put_is_idempotent(store: Store) -> None:
    result = make_result()
    for _ in range(3):
        store.put_result(result)
    stats = store.stats()
    assert (stats["environments"], stats["requests"], stats["candidates"]) == (1, 1, 4)


def test_reput_replaces_fields_and_candidate_set(store: Store) -> None:
    first = make_result(times=[1.0, 0.9, 0.8, 0.7])
    store.put_result(first)
    [(row_id, _)] = store.list_results()
    # A re-tune: one candidate dropped, new times, a different winner and status.
    retuned = make_result(times=[1.0, 0.5, None], status="invalid", host="worker-9")
    retuned = TuningResult(
        env=retuned.env,
        request=retuned.request,
        candidates=retuned.candidates[:3],
        winner_hash=retuned.candidates[1].choice_hash,
        status="invalid",
        validation={"passed": False, "max_abs_err": 3.5},
        error="winner gave wrong numbers",
        provenance=retuned.provenance,
    )
    store.put_result(retuned)
    got = store.lookup(first.env, first.request.key)
    assert got == retuned
    assert store.stats()["candidates"] == 3
    assert store.list_results()[0][0] == row_id  # same row, updated in place


def test_lookup_miss_and_env_isolation(store: Store) -> None:
    result = make_result()
    other_env = make_env(torch_version="2.12.0+cu126")
    assert store.lookup(result.env, result.request.key) is None  # empty store
    store.put_result(result)
    assert store.lookup(result.env, make_request(m=7).key) is None
    assert store.lookup(other_env, result.request.key) is None
    other = make_result(env=other_env, times=[1.0, 2.0, 3.0, 4.0])
    store.put_result(other)
    assert store.lookup(other_env, result.request.key) == other
    assert store.lookup(result.env, result.request.key) == result
    assert store.stats()["environments"] == 2


def test_cached_request_keys_only_ok_results_of_that_env(store: Store) -> None:
    env, other_env = make_env(), make_env(device_name="NVIDIA A100-SXM4-80GB")
    ok = [make_result(env=env, m=m) for m in (64, 128)]
    failed = make_result(env=env, m=256, status="failed", times=[None] * 4)
    store.put_results([*ok, failed, make_result(env=other_env, m=512)])
    assert store.cached_request_keys(env) == {r.request.key for r in ok}
    assert store.cached_request_keys(make_env(torch_version="0.0")) == set()


def test_misses_are_counted_and_cleared_by_a_result(store: Store) -> None:
    env, other_env = make_env(), make_env(device_name="NVIDIA A100-SXM4-80GB")
    wanted, other = make_request(m=64), make_request(m=128)
    store.record_miss(env, wanted, host="train-0")
    store.record_miss(env, wanted, host="train-1")
    store.record_miss(env, other, host="train-0")
    store.record_miss(other_env, wanted, host="train-2")
    by_key = {m.request.key: m for m in store.misses(env)}
    assert by_key[wanted.key].count == 2
    assert by_key[wanted.key].host == "train-1"
    assert by_key[wanted.key].last_seen >= by_key[wanted.key].first_seen
    assert by_key[wanted.key].request == wanted and by_key[wanted.key].env == env
    assert len(store.misses()) == 3
    store.put_result(make_result(env=env, request=wanted))
    assert [m.request.key for m in store.misses(env)] == [other.key]
    assert len(store.misses(other_env)) == 1  # other env's miss stays
    assert store.misses(make_env(torch_version="0.0")) == []


def test_kernel_configs(store: Store) -> None:
    env, other_env = make_env(), make_env(device_name="NVIDIA A100-SXM4-80GB")
    assert store.get_kernel_config(env, "pointwise:abc") is None
    store.put_kernel_config(env, "pointwise:abc", {"XBLOCK": 128, "num_warps": 4})
    assert store.get_kernel_config(env, "pointwise:abc") == {"XBLOCK": 128, "num_warps": 4}
    store.put_kernel_config(env, "pointwise:abc", {"XBLOCK": 256})
    assert store.get_kernel_config(env, "pointwise:abc") == {"XBLOCK": 256}
    assert store.get_kernel_config(other_env, "pointwise:abc") is None
    assert store.stats()["kernel_configs"] == 1
    store.put_kernel_configs(env, {"fusion:1": {"fuse": False}, "fusion:2": {"fuse": True}, "plain": {}})
    assert store.stats()["kernel_configs_by_kind"] == {"-": 1, "fusion": 2, "pointwise": 1}
    with pytest.raises(TypeError):
        store.put_kernel_config(env, "k", {"fn": object()})


def test_kernel_configs_in_bulk_by_prefix(store: Store) -> None:
    env, other_env = make_env(), make_env(device_name="NVIDIA A100-SXM4-80GB")
    items = {"best_config:ab/1.best_config": {"XBLOCK": 64}, "best_config:cd/2.best_config": {"XBLOCK": 32}}
    assert store.put_kernel_configs(env, {**items, "other:x": {"a": 1}}) == 3
    assert store.kernel_configs(env, "best_config:") == items
    assert len(store.kernel_configs(env)) == 3
    assert store.kernel_configs(env, "best%") == {}  # the prefix is literal, not a LIKE pattern
    assert store.kernel_configs(other_env, "best_config:") == {}
    store.put_kernel_configs(env, {"best_config:ab/1.best_config": {"XBLOCK": 128}})
    assert store.kernel_configs(env, "best_config:ab")["best_config:ab/1.best_config"] == {"XBLOCK": 128}


def test_export_import_carries_kernel_configs(store: Store, tmp_path: Path) -> None:
    env = make_env()
    store.put_result(make_result(env=env))
    store.put_kernel_configs(env, {"best_config:ab/1.best_config": {"XBLOCK": 64, "num_warps": 4}})
    exported = _export(store)
    assert '"kernel_config"' in exported
    target = Store(f"sqlite:///{tmp_path / 'other' / 'cache.db'}")
    report = target.import_jsonl(io.StringIO(exported))
    assert (report.imported, report.kernel_configs) == (1, 1)
    assert target.kernel_configs(env) == {"best_config:ab/1.best_config": {"XBLOCK": 64, "num_warps": 4}}
    target.close()


def test_import_reads_version_1_files(store: Store) -> None:
    line = json.dumps(make_result().to_json())
    report = store.import_jsonl(io.StringIO(f'{{"format": "autotune-cache", "version": 1}}\n{line}\n'))
    assert report.imported == 1


def test_results_for_env_returns_ok_results_of_that_env_only(store: Store) -> None:
    ok, other = make_result(), make_result(env=make_env(device_name="NVIDIA A100-SXM4-80GB"))
    failed = make_result(request=make_request(op="bmm"), status=STATUS_FAILED)
    store.put_results([ok, other, failed])
    assert [r.request.key for r in store.results_for_env(ok.env)] == [ok.request.key]
    assert {r.status for r in store.results_for_env(ok.env, status=None)} == {STATUS_OK, STATUS_FAILED}
    assert store.results_for_env(make_env(torch_version="0.0")) == []


def test_non_finite_json_values_are_stored_as_null(store: Store) -> None:
    result = make_result()
    nan = TuningResult(**{**result.__dict__, "validation": {"passed": False, "max_abs_err": float("nan")}})
    store.put_result(nan)
    assert store.lookup(result.env, result.request.key).validation == {"passed": False, "max_abs_err": None}


# ------------------------------------------------------------------ read-only


def test_read_only_refuses_every_write(store: Store, store_url: str) -> None:
    result = make_result()
    store.put_result(result)
    reader = Store(store_url, read_only=True)
    assert reader.lookup(result.env, result.request.key) == result
    writes = [
        lambda: reader.put_result(result),
        lambda: reader.put_results([result]),
        lambda: reader.record_miss(result.env, result.request),
        lambda: reader.put_kernel_config(result.env, "k", {}),
        lambda: reader.prune(device="h100"),
        lambda: reader.import_jsonl(io.StringIO("")),
        lambda: reader.upgrade(),
    ]
    for write in writes:
        with pytest.raises(ReadOnlyError):
            write()
    assert reader.prune(device="h100", dry_run=True) == 1  # counting is a read
    assert store.stats()["requests"] == 1
    reader.close()


def test_read_only_never_creates_a_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "nothing" / "cache.db"
    with pytest.raises(CacheUnavailable, match="no cache database"):
        Store(str(path), read_only=True).lookup(make_env(), "k")
    assert not path.parent.exists()


def test_read_only_never_creates_tables(postgres_url: str) -> None:
    with pytest.raises(SchemaOutdated, match="autotune cache upgrade"):
        Store(postgres_url, read_only=True).lookup(make_env(), "k")
    assert Store(postgres_url).current_revision() is None  # still empty


# --------------------------------------------------------------------- pickle


def test_pickle_round_trip(store: Store, store_url: str) -> None:
    result = make_result()
    store.put_result(result)  # engine and env-id cache now populated
    state = store.__getstate__()
    assert set(state) >= {"url", "read_only", "connect_timeout"}
    assert all(isinstance(v, (str, bool, float, type(None))) for v in state.values())
    clone = pickle.loads(pickle.dumps(store))
    assert clone.lookup(result.env, result.request.key) == result
    clone.put_result(make_result(m=99))
    assert store.stats()["requests"] == 2
    clone.close()


# ----------------------------------------------------------------- migrations

# A revision after the package's head (whatever that is now).
_NEXT_REVISION = '''"""test-only next revision"""
import sqlalchemy as sa
from alembic import op

revision = "9999_test"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade():
    op.add_column("kernel_configs", sa.Column("note", sa.Text(), nullable=True))


def downgrade():
    op.drop_column("kernel_configs", "note")
'''


@pytest.fixture
def newer_migrations(tmp_path: Path) -> Path:
    """The package's migrations plus one more revision, as a newer autotune would ship."""
    target = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, target, ignore=shutil.ignore_patterns("__pycache__"))
    (target / "versions" / "9999_test.py").write_text(_NEXT_REVISION.replace("{head}", head_revision()))
    return target


def test_empty_database_is_created_at_head(store_url: str) -> None:
    with Store(store_url) as store:
        assert store.current_revision() is None
        assert store.stats()["schema_revision"] == head_revision()


def test_outdated_schema_is_detected_and_upgraded(store_url: str, newer_migrations: Path) -> None:
    with Store(store_url) as old:
        old.put_result(make_result())  # database at the package's head
    newer = Store(store_url, migrations_dir=newer_migrations)
    with pytest.raises(SchemaOutdated, match="autotune cache upgrade") as info:
        newer.lookup(make_env(), "k")
    assert head_revision() in str(info.value) and "\n" not in str(info.value)
    assert newer.upgrade() == "9999_test"
    assert newer.current_revision() == "9999_test"
    assert newer.lookup(make_env(), make_result().request.key) == make_result()  # data kept
    newer.close()
    # And an autotune that only knows the older head refuses the newer database.
    with pytest.raises(SchemaOutdated, match="newer than this autotune"):
        Store(store_url).lookup(make_env(), "k")


def test_a_fused_epilogue_or_a_convolutions_geometry_is_part_of_the_key() -> None:
    gelu, plain = ({"aten": {"attr": attr, "scalars": [], "algorithm": alg}} for attr, alg in (("gelu", "none"),
                                                                                              ("none", "")))
    base = make_request()
    keys = {dataclasses.replace(base, op="linear_unary", params=params).key for params in (gelu, plain)}
    assert len(keys) == 2
    dilated = [dataclasses.replace(base, op="convolution", params={"aten": {"stride": [1, 1], "dilation": [d, d]}})
               for d in (6, 12)]
    assert dilated[0].key != dilated[1].key
    # A GEMM's alpha and beta are not a variant: its key is what it was before variants.
    assert dataclasses.replace(base, params={"aten": {"alpha": 1, "beta": 1}}).key == base.key


def test_upgrading_to_0004_rekeys_stored_requests_and_misses_and_loses_none(store_url: str) -> None:
    """A database written before variants: its linear_unary row and miss carry the old key."""
    request = dataclasses.replace(make_request(), op="linear_unary",
                                  params={"aten": {"attr": "gelu", "scalars": [], "algorithm": "none"}})
    plain = make_request(m=64)
    old_key = digest(request.op, request.inputs_key, request.precision)
    with Store(store_url) as store:
        store.put_results([make_result(request=request), make_result(request=plain)])
        store.record_miss(make_env(), request)
    engine = sa.create_engine(store_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        for table in ("requests", "misses"):
            conn.execute(sa.text(f"UPDATE {table} SET key = :old WHERE key = :new"), {"old": old_key, "new": request.key})
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0003'"))
    engine.dispose()
    with pytest.raises(SchemaOutdated, match="autotune cache upgrade"):
        Store(store_url).lookup(make_env(), request.key)
    with Store(store_url) as store:
        assert store.upgrade() == head_revision()
        assert store.lookup(make_env(), request.key) == make_result(request=request)
        assert store.lookup(make_env(), plain.key) == make_result(request=plain)  # untouched
        assert [m.request.key for m in store.misses()] == [request.key]
        assert store.stats()["requests"] == 2


def test_models_match_migrations(store: Store, store_url: str) -> None:
    store.stats()  # creates the schema through the migrations
    engine = sa.create_engine(store_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    engine.dispose()
    assert diff == []


# ---------------------------------------------------------------------- prune


def _backdate(url: str, days: int) -> None:
    """Make every stored request look `days` old (there is no API to do that)."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        old = datetime.now(timezone.utc) - timedelta(days=days)
        conn.execute(sa.update(requests_table).values(updated_at=old))
    engine.dispose()


def test_prune_filters_and_dry_run(store: Store, store_url: str) -> None:
    h100_old = make_env(torch_version="2.5.1")
    h100_new = make_env(torch_version="2.13.0")
    a100 = make_env(device_name="NVIDIA A100-SXM4-80GB", torch_version="2.13.0")
    cpu = make_env(device_kind="cpu", device_name="AMD EPYC 9654 avx512", torch_version="2.13.0")
    for env in (h100_old, h100_new, a100, cpu):
        store.put_results([make_result(env=env, m=m) for m in (64, 128)])
    store.record_miss(h100_old, make_request(m=3))

    assert store.prune(torch_version="2.5.1", dry_run=True) == 2
    assert store.stats()["requests"] == 8  # dry run removed nothing
    assert store.prune(torch_version="2.5.1") == 2
    stats = store.stats()
    assert (stats["requests"], stats["candidates"], stats["environments"], stats["misses"]) == (6, 24, 3, 0)
    assert store.lookup(h100_old, make_request(m=64).key) is None

    assert store.prune(device="a100", dry_run=True) == 2  # name substring, any case
    assert store.prune(device="CPU", dry_run=True) == 2  # device kind
    assert store.prune(device="h100", torch_version="2.5.1", dry_run=True) == 0  # filters AND

    assert store.prune(older_than=timedelta(days=30)) == 0  # everything is fresh
    _backdate(store_url, days=45)
    assert store.prune(older_than=timedelta(days=60), dry_run=True) == 0
    assert store.prune(device="a100", older_than=timedelta(days=30)) == 2
    assert store.stats()["environments"] == 2
    assert store.lookup(h100_new, make_request(m=64).key) is not None
    # A pruned environment can be written again (the cached env id is dropped).
    store.put_result(make_result(env=a100, m=64))
    assert store.lookup(a100, make_request(m=64).key) is not None


def test_list_results_filters(store: Store) -> None:
    a100 = make_env(device_name="NVIDIA A100-SXM4-80GB")
    store.put_results([make_result(m=64), make_result(op="bmm"), make_result(env=a100, m=128)])
    assert [r.request.op for _, r in store.list_results(op="bmm")] == ["bmm"]
    assert [r.env for _, r in store.list_results(device="A100")] == [a100]
    assert len(store.list_results(limit=2)) == 2
    assert len(store.list_results(status="failed")) == 0


# -------------------------------------------------------------- export/import


def _export(store: Store) -> str:
    buf = io.StringIO()
    store.export_jsonl(buf)
    return buf.getvalue()


def test_export_import_round_trip_and_idempotent_reimport(store: Store, sqlite_url: str, tmp_path: Path) -> None:
    results = [make_result(m=m) for m in (64, 128, 256)] + [make_result(op="convolution", m=28, n=32)]
    store.put_results(results)
    store.record_miss(make_env(), make_request(m=9))
    text = _export(store)
    lines = text.splitlines()
    assert json.loads(lines[0]) == {"format": "autotune-cache", "version": 3}
    assert len(lines) == 1 + len(results)

    # Into another store (on the other backend's default: an SQLite file).
    target = Store(f"sqlite:///{tmp_path / 'copy.db'}")
    report = target.import_jsonl(io.StringIO(text))
    assert (report.imported, report.unchanged) == (4, 0)
    assert {r.request.key: r for _, r in target.list_results()} == {r.request.key: r for r in results}
    before = (target.stats(), _export(target))
    report = target.import_jsonl(io.StringIO(text))
    assert (report.imported, report.unchanged) == (0, 4)
    after = (target.stats(), _export(target))
    assert before[1] == after[1]
    assert {k: v for k, v in before[0].items() if k != "size_bytes"} == {
        k: v for k, v in after[0].items() if k != "size_bytes"
    }
    target.close()

    # Importing back into the source changes nothing either.
    assert store.import_jsonl(io.StringIO(text)).unchanged == 4


def _bad_files() -> dict[str, tuple[str, int, str]]:
    good = json.dumps(make_result().to_json())
    header = json.dumps({"format": "autotune-cache", "version": 1})

    def edit(path: list[str | int], value: object) -> str:
        data = make_result(m=77).to_json()
        node = data
        for key in path[:-1]:
            node = node[key]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return json.dumps(data)

    return {
        "not json": (f"{header}\n{good}\n{{oops\n", 3, "not valid JSON"),
        "no header": (f"{good}\n", 1, "first line must be"),
        "empty": ("", 1, "empty file"),
        "future version": (header.replace("1", "99") + f"\n{good}\n", 1, "unsupported format version 99"),
        "bad kernel config": (f'{header}\n{{"kernel_config": {{"env": {{}}, "key": "k", "value": {{}}}}}}\n', 2,
                              "missing required field"),
        "missing field": (f"{header}\n{good}\n{edit(['request', 'op'], KeyError)}\n", 3, "missing required field 'op'"),
        "wrong type": (f"{header}\n{edit(['candidates', 0, 'time_ms'], 'fast')}\n", 2, "time_ms must be"),
        "bad status": (f"{header}\n{edit(['status'], 'great')}\n", 2, "status 'great' is not one of"),
        "bad failure kind": (
            f"{header}\n{edit(['candidates', 1, 'failure_kind'], 'oops')}\n", 2, "failure_kind 'oops'"
        ),
        "unknown winner": (f"{header}\n{edit(['winner_hash'], 'nope')}\n", 2, "winner_hash 'nope'"),
        "bad sizes": (f"{header}\n{edit(['request', 'inputs', 0, 'sizes'], [1, 'x'])}\n", 2, "list of integers"),
        "bad timestamp": (f"{header}\n{edit(['provenance', 'created_at'], 'yesterday')}\n", 2, "ISO 8601"),
        "unknown field": (f"{header}\n{edit(['env', 'gpu'], 'x')}\n", 2, "unknown field 'gpu'"),
    }


@pytest.mark.parametrize("case", sorted(_bad_files()))
def test_import_rejects_a_bad_line_and_imports_nothing(store: Store, case: str) -> None:
    text, line, problem = _bad_files()[case]
    with pytest.raises(ImportValidationError) as info:
        store.import_jsonl(io.StringIO(text))
    assert info.value.line == line
    assert problem in info.value.problem
    assert f"line {line}" in str(info.value)
    assert store.stats()["requests"] == 0


# ---------------------------------------------------------------- errors, url


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("postgresql+psycopg://postgres@127.0.0.1:1/x", "Connection refused"),
        ("postgresql://u:secret@127.0.0.1:notaport/x", "malformed cache URL"),
        ("mysql://root@localhost/cache", "unsupported cache database 'mysql'"),
        ("postgresql+psycopg2://u@localhost/x", "no database driver"),
    ],
)
def test_unusable_database_fails_fast_with_one_line(url: str, needle: str) -> None:
    start = time.monotonic()
    with pytest.raises(CacheUnavailable) as info:
        Store(url).lookup(make_env(), "k")
    message = str(info.value)
    assert time.monotonic() - start < 5
    assert needle in message and "\n" not in message
    assert "secret" not in message


def test_resolve_cache_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_url() == f"sqlite:///{tmp_path}/autotune/cache.db"
    assert resolve_cache_url(None) == default_cache_url()
    # $AUTOTUNE_CACHE is the settings' to read (the only reader of AUTOTUNE_*), not the store's.
    monkeypatch.setenv("AUTOTUNE_CACHE", "postgresql://db/cache")
    assert resolve_cache_url(None) == default_cache_url()
    assert resolve_cache_url(Settings.from_env().cache) == "postgresql+psycopg://db/cache"
    assert resolve_cache_url("sqlite:///x.db") == "sqlite:///x.db"
    assert resolve_cache_url(str(tmp_path / "a.db")) == f"sqlite:///{tmp_path}/a.db"
    assert local_directory(str(tmp_path / "a.db")) == tmp_path
    assert local_directory("postgresql://db/cache") == tmp_path / "autotune"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("AUTOTUNE_CACHE")
    assert default_cache_url() == f"sqlite:///{Path.home()}/.cache/autotune/cache.db"


def test_lookup_survives_a_dropped_connection(postgres_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A pooled connection killed by the server is replaced, not reported as a miss or error."""
    caplog.set_level("INFO", logger="autotune.cache.store")
    store = Store(postgres_url)
    result = make_result()
    store.put_result(result)
    assert store.lookup(result.env, result.request.key) == result
    admin = sa.create_engine(postgres_url, poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.execute(
            sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'autotune' AND datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
        conn.commit()
    admin.dispose()
    assert store.lookup(result.env, result.request.key) == result
    assert "cache connection lost" in caplog.text  # it did meet the dead connection
    store.put_result(make_result(m=5))  # writes recover too
    store.close()
