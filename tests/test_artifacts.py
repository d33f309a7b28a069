"""The artifact tier end to end: keys, signatures, the sweep publishing, a fresh job loading.

Real components throughout: Ed25519 from `cryptography`, SQLite and the local
PostgreSQL (a SELECT-only role), a local Ray sweep, and jobs in fresh processes
with fresh Inductor cache dirs compiling under max-autotune on this CPU.
"""

from __future__ import annotations

import io
import logging
import stat
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import torch
from click.testing import CliRunner
from test_hook import TINY, job

from autotune import cli
from autotune.cache import Store, signing
from autotune.cache.records import ARTIFACT_CPP_KERNEL, ARTIFACT_FX_GRAPH, Artifact
from autotune.job.artifacts import ArtifactTier
from autotune.job.hook_stats import HookStats

# One pytest-xdist worker runs every module that copies the session's signed sweep
# (tests/conftest.py), so that sweep runs once, not once per worker.
pytestmark = pytest.mark.xdist_group("signed_artifacts")  # its own sweep copy; the signed sweep is one per run (conftest)

PAYLOAD = bytes(range(256)) * 8


@pytest.fixture(scope="module")
def keys(signing_keys: dict[str, Path]) -> dict[str, Path]:
    """A trusted writer's key pair and a stranger's (the session's: the shared sweep signs with it)."""
    return signing_keys


# ------------------------------------------------------------------ keys and signatures


def test_keys_new_writes_a_private_key_only_its_owner_can_read(keys: dict[str, Path]) -> None:
    assert stat.S_IMODE(keys["writer"].stat().st_mode) == 0o600
    assert keys["writer.pub"].read_text().startswith("ed25519 ")
    assert signing.load_signer(keys["writer"]).public_key == signing.load_public_key(keys["writer.pub"])


def test_a_signature_binds_the_bytes_their_kind_and_their_key(keys: dict[str, Path]) -> None:
    signer = signing.load_signer(keys["writer"])
    trusted = signing.load_trusted([keys["writer.pub"]])
    signature = signer.sign(ARTIFACT_FX_GRAPH, "k1", PAYLOAD)
    public = signer.public_key

    assert trusted.verify(ARTIFACT_FX_GRAPH, "k1", PAYLOAD, signature, public) == signing.OK
    flipped = bytes([PAYLOAD[0] ^ 1]) + PAYLOAD[1:]
    assert trusted.verify(ARTIFACT_FX_GRAPH, "k1", flipped, signature, public) == signing.BAD_SIGNATURE
    assert trusted.verify(ARTIFACT_FX_GRAPH, "k1", PAYLOAD[:-7], signature, public) == signing.BAD_SIGNATURE
    assert trusted.verify(ARTIFACT_FX_GRAPH, "k2", PAYLOAD, signature, public) == signing.BAD_SIGNATURE
    assert trusted.verify(ARTIFACT_CPP_KERNEL, "k1", PAYLOAD, signature, public) == signing.BAD_SIGNATURE
    assert trusted.verify(ARTIFACT_FX_GRAPH, "k1", PAYLOAD, signature[:40], public) == signing.BAD_SIGNATURE
    assert trusted.verify(ARTIFACT_FX_GRAPH, "k1", PAYLOAD, None, None) == signing.UNSIGNED
    stranger = signing.load_signer(keys["stranger"])
    assert trusted.verify(ARTIFACT_FX_GRAPH, "k1", PAYLOAD, stranger.sign(ARTIFACT_FX_GRAPH, "k1", PAYLOAD),
                          stranger.public_key) == signing.UNKNOWN_KEY


@pytest.mark.parametrize("problem", ["missing", "directory", "malformed"])
@pytest.mark.parametrize("command", ["run", "sweep"])
def test_a_bad_key_file_is_one_line_naming_it_and_exit_2(problem: str, command: str, tmp_path: Path,
                                                         keys: dict[str, Path]) -> None:
    path = tmp_path / "key"
    if problem == "directory":
        path.mkdir()
    elif problem == "malformed":
        path.write_text("not a key\n")
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    args = {"run": ["run", "--signing-key", str(path), str(script)],
            "sweep": ["sweep", TINY, "--device", "cpu", "--signing-key", str(path)]}[command]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and "autotune keys new" in lines[0], result.output
    assert "ran" not in result.output


def test_a_malformed_trusted_key_file_is_named_too(tmp_path: Path) -> None:
    pub = tmp_path / "team.pub"
    pub.write_text("ed25519 abcd\n")
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    result = CliRunner().invoke(cli.main, ["run", "--trusted-key", str(pub), str(script)])
    assert result.exit_code == 2 and str(pub) in result.output and "ran" not in result.output


# ------------------------------------------------------------------ the reader's checks


def _tier(store: Store, trusted: signing.TrustedKeys, signer: signing.Signer | None = None) -> ArtifactTier:
    def call(fn: Any, _timeout: float) -> Any:
        return fn(store)

    return ArtifactTier(trusted=trusted, signer=signer, device="cpu", stats=HookStats(), call=call,
                        submit=lambda work: work(), timeout=2.0)


def _signed(signer: signing.Signer, key: str, payload: bytes = PAYLOAD, **changes: Any) -> Artifact:
    fields = dict(kind=ARTIFACT_FX_GRAPH, key=key, payload=payload,
                  signature=signer.sign(ARTIFACT_FX_GRAPH, key, payload), public_key=signer.public_key,
                  torch_version=torch.__version__, device="cpu")
    return Artifact(**{**fields, **changes})


@pytest.mark.torch_subset
def test_tampered_artifacts_are_never_handed_to_torch(store: Store, keys: dict[str, Path],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    writer, stranger = signing.load_signer(keys["writer"]), signing.load_signer(keys["stranger"])
    tier = _tier(store, signing.load_trusted([keys["writer.pub"]]))
    good = _signed(writer, "good")
    other = _signed(writer, "other", payload=b"other bytes")
    store.put_artifact(good)
    store.put_artifact(_signed(writer, "flipped", payload=bytes([PAYLOAD[0] ^ 0x80]) + PAYLOAD[1:],
                               signature=good.signature))
    store.put_artifact(_signed(stranger, "stranger"))
    store.put_artifact(_signed(writer, "swapped", payload=other.payload, signature=good.signature))
    store.put_artifact(_signed(writer, "truncated", payload=PAYLOAD[:100], signature=good.signature))
    store.put_artifact(_signed(writer, "unsigned", signature=None, public_key=None))

    caplog.set_level(logging.INFO, logger="autotune.job.artifacts")
    assert tier.fetch(ARTIFACT_FX_GRAPH, "good") == PAYLOAD
    for key in ("flipped", "stranger", "swapped", "truncated", "unsigned"):
        assert tier.fetch(ARTIFACT_FX_GRAPH, key) is None, key
    assert tier.fetch(ARTIFACT_FX_GRAPH, "absent") is None
    assert (tier.stats.artifacts_loaded, tier.stats.artifacts_rejected) == (1, 5)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "rejected" in warnings[0].getMessage()


@pytest.mark.torch_subset
def test_bytes_changed_in_the_database_are_rejected(store: Store, keys: dict[str, Path]) -> None:
    writer = signing.load_signer(keys["writer"])
    store.put_artifact(_signed(writer, "k"))
    with store._engine().begin() as conn:  # someone with write access edits the row behind our back
        conn.execute(sa.text("UPDATE artifacts SET payload = :p"), {"p": b"\xff" + PAYLOAD[1:]})
    tier = _tier(store, signing.load_trusted([keys["writer.pub"]]))
    assert tier.fetch(ARTIFACT_FX_GRAPH, "k") is None
    assert tier.stats.artifacts_rejected == 1


@pytest.mark.torch_subset
def test_without_trusted_keys_nothing_is_read(store: Store, keys: dict[str, Path]) -> None:
    store.put_artifact(_signed(signing.load_signer(keys["writer"]), "k"))
    tier = _tier(store, signing.NO_TRUSTED_KEYS)
    assert tier.fetch(ARTIFACT_FX_GRAPH, "k") is None
    assert (tier.stats.artifacts_loaded, tier.stats.artifacts_rejected) == (0, 0)


# ------------------------------------------------------------------ sweep -> fresh job


@pytest.fixture(scope="module")
def signed_sweep(signed_tiny_sweep: str) -> str:
    """A SQLite cache after `autotune sweep --signing-key`: winners and signed artifacts."""
    return signed_tiny_sweep


@pytest.fixture(scope="module")
def plain_output(tmp_path_factory: pytest.TempPathFactory) -> torch.Tensor:
    """The tiny model compiled without the hook: what every job below must compute."""
    return torch.load(job(tmp_path_factory.mktemp("plain"), "--no-hook", name="plain")["output"])


def _run_job(tmp_path: Path, url: str, name: str, monkeypatch: pytest.MonkeyPatch, **env: str) -> dict[str, Any]:
    with monkeypatch.context() as patched:
        for key, value in env.items():
            patched.setenv(key, value)
        return job(tmp_path, "--cache", url, name=name)


def test_a_fresh_job_loads_the_signed_artifacts_compiles_no_cpp_and_computes_the_same(
        signed_sweep: str, tmp_path: Path, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
        plain_output: torch.Tensor) -> None:
    with Store(signed_sweep, read_only=True) as store:
        stored = store.artifacts(limit=1000)
    assert stored and all(info.signer == signing.load_signer(keys["writer"]).fingerprint for info in stored)
    assert {info.kind for info in stored} >= {ARTIFACT_CPP_KERNEL}

    loaded = _run_job(tmp_path, signed_sweep, "loaded", monkeypatch, AUTOTUNE_TRUSTED_KEYS=str(keys["writer.pub"]))
    stats = loaded["stats"]
    assert stats["artifacts_loaded"] >= 1 and stats["artifacts_rejected"] == 0, stats
    assert stats["hits"] == 2 and stats["misses"] == 0 and loaded["benchmarks"] == 0
    # Its kernels and Inductor's vector-ISA probes (built in every fresh cache dir) are served:
    # a job on a fresh node compiles no C++ library.
    assert stats["cpp_compiled"] == 0, stats
    torch.testing.assert_close(torch.load(loaded["output"]), plain_output)


def test_artifacts_from_an_untrusted_signer_are_compiled_instead(
        signed_sweep: str, tmp_path: Path, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
        plain_output: torch.Tensor) -> None:
    result = _run_job(tmp_path, signed_sweep, "untrusted", monkeypatch, AUTOTUNE_TRUSTED_KEYS=str(keys["stranger.pub"]))
    stats = result["stats"]
    assert stats["artifacts_loaded"] == 0 and stats["artifacts_rejected"] >= 1, stats
    assert result["stderr"].count("rejected a") == 1, result["stderr"][-2000:]
    torch.testing.assert_close(torch.load(result["output"]), plain_output)


def _copy(source_url: str, target_url: str) -> None:
    """The whole cache, artifacts with their signatures, through export and import."""
    buffer = io.StringIO()
    with Store(source_url, read_only=True) as source:
        source.export_jsonl(buffer)
    buffer.seek(0)
    with Store(target_url) as target:
        target.import_jsonl(buffer)


def test_flipped_bytes_in_every_artifact_are_compiled_instead(signed_sweep: str, tmp_path: Path,
                                                              keys: dict[str, Path],
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              plain_output: torch.Tensor) -> None:
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    _copy(signed_sweep, url)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        rows = conn.execute(sa.text("SELECT id, payload FROM artifacts")).all()
        for row_id, payload in rows:
            payload = bytearray(payload)
            payload[len(payload) // 2] ^= 0xFF
            conn.execute(sa.text("UPDATE artifacts SET payload = :p WHERE id = :i"), {"p": bytes(payload), "i": row_id})
    engine.dispose()
    result = _run_job(tmp_path, url, "flipped", monkeypatch, AUTOTUNE_TRUSTED_KEYS=str(keys["writer.pub"]))
    stats = result["stats"]
    assert stats["artifacts_loaded"] == 0 and stats["artifacts_rejected"] == len(rows), stats
    torch.testing.assert_close(torch.load(result["output"]), plain_output)


@pytest.mark.slow
def test_a_read_only_postgres_role_loads_artifacts_and_writes_nothing(
        signed_sweep: str, readonly_postgres_url: tuple[str, str], tmp_path: Path, keys: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    writer_url, reader_url = readonly_postgres_url
    _copy(signed_sweep, writer_url)
    with Store(writer_url) as store:
        before = store.stats()
    result = _run_job(tmp_path, reader_url, "reader", monkeypatch, AUTOTUNE_TRUSTED_KEYS=str(keys["writer.pub"]),
                      AUTOTUNE_READ_ONLY="1", AUTOTUNE_SIGNING_KEY=str(keys["writer"]))
    stats = result["stats"]
    assert stats["artifacts_loaded"] >= 1 and stats["errors"] == 0 and stats["artifacts_published"] == 0, stats
    with Store(writer_url) as store:
        after = store.stats()
    assert {k: v for k, v in after.items() if k != "size_bytes"} == \
        {k: v for k, v in before.items() if k != "size_bytes"}


# ------------------------------------------------------------------ the sweep's publishing compile


@pytest.mark.torch_subset
def test_a_pass_that_withholds_its_artifacts_publishes_none_and_keeps_its_data(
        tmp_path: Path, keys: dict[str, Path]) -> None:
    """The sweep's publishing compile withholds its artifacts when it tuned a kernel after
    compiling it (autotune/sweep/end_to_end.py): none is stored, queued or later, while its data
    writes (here a GEMM winner written back) are kept; the compile after it publishes."""
    from autotune.inductor_glue.capture import fresh_inductor
    from autotune.job.hook import warm_start_for_pass
    from autotune.settings import Settings

    url = f"sqlite:///{tmp_path / 'pass.db'}"
    settings = Settings(cache=url, signing_key=str(keys["writer"]))
    with Store(url) as created:  # the sweep creates its database before the pass runs
        created.stats()

    def compile_once(withhold: bool) -> tuple[HookStats, int]:
        dropped = 0
        model, inputs = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU()).eval(), (torch.randn(8, 32),)
        with fresh_inductor({"freezing": True}), warm_start_for_pass(settings) as handle, torch.no_grad():
            torch.compile(model, mode="max-autotune")(*inputs)  # frozen: a C++ GEMM to tune
            if withhold:
                dropped = handle.withhold_artifacts()
            handle.flush()
        return handle.stats, dropped

    withheld, dropped = compile_once(withhold=True)
    with Store(url, read_only=True) as store:
        assert store.artifacts(limit=100) == []
        assert store.stats()["requests_by_status"].get("ok", 0) >= 1  # the GEMM tuned on its miss
    assert dropped >= 1 and withheld.artifacts_published == 0 and withheld.misses >= 1, withheld

    published, _ = compile_once(withhold=False)
    with Store(url, read_only=True) as store:
        assert len(store.artifacts(limit=100)) == published.artifacts_published >= 1
    assert published.hits >= 1 and published.misses == 0, published
