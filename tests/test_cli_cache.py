"""`autotune cache ...` through click's CliRunner, against real databases."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import env_without
from factories import make_env, make_request, make_result

from autotune.cache import Artifact, Store
from autotune.cache.schema import head_revision
from autotune.cache.signing import generate
from autotune.cli import CLOSED_PIPE, main
from autotune.cli import cache as cache_group


@pytest.fixture
def populated(store_url: str) -> str:
    with Store(store_url) as store:
        store.put_results(
            [
                make_result(m=1024, n=1024, k=4096),
                make_result(op="convolution", m=56, n=64, times=[1.0, None, 0.5, 0.9]),
                make_result(op="bmm", status="failed", times=[None] * 4),
                make_result(env=make_env(device_name="NVIDIA A100-SXM4-80GB"), op="addmm", m=512),
            ]
        )
        store.record_miss(make_env(), make_request(m=3, n=5, k=7), host="train-0")
    return store_url


def cli(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def _ids(url: str) -> dict[str, int]:
    with Store(url) as store:
        return {r.request.op: i for i, r in store.list_results()}


def test_version_and_every_help_has_an_example() -> None:
    assert cli("--version").output.startswith("autotune, version ")
    for command in [None, *cache_group.commands]:
        args = ["cache", command, "--help"] if command else ["cache", "--help"]
        result = cli(*args)
        assert result.exit_code == 0 and "Example:" in result.output, args


def test_stats(populated: str) -> None:
    result = cli("cache", "--cache", populated, "stats")
    assert result.exit_code == 0
    assert "requests" in result.stdout and "schema revision" in result.stdout
    data = json.loads(cli("cache", "--cache", populated, "stats", "--json").stdout)
    assert data["requests"] == 4 and data["candidates"] == 16 and data["misses"] == 1
    assert data["requests_by_status"] == {"failed": 1, "ok": 3}


def test_ls_one_readable_line_per_request(populated: str) -> None:
    result = cli("cache", "ls", "--cache", populated)  # --cache after the command works too
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert len(lines) == 1 + 4  # header + rows
    mm = next(line for line in lines if "mm 1024x4096 @ 4096x1024 bf16" in line)
    assert "NVIDIA H100" in mm and "triton_mm" in mm and "0.7000 ms" in mm and "1.43x" in mm and mm.endswith("ok")
    assert any("conv 16x64x56x56 * 64x64x3x3 bf16" in line and "2.00x" in line for line in lines)
    assert any("addmm 512x4096 @ 4096x1024 + 1024 bf16" in line and "A100" in line for line in lines)
    assert any(line.startswith(" ") and line.endswith("failed") for line in lines)

    only = cli("cache", "--cache", populated, "ls", "--op", "addmm").stdout.splitlines()
    assert len(only) == 2 and "addmm" in only[1]
    assert len(cli("cache", "--cache", populated, "ls", "--device", "a100").stdout.splitlines()) == 2
    assert len(cli("cache", "--cache", populated, "ls", "--limit", "2").stdout.splitlines()) == 3
    rows = json.loads(cli("cache", "--cache", populated, "ls", "--json").stdout)
    assert {r["op"] for r in rows} == {"mm", "convolution", "bmm", "addmm"}
    assert next(r for r in rows if r["op"] == "mm")["speedup_over_aten"] == pytest.approx(1 / 0.7)


def test_ls_misses(populated: str) -> None:
    result = cli("cache", "--cache", populated, "ls", "--misses")
    lines = result.stdout.splitlines()
    assert result.exit_code == 0 and len(lines) == 2
    assert "mm 3x7 @ 7x5 bf16" in lines[1] and "train-0" in lines[1]
    assert json.loads(cli("cache", "--cache", populated, "ls", "--misses", "--json").stdout)[0]["count"] == 1


def test_show_sorts_candidates_and_marks_the_winner(populated: str) -> None:
    conv = _ids(populated)["convolution"]
    result = cli("cache", "--cache", populated, "show", str(conv))
    assert result.exit_code == 0
    out = result.stdout
    assert "conv 16x64x56x56 * 64x64x3x3 bf16" in out and "inputs_key" in out and "NVIDIA H100" in out
    candidate_lines = [line for line in out.splitlines() if " ms " in line or "FAILED" in line]
    assert [line.split()[0] for line in candidate_lines[:1]] == ["*"]  # the winner first, marked
    assert "0.5000 ms" in candidate_lines[0]
    assert "0.9000 ms" in candidate_lines[1] and "1.0000 ms" in candidate_lines[2]
    assert "FAILED" in candidate_lines[3] and "compile_error" in candidate_lines[3]
    assert "out of registers" in out
    as_json = json.loads(cli("cache", "--cache", populated, "show", str(conv), "--json").stdout)
    assert as_json["id"] == conv and len(as_json["candidates"]) == 4

    missing = cli("cache", "--cache", populated, "show", "9999")
    assert missing.exit_code == 2 and missing.stderr.startswith("Error: no cached request with id 9999")


def test_prune(populated: str) -> None:
    dry = cli("cache", "--cache", populated, "prune", "--device", "a100", "--dry-run")
    assert dry.exit_code == 0 and "Would remove 1 cached requests" in dry.stdout
    assert len(_ids(populated)) == 4
    done = cli("cache", "--cache", populated, "prune", "--device", "a100", "--older-than", "0s")
    assert done.exit_code == 0 and "Removed 1 cached requests" in done.stdout
    assert "addmm" not in _ids(populated)
    assert "Removed 0" in cli("cache", "--cache", populated, "prune", "--older-than", "2w").stdout

    bad = cli("cache", "--cache", populated, "prune", "--older-than", "30x")
    assert bad.exit_code == 2 and "not a duration" in bad.stderr
    nothing = cli("cache", "--cache", populated, "prune")
    assert nothing.exit_code == 2 and "at least one of" in nothing.stderr


def test_export_import_round_trip_via_files_and_stdio(populated: str, tmp_path: Path) -> None:
    path = tmp_path / "cache.jsonl"
    exported = cli("cache", "--cache", populated, "export", str(path))
    assert exported.exit_code == 0 and "Exported 4 results" in exported.stderr
    to_stdout = cli("cache", "--cache", populated, "export", "-")
    assert to_stdout.stdout == path.read_text()

    target = str(tmp_path / "copy.db")
    imported = cli("cache", "--cache", target, "import", str(path))
    assert imported.exit_code == 0 and "Imported 4 results (0 unchanged)" in imported.stdout
    again = cli("cache", "--cache", target, "import", "-", input=to_stdout.stdout)
    assert again.exit_code == 0 and "Imported 0 results (4 unchanged)" in again.stdout
    assert cli("cache", "--cache", target, "export", "-").stdout == path.read_text()


def test_bad_import_line_names_it_and_imports_nothing(tmp_path: Path, sqlite_url: str) -> None:
    good = json.dumps(make_result().to_json())
    bad = json.loads(good)
    bad["candidates"][0]["failure_kind"] = "melted"
    Store(sqlite_url).upgrade()
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(['{"format": "autotune-cache", "version": 1}', good, json.dumps(bad)]) + "\n")
    result = cli("cache", "--cache", sqlite_url, "import", str(path))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: {path}: line 3: candidates[0].failure_kind 'melted'")
    assert "nothing was imported" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert json.loads(cli("cache", "--cache", sqlite_url, "stats", "--json").stdout)["requests"] == 0


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://postgres@127.0.0.1:1/x",  # nothing listens there
        "postgresql://postgres@127.0.0.1:port/x",  # malformed
        "oracle://scott@db/x",  # unsupported
    ],
)
@pytest.mark.parametrize("command", [["stats"], ["ls"], ["import", "-"], ["upgrade"]])
def test_unusable_database_is_one_line_and_fast(url: str, command: list[str]) -> None:
    start = time.monotonic()
    result = cli("cache", "--cache", url, *command, input="")
    assert time.monotonic() - start < 5
    assert result.exit_code == 2  # bad input, as for every command
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ") and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_env_var_and_missing_database(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "env.db"
    monkeypatch.setenv("AUTOTUNE_CACHE", str(path))
    missing = cli("cache", "stats")
    assert missing.exit_code == 2 and "no cache database at" in missing.stderr and not path.exists()
    created = cli("cache", "upgrade")
    assert created.exit_code == 0 and f"upgraded from empty to {head_revision()}" in created.stdout
    assert f"already at revision {head_revision()}" in cli("cache", "upgrade").stdout
    assert json.loads(cli("cache", "stats", "--json").stdout)["url"] == f"sqlite:///{path}"


# ------------------------------------------------------------------ artifacts


@pytest.fixture
def with_artifacts(populated: str, tmp_path: Path) -> tuple[str, str]:
    """The populated cache plus three artifacts; returns (url, the signer's fingerprint)."""
    signer = generate(tmp_path / "keys" / "sweeper")
    long_key = "torch-2.13.0:" + "ab" * 40 + "/c" + "d" * 50 + ".so"
    rows = [
        ("fx_graph", "fxgraph-one", b"\x00\x01" * 500, "2.13.0+cu128", "NVIDIA H100 80GB HBM3", signer),
        ("fx_graph", "fxgraph-two", b"\xff" * 2000, "2.5.1", "NVIDIA A100-SXM4-80GB", signer),
        ("cpp_kernel", long_key, b"ELF" * 100, "2.13.0+cu128", "cpu", None),
    ]
    with Store(populated) as store:
        for kind, key, payload, torch_version, device, key_pair in rows:
            store.put_artifact(Artifact(
                kind=kind, key=key, payload=payload, torch_version=torch_version, device=device, host="sweeper-0",
                signature=key_pair.sign(kind, key, payload) if key_pair else None,
                public_key=key_pair.public_key if key_pair else None,
            ))
    return populated, signer.fingerprint


def test_stats_counts_artifacts_by_kind_and_signer(with_artifacts: tuple[str, str]) -> None:
    url, fingerprint = with_artifacts
    text = cli("cache", "--cache", url, "stats").stdout
    assert "artifacts          3" in text and "artifact bytes     3.3 kB" in text
    assert "artifacts by kind  cpp_kernel 1, fx_graph 2" in text
    assert f"artifact signers   {fingerprint} 2, unsigned 1" in text
    data = json.loads(cli("cache", "--cache", url, "stats", "--json").stdout)
    assert (data["artifacts"], data["artifact_bytes"]) == (3, 3300)
    assert data["artifact_signers"] == {fingerprint: 2, "unsigned": 1}


def test_ls_artifacts_with_filters(with_artifacts: tuple[str, str]) -> None:
    url, fingerprint = with_artifacts
    result = cli("cache", "--cache", url, "ls", "--artifacts")
    assert result.exit_code == 0
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["id", "kind", "key", "size", "signer", "torch", "device", "age"]
    assert len(rows) == 3 and rows[0].split()[1] == "cpp_kernel"  # newest first
    assert "torch-2.13.0:abab" in rows[0] and "…" in rows[0] and "dddd.so" in rows[0]  # both ends kept
    assert "unsigned" in rows[0] and "300 B" in rows[0] and rows[0].rstrip().endswith("0s")
    assert fingerprint in rows[1] and "2.0 kB" in rows[1] and "2.5.1" in rows[1] and "A100" in rows[1]

    def keys(*args: str) -> list[str]:
        return [r["key"] for r in json.loads(cli("cache", "--cache", url, "ls", "--artifacts", "--json", *args).stdout)]

    assert keys("--kind", "fx_graph") == ["fxgraph-two", "fxgraph-one"]
    assert keys("--signer", fingerprint, "--device", "h100") == ["fxgraph-one"]
    assert len(keys("--signer", "unsigned")) == 1 and keys("--limit", "1") == keys()[:1]
    [row] = json.loads(cli("cache", "--cache", url, "ls", "--artifacts", "--json", "--kind", "cpp_kernel").stdout)
    assert set(row) == {"id", "kind", "key", "size", "digest", "signer", "torch_version", "device", "host",
                        "created_at"} and row["signer"] is None
    none = cli("cache", "--cache", url, "ls", "--artifacts", "--signer", "0" * 16)
    assert none.exit_code == 0 and "No cached artifacts match" in none.stderr

    for bad in (["--kind", "fx_graph"], ["--artifacts", "--misses"], ["--artifacts", "--op", "mm"]):
        wrong = cli("cache", "--cache", url, "ls", *bad)
        assert wrong.exit_code == 2 and "Error: " in wrong.stderr and wrong.stdout == "", bad
    assert "add --artifacts" in cli("cache", "--cache", url, "ls", "--signer", fingerprint).stderr
    assert "'pickle' is not one of" in cli("cache", "--cache", url, "ls", "--artifacts", "--kind", "pickle").stderr


def test_prune_counts_requests_and_artifacts(with_artifacts: tuple[str, str]) -> None:
    url, _ = with_artifacts
    dry = cli("cache", "--cache", url, "prune", "--device", "a100", "--dry-run")
    assert "Would remove 1 cached requests and 1 artifacts" in dry.stdout
    done = cli("cache", "--cache", url, "prune", "--torch-version", "2.5.1")
    assert done.exit_code == 0 and "Removed 0 cached requests and 1 artifacts" in done.stdout
    assert "Removed 0 cached requests and 0 artifacts" in cli("cache", "--cache", url, "prune", "--older-than", "1d").stdout
    assert json.loads(cli("cache", "--cache", url, "stats", "--json").stdout)["artifacts"] == 2


def test_export_import_carry_artifacts(with_artifacts: tuple[str, str], tmp_path: Path) -> None:
    url, _ = with_artifacts
    path = tmp_path / "cache.jsonl"
    exported = cli("cache", "--cache", url, "export", str(path))
    assert exported.exit_code == 0 and "Exported 4 results and 3 artifacts" in exported.stderr
    target = str(tmp_path / "copy.db")
    imported = cli("cache", "--cache", target, "import", str(path))
    assert "Imported 4 results (0 unchanged) and 3 artifacts (0 already stored)" in imported.stdout
    again = cli("cache", "--cache", target, "import", "-", input=path.read_text())
    assert "Imported 0 results (4 unchanged) and 0 artifacts (3 already stored)" in again.stdout
    assert cli("cache", "--cache", target, "export", "-").stdout == path.read_text()


def test_bad_artifact_line_names_it_and_imports_nothing(tmp_path: Path, sqlite_url: str) -> None:
    good = json.dumps(make_result().to_json())
    artifact = {"kind": "fx_graph", "key": "k", "payload": "AAEC", "digest": "0" * 64, "signature": None,
                "public_key": None, "torch_version": "2.13.0", "device": "cpu", "host": "h",
                "created_at": "2025-01-01T00:00:00+00:00"}
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(['{"format": "autotune-cache", "version": 3}', good,
                               json.dumps({"artifact": artifact})]) + "\n")
    Store(sqlite_url).upgrade()
    result = cli("cache", "--cache", sqlite_url, "import", str(path))
    assert result.exit_code == 2 and f"{path}: line 3: artifact.digest" in result.stderr
    assert "nothing was imported" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    data = json.loads(cli("cache", "--cache", sqlite_url, "stats", "--json").stdout)
    assert (data["requests"], data["artifacts"]) == (0, 0)


# ------------------------------------------------------------------ their mistakes: one line each


def test_importing_a_binary_file_is_one_line_and_imports_nothing(tmp_path: Path, sqlite_url: str) -> None:
    Store(sqlite_url).upgrade()
    path = tmp_path / "cache.jsonl.gz"  # an export still gzipped
    path.write_bytes(gzip.compress(b'{"format": "autotune-cache", "version": 1}\n'))
    result = cli("cache", "--cache", sqlite_url, "import", str(path))
    assert result.exit_code == 2 and result.stderr.startswith(f"Error: {path}: not text")
    assert "autotune cache export" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_export_into_a_closed_pipe_stops_quietly(sqlite_url: str) -> None:
    """`autotune cache export - | head`: the reader had enough; no "choose a writable path"."""
    Store(sqlite_url).upgrade()
    proc = subprocess.Popen([sys.executable, "-c", "from autotune.cli import main; main()", "cache", "--cache",
                             sqlite_url, "export", "-"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # gone before the first line, as `head` is once it has read enough
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == CLOSED_PIPE.code and err == ""  # the contract's code (cli.EXIT_STATUSES)


def test_keys_new_on_an_existing_path_names_force(tmp_path: Path) -> None:
    path = str(tmp_path / "sweeper")
    assert cli("keys", "new", path).exit_code == 0
    again = cli("keys", "new", path)
    assert again.exit_code == 2 and len(again.stderr.strip().splitlines()) == 1
    assert again.stderr.startswith(f"Error: {path} already exists") and "--force" in again.stderr
    assert cli("keys", "new", "--force", path).exit_code == 0


def test_a_postgresql_url_without_psycopg_names_the_extra(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", "from autotune.cli import main; main()", "cache", "--cache",
                           "postgresql://postgres@127.0.0.1/test", "stats"], capture_output=True, text=True,
                          env=env_without("psycopg", tmp_path), timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'inductor-autotune[postgres]'" in lines[0], proc.stderr


def test_a_usage_error_is_one_line_naming_the_help(sqlite_url: str) -> None:
    result = cli("cache", "--cache", sqlite_url, "ls", "--limit", "many")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "'many' is not a valid integer" in result.stderr and "autotune cache ls --help" in result.stderr


def test_ls_fits_an_80_column_terminal(populated: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long device name is cut, not run across the columns; into a pipe the lines stay whole."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: a terminal
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "80")
    header, *rows = [line.replace("\x1b[1m", "").replace("\x1b[0m", "")
                     for line in cli("cache", "--cache", populated, "ls").stdout.splitlines()]
    assert max(len(line) for line in [header, *rows]) <= 80 and len(rows) == 4
    starts = [header.index(name) for name in ("device", "winner", "time")]
    assert all(row[start - 2:start] == "  " for row in rows for start in starts[:2])  # the columns line up
    assert any("A100-SXM4" in row for row in rows)  # the vendor's name goes first
