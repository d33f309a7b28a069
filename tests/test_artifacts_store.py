"""The artifact tier of the Store (compiled code, stored signed), on SQLite and PostgreSQL."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import random
import shutil
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import contended_writer
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from factories import make_env, make_result

from autotune.cache import (
    Artifact,
    CacheError,
    ImportValidationError,
    ReadOnlyError,
    SchemaOutdated,
    Store,
)
from autotune.cache.jsonl import artifact_to_json
from autotune.cache.records import ARTIFACT_CPP_KERNEL, ARTIFACT_DYNAMO, ARTIFACT_FX_GRAPH, TuningResult, utcnow
from autotune.cache.schema import MIGRATIONS_DIR, head_revision
from autotune.cache.signing import OK, Signer, generate, load_trusted
from autotune.cache.store._rows import candidate_values, env_values, result_values
from autotune.cli import main

EVERY_BYTE = bytes(range(256)) * 17
BIG = random.Random(0).randbytes(5 * 1024 * 1024)  # incompressible, so sizes on disk are real


@pytest.fixture
def signer(tmp_path: Path) -> Signer:
    return generate(tmp_path / "keys" / "sweeper")


def make_artifact(
    signer: Signer | None = None,
    kind: str = ARTIFACT_FX_GRAPH,
    key: str = "fxgraph-abc123",
    payload: bytes = b"compiled graph",
    torch_version: str = "2.13.0+cu128",
    device: str = "NVIDIA H100 80GB HBM3",
    age: timedelta = timedelta(0),
) -> Artifact:
    signature = signer.sign(kind, key, payload) if signer else None
    return Artifact(
        kind=kind,
        key=key,
        payload=payload,
        signature=signature,
        public_key=signer.public_key if signer else None,
        torch_version=torch_version,
        device=device,
        host="sweeper-0",
        created_at=datetime.now(timezone.utc) - age,
    )


def _export(store: Store) -> str:
    buf = io.StringIO()
    store.export_jsonl(buf)
    return buf.getvalue()


# ------------------------------------------------------------------ put / get


def test_round_trip_is_byte_exact(store: Store, signer: Signer, tmp_path: Path) -> None:
    trusted = load_trusted([f"{signer.path}.pub"])
    originals = [
        make_artifact(signer, key="every-byte", payload=EVERY_BYTE),
        make_artifact(signer, kind=ARTIFACT_CPP_KERNEL, key="big", payload=BIG),
        make_artifact(None, kind=ARTIFACT_DYNAMO, key="empty", payload=b""),
        # Longer than a PostgreSQL btree entry may be: the index is on the key's hash.
        make_artifact(signer, key="torch-2.13:" + "x" * 10_000 + ".so", payload=b"\x00\xff" * 9),
    ]
    for original in originals:
        assert store.put_artifact(original) is True
    for original in originals:
        got = store.get_artifact(original.kind, original.key)
        assert got == original  # every field: payload, signature, key, provenance
        assert type(got.payload) is bytes and got.digest == original.digest
        assert store.has_artifact(original.kind, original.key)
        if original.signature:
            assert trusted.verify(got.kind, got.key, got.payload, got.signature, got.public_key) == OK
    assert store.get_artifact(ARTIFACT_DYNAMO, "every-byte") is None  # same key, other kind
    assert store.get_artifact(ARTIFACT_FX_GRAPH, "every-bytes") is None
    assert not store.has_artifact(ARTIFACT_FX_GRAPH, "nothing")


def test_write_once_first_writer_wins(store: Store, signer: Signer) -> None:
    first = make_artifact(signer, payload=b"first")
    assert store.put_artifact(first) is True
    assert store.put_artifact(make_artifact(None, payload=b"second, unsigned")) is False
    assert store.put_artifact(first) is False
    assert store.get_artifact(first.kind, first.key) == first
    assert store.stats()["artifacts"] == 1


def test_put_rejects_what_the_table_must_not_hold(store: Store) -> None:
    with pytest.raises(ValueError, match="not one of fx_graph"):
        store.put_artifact(make_artifact(kind="pickle"))
    with pytest.raises(ValueError, match="non-empty key"):
        store.put_artifact(make_artifact(key=""))
    assert store.stats()["artifacts"] == 0


def test_read_only_store_reads_but_refuses_writes(store: Store, store_url: str, signer: Signer) -> None:
    artifact = make_artifact(signer)
    store.put_artifact(artifact)
    with Store(store_url, read_only=True) as reader:
        assert reader.get_artifact(artifact.kind, artifact.key) == artifact
        assert reader.has_artifact(artifact.kind, artifact.key)
        assert reader.prune_artifacts(device="h100", dry_run=True) == 1  # counting is a read
        for write in (
            lambda: reader.put_artifact(make_artifact(key="other")),
            lambda: reader.prune_artifacts(device="h100"),
            lambda: reader.import_jsonl(io.StringIO(_export(store))),
        ):
            with pytest.raises(ReadOnlyError):
                write()
    assert store.stats()["artifacts"] == 1


# ------------------------------------------------------------- stats and ls


def test_stats_and_listing(store: Store, tmp_path: Path) -> None:
    alice, bob = generate(tmp_path / "alice"), generate(tmp_path / "bob")
    stored = [
        make_artifact(alice, key="a", payload=b"x" * 10, age=timedelta(hours=3)),
        make_artifact(alice, kind=ARTIFACT_CPP_KERNEL, key="b", payload=b"x" * 20, device="cpu AMD EPYC",
                      age=timedelta(hours=2)),
        make_artifact(bob, key="c", payload=b"x" * 30, device="NVIDIA A100-SXM4-80GB", age=timedelta(hours=1)),
        make_artifact(None, kind=ARTIFACT_DYNAMO, key="d", payload=b"x" * 40),
    ]
    for artifact in stored:
        store.put_artifact(artifact)
    stats = store.stats()
    assert (stats["artifacts"], stats["artifact_bytes"]) == (4, 100)
    assert stats["artifacts_by_kind"] == {"cpp_kernel": 1, "dynamo": 1, "fx_graph": 2}
    assert stats["artifact_signers"] == {alice.fingerprint: 2, bob.fingerprint: 1, "unsigned": 1}

    listed = store.artifacts()
    assert [a.key for a in listed] == ["d", "c", "b", "a"]  # newest first
    assert (listed[1].signer, listed[1].size, listed[1].digest) == (bob.fingerprint, 30, stored[2].digest)
    assert not hasattr(listed[0], "payload")
    assert [a.key for a in store.artifacts(kind=ARTIFACT_FX_GRAPH)] == ["c", "a"]
    assert [a.key for a in store.artifacts(device="a100")] == ["c"]  # substring, any case
    assert [a.key for a in store.artifacts(signer=alice.fingerprint)] == ["b", "a"]
    assert [a.key for a in store.artifacts(signer="unsigned")] == ["d"]
    assert [a.key for a in store.artifacts(limit=2)] == ["d", "c"]
    assert len(store.artifacts(limit=None)) == 4


def test_size_on_disk_counts_artifacts(store: Store) -> None:
    store.put_result(make_result())
    before = store.stats()["size_bytes"]
    store.put_artifact(make_artifact(payload=BIG))
    assert store.stats()["size_bytes"] - before > 4 * 1024 * 1024


# ---------------------------------------------------------------------- prune


def test_prune_artifacts_by_torch_version_device_and_age(store: Store) -> None:
    store.put_artifact(make_artifact(key="old-torch", torch_version="2.5.1"))
    store.put_artifact(make_artifact(key="a100", device="NVIDIA A100-SXM4-80GB"))
    store.put_artifact(make_artifact(key="aged", age=timedelta(days=45)))
    store.put_artifact(make_artifact(key="fresh"))

    assert store.prune_artifacts(torch_version="2.5.1", dry_run=True) == 1
    assert store.prune_artifacts(torch_version="2.5", dry_run=True) == 0  # exact, not a prefix
    assert store.stats()["artifacts"] == 4  # dry run removed nothing
    assert store.prune_artifacts(torch_version="2.5.1") == 1
    assert store.prune_artifacts(device="a100", dry_run=True) == 1
    assert store.prune_artifacts(device="h100", older_than=timedelta(days=30), dry_run=True) == 1  # filters AND
    assert store.prune_artifacts(older_than=timedelta(days=60)) == 0
    assert store.prune_artifacts(older_than=timedelta(days=30)) == 1
    assert {a.key for a in store.artifacts()} == {"a100", "fresh"}


def test_prune_removes_matching_artifacts_and_still_counts_requests(store: Store) -> None:
    store.put_results([make_result(env=make_env(torch_version="2.5.1")), make_result()])
    store.put_artifact(make_artifact(key="old", torch_version="2.5.1"))
    store.put_artifact(make_artifact(key="new"))
    assert store.prune(torch_version="2.5.1", dry_run=True) == 1
    assert store.stats()["artifacts"] == 2
    assert store.prune(torch_version="2.5.1") == 1
    assert [a.key for a in store.artifacts()] == ["new"]


# -------------------------------------------------------------- export/import


def _populate(store: Store, signer: Signer) -> list[Artifact]:
    store.put_results([make_result(m=64), make_result(m=128)])
    artifacts = [
        make_artifact(signer, key="every-byte", payload=EVERY_BYTE),
        make_artifact(signer, kind=ARTIFACT_CPP_KERNEL, key="big.so", payload=BIG, device="cpu"),
        make_artifact(None, kind=ARTIFACT_DYNAMO, key="unsigned", payload=b"\x00"),
    ]
    for artifact in artifacts:
        store.put_artifact(artifact)
    return artifacts


def test_export_import_round_trips_artifacts_and_signatures(
    store: Store, signer: Signer, tmp_path: Path
) -> None:
    artifacts = _populate(store, signer)
    text = _export(store)
    lines = text.splitlines()
    assert json.loads(lines[0]) == {"format": "autotune-cache", "version": 3}
    exported = [json.loads(line)["artifact"] for line in lines if line.startswith('{"artifact"')]
    assert [a["key"] for a in exported] == ["every-byte", "big.so", "unsigned"]
    assert exported[0]["signature"] == artifacts[0].signature.hex() and exported[2]["signature"] is None

    with Store(f"sqlite:///{tmp_path / 'copy.db'}") as target:
        report = target.import_jsonl(io.StringIO(text))
        assert (report.imported, report.artifacts, report.artifacts_skipped) == (2, 3, 0)
        trusted = load_trusted([f"{signer.path}.pub"])
        for original in artifacts:
            got = target.get_artifact(original.kind, original.key)
            assert got == original  # payload, signature and public key byte for byte
            if got.signature:
                assert trusted.verify(got.kind, got.key, got.payload, got.signature, got.public_key) == OK
        assert _export(target) == text
        again = target.import_jsonl(io.StringIO(text))  # write once: nothing changes
        assert (again.unchanged, again.artifacts, again.artifacts_skipped) == (2, 0, 3)
        assert _export(target) == text


def test_import_into_each_backend_from_a_pipe(store: Store, signer: Signer, sqlite_url: str, tmp_path: Path) -> None:
    """Import from an unseekable stream (stdin, a pipe) is spooled, not held in memory."""
    with Store(f"sqlite:///{tmp_path / 'source.db'}") as source:
        artifacts = _populate(source, signer)
        text = _export(source)
    read_end, write_end = os.pipe()

    def feed() -> None:
        with os.fdopen(write_end, "w", encoding="utf-8") as pipe:
            pipe.write(text)

    feeder = threading.Thread(target=feed)
    feeder.start()
    with os.fdopen(read_end, encoding="utf-8") as pipe:
        assert not pipe.seekable()
        report = store.import_jsonl(pipe)
    feeder.join()
    assert (report.imported, report.artifacts) == (2, 3)
    assert [store.get_artifact(a.kind, a.key) for a in artifacts] == artifacts


def test_import_reads_version_2_files(store: Store) -> None:
    env = make_env()
    config = {"kernel_config": {"env": env.to_json(), "key": "best_config:x", "value": {"XBLOCK": 8}}}
    text = "\n".join([
        json.dumps({"format": "autotune-cache", "version": 2}),
        json.dumps(make_result(env=env).to_json()),
        json.dumps(config),
    ])
    report = store.import_jsonl(io.StringIO(text))
    assert (report.imported, report.kernel_configs, report.artifacts) == (1, 1, 0)


def _artifact_line(*, drop: str = "", **changes: object) -> str:
    line = artifact_to_json(make_artifact(payload=b"payload"))
    line["artifact"].update(changes)
    line["artifact"].pop(drop, None)
    return json.dumps(line)


BAD_ARTIFACT_LINES = {
    "bad base64": (_artifact_line(payload="not base64!"), "artifact.payload is not valid base64"),
    "digest mismatch": (_artifact_line(payload="cGF5bG9hZQ=="), "does not match the payload"),
    "unknown kind": (_artifact_line(kind="pickle"), "artifact.kind 'pickle' is not one of"),
    "short signature": (_artifact_line(signature="ab" * 10, public_key="cd" * 32), "must be 64 bytes"),
    "signature without key": (_artifact_line(signature="ab" * 64), "both be set or both be null"),
    "not hex": (_artifact_line(signature="zz" * 64, public_key="cd" * 32), "is not hexadecimal"),
    "missing field": (_artifact_line(drop="digest"), "missing required field 'digest'"),
    "null digest": (_artifact_line(digest=None), "artifact.digest must be a string"),
    "bad timestamp": (_artifact_line(created_at="yesterday"), "ISO 8601"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARTIFACT_LINES))
def test_bad_artifact_line_imports_nothing(store: Store, case: str) -> None:
    bad, problem = BAD_ARTIFACT_LINES[case]
    text = "\n".join([
        json.dumps({"format": "autotune-cache", "version": 3}),
        json.dumps(make_result().to_json()),
        _artifact_line(),  # a good one before the bad one
        bad,
    ])
    with pytest.raises(ImportValidationError) as info:
        store.import_jsonl(io.StringIO(text))
    assert info.value.line == 4 and problem in info.value.problem
    stats = store.stats()
    assert (stats["requests"], stats["artifacts"]) == (0, 0)


# ---------------------------------------------------------------- concurrency

WRITERS = 6


def test_concurrent_writers_of_one_key_leave_one_row(store_url: str) -> None:
    # Nothing exists yet: the writers also race to create the database or schema.
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(WRITERS), ctx.Queue()
    # The writers' target lives in a small module of its own: each spawned writer imports it.
    procs = [ctx.Process(target=contended_writer.put_same_key, args=(store_url, w, barrier, results))
             for w in range(WRITERS)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * WRITERS, "a writer process failed (see its stderr)"
    wrote = dict(results.get(timeout=5) for _ in range(WRITERS))
    winners = [w for w, ok in wrote.items() if ok]
    assert len(winners) == 1
    with Store(store_url) as store:
        assert store.stats()["artifacts"] == 1
        stored = store.get_artifact(ARTIFACT_FX_GRAPH, contended_writer.KEY)
    assert stored is not None and stored.payload == contended_writer.payload(winners[0])


# ------------------------------------------------------------------ schema


@pytest.fixture
def migrations_0001(tmp_path: Path) -> Path:
    """The package's migrations as the previous autotune shipped them (0001 only)."""
    target = tmp_path / "migrations_0001"
    shutil.copytree(MIGRATIONS_DIR, target, ignore=shutil.ignore_patterns("__pycache__"))
    for script in (target / "versions").glob("*.py"):
        if not script.name.startswith("0001_"):
            script.unlink()
    return target


def _put_as_the_schema_has_it(url: str, result: TuningResult) -> None:
    """Store a result as the autotune of an older schema did: only the columns its tables have
    (today's store writes today's columns, which a 0001 database lacks)."""
    engine = sa.create_engine(url)
    tables = sa.MetaData()
    tables.reflect(engine, only=["environments", "requests", "candidates"])

    def only(table: str, values: dict[str, Any]) -> dict[str, Any]:
        return {name: value for name, value in values.items() if name in tables.tables[table].c}

    try:
        with engine.begin() as conn:
            env_id = conn.execute(tables.tables["environments"].insert().values(
                **only("environments", env_values(result.env)))).inserted_primary_key[0]
            request_id = conn.execute(tables.tables["requests"].insert().values(
                **only("requests", result_values(result, env_id, utcnow())))).inserted_primary_key[0]
            conn.execute(tables.tables["candidates"].insert(),
                         [only("candidates", candidate_values(c, i, request_id)) for i, c in enumerate(result.candidates)])
    finally:
        engine.dispose()


def test_a_0001_database_must_be_upgraded_and_keeps_its_data(store_url: str, migrations_0001: Path) -> None:
    with Store(store_url, migrations_dir=migrations_0001) as old:
        old.connect()  # creates the 0001 tables
        assert old.current_revision() == "0001"
    _put_as_the_schema_has_it(store_url, make_result())
    for store in (Store(store_url), Store(store_url, read_only=True)):
        with pytest.raises(SchemaOutdated, match="at schema revision 0001 .*run `autotune cache upgrade`"):
            store.get_artifact(ARTIFACT_FX_GRAPH, "k")
        store.close()
    result = CliRunner().invoke(main, ["cache", "--cache", store_url, "upgrade"], catch_exceptions=False)
    assert result.exit_code == 0 and f"upgraded from 0001 to {head_revision()}" in result.stdout
    with Store(store_url) as store:
        assert store.lookup(make_env(), make_result().request.key) == make_result()
        assert store.put_artifact(make_artifact()) is True


# ------------------------------------------------- a SELECT-only PostgreSQL role


def test_select_only_role_reads_artifacts_and_writes_nothing(
    readonly_postgres_url: tuple[str, str], signer: Signer
) -> None:
    writer_url, reader_url = readonly_postgres_url
    artifact = make_artifact(signer, payload=BIG)
    result = make_result()
    with Store(writer_url) as writer:
        writer.put_artifact(artifact)
        writer.put_result(result)

    with Store(reader_url, read_only=True) as reader:
        assert reader.get_artifact(artifact.kind, artifact.key) == artifact
        assert reader.has_artifact(artifact.kind, artifact.key)
        assert reader.get_artifact(artifact.kind, "missing") is None
        assert [a.key for a in reader.artifacts()] == [artifact.key]
        assert reader.lookup(result.env, result.request.key) == result
        assert reader.stats()["artifacts"] == 1
        with pytest.raises(ReadOnlyError):
            reader.put_artifact(make_artifact(key="other"))

    # The database itself refuses the role's writes, and the store says so in one line.
    with Store(reader_url) as careless:
        with pytest.raises(CacheError, match="permission denied") as info:
            careless.put_artifact(make_artifact(key="other"))
        assert "\n" not in str(info.value)
    engine = sa.create_engine(reader_url, poolclass=sa.NullPool)
    with engine.connect() as conn, pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
        conn.execute(sa.text("DELETE FROM artifacts"))
    engine.dispose()

    with Store(writer_url) as writer:
        assert writer.stats()["artifacts"] == 1
        assert writer.get_artifact(artifact.kind, artifact.key) == artifact
