"""Hostile cache rows: whatever a role with write access stores, no job fails and no command
stops at it.

Rows are written through the store, then made hostile with raw SQL, as such a role could:
timings that are NULL for every candidate, a string, +inf or -inf for every candidate, NaN
(PostgreSQL's float8 'NaN'; SQLite stores no NaN, so there it is the string 'NaN'), a JSON
column of the wrong shape (on SQLite, not JSON at all), a kernel-config key with a NUL byte
(SQLite: PostgreSQL's text holds none), an artifact payload over the size cap, terminal escapes
in text. Each such row is read as absent: a job misses it with one warning and compiles on; a
listing leaves it out and names it in one line, exit 2.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import torch
from click.testing import CliRunner, Result
from conftest import copy_sqlite
from factories import make_env, make_request, make_result
from test_hook import job

from autotune.cache import Artifact, Store, TuningResult, jsonl
from autotune.cache.records import ARTIFACT_FX_GRAPH
from autotune.cache.signing import load_signer
from autotune.cli import main
from autotune.inductor_glue.env import current_environment, kernel_config_environment
from autotune.job import kernel_configs
from autotune.job.hook import _artifact_seams
from autotune.job.serve_policy import ServePolicy
from autotune.settings import Settings, load_keys

pytestmark = pytest.mark.xdist_group("hostile_rows")  # its own copy of the session's signed sweep (conftest)

MALFORMED = re.compile(r"(\w+) row (\d+) is malformed")
NAN = "'NaN'"  # PostgreSQL: float8 NaN; SQLite stores the text 'NaN' (it has no NaN)


def _sql(url: str, *statements: str, **params: Any) -> None:
    """Raw SQL on the cache database, as any role that may write there could run it."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(sa.text(statement), params)
    finally:
        engine.dispose()


def _postgres(url: str) -> bool:
    return url.startswith("postgresql")


def _every_time(url: str) -> dict[str, str]:
    """SQL values that make a result's timings no answer, each set on every candidate."""
    infinity = ("'Infinity'", "'-Infinity'") if _postgres(url) else ("9e999", "-9e999")
    return {"null": "NULL", "+inf": infinity[0], "-inf": infinity[1]}


def _bad_json(url: str) -> str:
    return """'"oops"'""" if _postgres(url) else "'{not json'"  # PostgreSQL's json is always valid JSON


def _malformed(text: str) -> list[tuple[str, int]]:
    """(table, id) of each row a malformed-row line names, in order."""
    return [(table, int(row_id)) for table, row_id in MALFORMED.findall(text)]


def _row_ids(url: str) -> dict[str, int]:
    """requests row id by inputs_key (read without checking: some rows are hostile)."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return {key: row_id for row_id, key in conn.execute(sa.text("SELECT id, inputs_key FROM requests"))}
    finally:
        engine.dispose()


def _renamed(result: TuningResult, tag: str, scale: int = 1) -> TuningResult:
    """The result filed under another request: its inputs_key tagged, its first input's first
    size times ``scale`` (a neighbouring shape for on_miss="nearest")."""
    first, *rest = result.request.inputs
    first = dataclasses.replace(first, sizes=(first.sizes[0] * scale, *first.sizes[1:]))
    request = dataclasses.replace(result.request, inputs_key=f"{result.request.inputs_key} {tag}",
                                  inputs=(first, *rest))
    return dataclasses.replace(result, request=request)


# ------------------------------------------------------------------------ the job


@pytest.fixture
def hostile_cache(request: pytest.FixtureRequest, signed_tiny_sweep: str, tmp_path: Path) -> tuple[str, list[int]]:
    """The session's sweep of the tiny model on SQLite or PostgreSQL, both of its results made
    hostile (a NaN timing; JSON of the wrong shape), three more results of its environment
    made hostile (every timing NULL, +inf, -inf), and a good result of a neighbouring shape
    for each request, so that on_miss="nearest" serves the job without benchmarking.
    Returns the URL and the hostile rows' ids."""
    source = copy_sqlite(Path(signed_tiny_sweep.removeprefix("sqlite:///")), tmp_path / "swept.db")
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else source
    with Store(source) as store:
        swept = [result for _, result in store.list_results()]
        if url != source:
            export = io.StringIO()
            jsonl.write(export, swept)
            export.seek(0)
            with Store(url) as target:
                target.import_jsonl(export)
    first, second = sorted(swept, key=lambda r: r.request.inputs_key)
    times = _every_time(url)
    with Store(url) as store:
        store.put_results([_renamed(r, "neighbour", scale=2) for r in swept]
                          + [_renamed(first, name) for name in times])
    ids = _row_ids(url)
    hostile = [ids[first.request.inputs_key], ids[second.request.inputs_key]]
    _sql(url, f"UPDATE candidates SET time_ms = {NAN} WHERE request_id = :first "
              "AND position = 0", first=hostile[0])
    _sql(url, f"UPDATE requests SET inputs = {_bad_json(url)} WHERE id = :second", second=hostile[1])
    for name, value in times.items():
        row_id = ids[f"{first.request.inputs_key} {name}"]
        _sql(url, f"UPDATE candidates SET time_ms = {value} WHERE request_id = :id", id=row_id)
        hostile.append(row_id)
    return url, hostile


@pytest.mark.parametrize("hostile_cache", ["sqlite", "postgres"], indirect=True)
def test_a_job_meets_every_hostile_row_with_one_warning_and_compiles_right(
        hostile_cache: tuple[str, list[int]], tmp_path: Path) -> None:
    """Both of the job's requests are hostile: each is a miss, served by the nearest good shape
    (on_miss="nearest" reads every result of the environment, so it meets the other hostile
    rows too). Before, a NaN, a string or all-infinite timings handed to Inductor failed the
    job with NoValidChoicesError or TypeError."""
    url, hostile = hostile_cache
    report = job(tmp_path, "--cache", url, "--on-miss", "nearest")
    stats = report["stats"]
    assert (stats["hits"], stats["misses"], stats["nearest"], stats["errors"]) == (0, 2, 2, 0), stats
    assert report["benchmarks"] == 0
    torch.testing.assert_close(torch.load(report["output"]), torch.load(report["eager_output"]),
                               rtol=1e-4, atol=1e-4)
    named = _malformed(report["stderr"])
    assert sorted(named) == sorted(("requests", i) for i in hostile), report["stderr"][-3000:]
    assert stats["malformed_rows"] == len(hostile)
    assert "Traceback" not in report["stderr"] and "cache unavailable" not in report["stderr"]


# ----------------------------------------------------------------- the commands


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture
def listed(store_url: str) -> tuple[str, dict[str, int]]:
    """Good and hostile results and misses, written with factories, made hostile with SQL;
    one good result's winner has a terminal escape in its name."""
    here = current_environment("cpu")
    with Store(store_url) as store:
        store.put_results([make_result(m=64 * i) for i in range(1, 6)])
        store.record_miss(here, make_request(m=3, n=5, k=7), host="train-0")
        store.record_miss(here, make_request(m=9, n=5, k=7), host="train-1")
        ids = {r.request.inputs[0].sizes[0]: i for i, r in store.list_results()}
    rows = {"nan": ids[64], "json": ids[128], "escape": ids[192], "good": ids[256]}
    _sql(store_url, f"UPDATE candidates SET time_ms = {NAN} WHERE request_id = :id",
         id=rows["nan"])
    _sql(store_url, f"UPDATE requests SET params = {_bad_json(store_url)} WHERE id = :id", id=rows["json"])
    _sql(store_url, "UPDATE candidates SET name = :name WHERE request_id = :id AND position = 3",  # the winner
         name="mm\x1b[31m red", id=rows["escape"])
    _sql(store_url, "UPDATE misses SET choice_hashes = '[1, 2]' WHERE count = 1 AND host = 'train-1'")
    engine = sa.create_engine(store_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        rows["miss"] = conn.execute(sa.text("SELECT id FROM misses WHERE host = 'train-1'")).scalar_one()
    engine.dispose()
    return store_url, rows


def test_cache_commands_name_each_hostile_row_in_one_line_and_list_the_rest(listed: tuple[str, dict[str, int]]) -> None:
    url, rows = listed
    result = cli("cache", "--cache", url, "ls")
    assert result.exit_code == 2
    assert sorted(_malformed(result.stderr)) == sorted([("requests", rows["nan"]), ("requests", rows["json"])])
    errors = result.stderr.splitlines()
    assert len(errors) == 2 and all(line.startswith("Error: ") for line in errors)
    assert len(result.stdout.splitlines()) == 1 + 3  # header and the three good rows
    as_json = cli("cache", "--cache", url, "ls", "--json")
    assert as_json.exit_code == 2 and len(json.loads(as_json.stdout)) == 3

    shown = cli("cache", "--cache", url, "show", str(rows["json"]))
    assert shown.exit_code == 2 and _malformed(shown.output) == [("requests", rows["json"])]
    assert len(shown.output.splitlines()) == 1 and "params" in shown.output
    assert cli("cache", "--cache", url, "show", str(rows["good"])).exit_code == 0

    misses = cli("cache", "--cache", url, "ls", "--misses")
    assert misses.exit_code == 2 and _malformed(misses.stderr) == [("misses", rows["miss"])]
    assert len(misses.stderr.splitlines()) == 1 and "train-0" in misses.stdout

    # The dry run plans the good miss (logged on this machine) and names the other.
    swept = cli("sweep", "--misses", "--dry-run", "--device", "cpu", "--cache", url)
    assert swept.exit_code == 2, swept.output
    assert _malformed(swept.stderr) == [("misses", rows["miss"])]
    assert "1 planned" in swept.stdout


def test_text_from_the_database_is_printed_with_its_control_characters_escaped(
        listed: tuple[str, dict[str, int]]) -> None:
    url, rows = listed
    for args in (("ls",), ("show", str(rows["escape"]))):
        result = cli("cache", "--cache", url, *args)
        assert "\x1b" not in result.output
        assert "mm\\x1b[31m red" in result.stdout


# --------------------------------------------------- kernel configs and artifacts


def test_a_hostile_kernel_config_is_skipped_with_one_warning(store_url: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """The hook writes the stored pointwise configs into Inductor's cache dir before a GPU job
    compiles; a key with a NUL byte (which no path holds: os.path raised ValueError, which the
    loader did not catch) or a value that is no JSON object is skipped with one warning."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    env = kernel_config_environment("cpu")
    good, bad = "best_config:ab/good.best_config", "best_config:ab/bad.best_config"
    with Store(store_url) as store:
        store.put_kernel_configs(env, {good: {"XBLOCK": 64}, bad: {"XBLOCK": 8}})
    if _postgres(store_url):
        _sql(store_url, "UPDATE kernel_configs SET value = '[8]' WHERE key = :bad", bad=bad)
    else:
        _sql(store_url, "UPDATE kernel_configs SET key = :nul WHERE key = :bad",
             nul="best_config:ab/bad\0.best_config", bad=bad)
    assert kernel_configs.materialize({"best_config:ab/x\0.best_config": {"XBLOCK": 8}}) == 0
    policy = ServePolicy(Settings.from_env(cache=store_url))
    try:
        policy.load_kernel_configs("cpu")
    finally:
        policy.close()
    assert policy.stats.kernel_configs_loaded == 1 and policy.stats.malformed_rows == 1
    assert policy.stats.errors == 0  # the cache stays on
    assert Path(kernel_configs.path_for(good, str(tmp_path / "inductor")) or "").exists()
    assert [table for table, _ in _malformed(caplog.text)] == ["kernel_configs"]


def test_an_artifact_over_the_size_cap_is_refused_before_it_is_read(
        store_url: str, signing_keys: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    """A planted 400 MB payload once took a job from 0.46 to 1.25 GB; now its length is read
    first (AUTOTUNE_MAX_ARTIFACT_BYTES) and a longer one is a miss with one warning."""
    signer = load_signer(signing_keys["writer"])

    def signed(key: str, payload: bytes) -> Artifact:
        return Artifact(kind=ARTIFACT_FX_GRAPH, key=key, payload=payload, public_key=signer.public_key,
                        signature=signer.sign(ARTIFACT_FX_GRAPH, key, payload), device="cpu")

    with Store(store_url) as store:
        store.put_artifact(signed("small", b"s" * 500))
        store.put_artifact(signed("planted", b"p" * 500))
        planted = next(a.id for a in store.artifacts() if a.key == "planted")
    grown = "decode(repeat('00', 4500), 'hex')" if _postgres(store_url) else "zeroblob(4500)"
    _sql(store_url, f"UPDATE artifacts SET payload = {grown} WHERE key = 'planted'")
    settings = Settings.from_env(cache=store_url, trusted_keys=(str(signing_keys["writer.pub"]),),
                                 dynamo_package=False, max_artifact_bytes=1000)
    policy = ServePolicy(settings)
    seams = _artifact_seams(policy, *load_keys(settings))
    assert seams is not None
    try:
        assert seams.tier.fetch(ARTIFACT_FX_GRAPH, "planted") is None
        assert seams.tier.fetch(ARTIFACT_FX_GRAPH, "planted") is None  # asked again: no second warning
        assert seams.tier.fetch(ARTIFACT_FX_GRAPH, "small") == b"s" * 500
    finally:
        seams.remove()
        policy.close()
    stats = policy.stats
    assert (stats.artifacts_loaded, stats.artifacts_rejected, stats.malformed_rows, stats.errors) == (1, 2, 1, 0)
    assert _malformed(caplog.text) == [("artifacts", planted)]
    assert "payload of 4500 bytes is over the cap of 1000 bytes" in caplog.text


def test_the_size_cap_is_a_setting() -> None:
    assert Settings.from_env({"AUTOTUNE_MAX_ARTIFACT_BYTES": "1048576"}).max_artifact_bytes == 2**20
    assert Settings.from_env({}).max_artifact_bytes == 256 * 2**20
    with pytest.raises(ValueError, match="AUTOTUNE_MAX_ARTIFACT_BYTES"):
        Settings.from_env({"AUTOTUNE_MAX_ARTIFACT_BYTES": "0"})


def test_a_good_row_written_over_a_hostile_one_replaces_it(store_url: str) -> None:
    """A job's write-back of the request it tuned, or an import (which compares what it brings
    with what is stored: a row that cannot be read is simply replaced)."""
    result = make_result(env=make_env())
    with Store(store_url) as store:
        store.put_result(result)
        _sql(store_url, "UPDATE candidates SET time_ms = NULL")
        store.put_result(result)
        assert store.lookup(result.env, result.request.key) == result
        _sql(store_url, "UPDATE candidates SET time_ms = NULL")
        export = io.StringIO()
        jsonl.write(export, [result])
        export.seek(0)
        assert store.import_jsonl(export).imported == 1
        assert store.lookup(result.env, result.request.key) == result
