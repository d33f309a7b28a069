"""Dynamo's package in the artifact tier (on by default; AUTOTUNE_DYNAMO_PACKAGE=0 turns it
off), end to end on CPU.

A signed sweep publishes the package of its end-to-end compile; a fresh job that imports
the model as a training script does (``import tiny_packaged``) loads it, verified, and
skips tracing. A job that imports the same file under another name cannot use it: the
package is refused with one warning and the model is traced, never a failed compile.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO
from test_hook import job

from autotune.cache import Store, signing
from autotune.cache.records import ARTIFACT_DYNAMO

MODEL = REPO / "tests" / "models" / "tiny_packaged.py"

pytestmark = [pytest.mark.xdist_group("dynamo-package"), pytest.mark.slow]


@pytest.fixture(scope="module")
def packaged_sweep(tmp_path_factory: pytest.TempPathFactory, signing_keys: dict[str, Path]) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('package') / 'cache.db'}"
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", "sweep", str(MODEL), "--device", "cpu", "--cache", url,
                           "--signing-key", str(signing_keys["writer"])],
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    return url


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE_")}


def _job(tmp_path: Path, url: str, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch, name: str,
         *args: str, package: str | None = None) -> dict[str, Any]:
    with monkeypatch.context() as patched:
        if package is not None:
            patched.setenv("AUTOTUNE_DYNAMO_PACKAGE", package)
        patched.setenv("AUTOTUNE_TRUSTED_KEYS", str(keys["writer.pub"]))
        return job(tmp_path, "--cache", url, *args, name=name)


def test_the_sweep_publishes_a_signed_package(packaged_sweep: str, signing_keys: dict[str, Path]) -> None:
    with Store(packaged_sweep, read_only=True) as store:
        packages = [info for info in store.artifacts(limit=1000) if info.kind == ARTIFACT_DYNAMO]
    assert len(packages) == 1, packages
    assert packages[0].signer == signing.load_signer(signing_keys["writer"]).fingerprint


def test_a_fresh_job_loads_the_package_skips_tracing_and_keeps_its_modes_cuda_graphs(
        packaged_sweep: str, tmp_path: Path, signing_keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    result = _job(tmp_path, packaged_sweep, signing_keys, monkeypatch, "loaded", "--model", "tiny_packaged")
    assert result["dynamo_cache"].get("dynamo_cache_hit") == 1, result["dynamo_cache"]
    assert result["stats"]["packages_refused"] == 0 and result["stats"]["artifacts_rejected"] == 0
    assert result["frames_compiled"] == 0  # nothing traced here
    # The loaded graph was set up under the job's max-autotune, CUDA graphs on, as a cold compile
    # is: on CPU Inductor considers them and counts the skip. Under the global config (torch's
    # own load) it never looks, and on a GPU the job ran without CUDA graphs.
    assert result["cudagraph_skips"] >= 1, result["cudagraph_skips"]
    torch.testing.assert_close(torch.load(result["output"]), torch.load(result["eager_output"]))


def test_a_package_for_a_module_this_job_cannot_import_is_refused_and_the_model_traced(
        packaged_sweep: str, tmp_path: Path, signing_keys: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The same file under another module name, and `tiny_packaged` (whose helper the package
    # names) nowhere on this job's path.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(MODEL, elsewhere / "renamed_model.py")
    result = _job(tmp_path, packaged_sweep, signing_keys, monkeypatch, "renamed", "--model", "renamed_model",
                  "--models-dir", str(elsewhere))
    assert result["returncode"] == 0
    assert result["stats"]["packages_refused"] == 1, (result["stats"], result["stderr"][-3000:])
    assert result["frames_compiled"] == 1  # traced and compiled here
    assert result["stderr"].count("does not apply here") == 1, result["stderr"][-2000:]
    torch.testing.assert_close(torch.load(result["output"]), torch.load(result["eager_output"]))


def test_with_packages_off_the_job_traces_and_loads_the_graphs(packaged_sweep: str, tmp_path: Path,
                                                               signing_keys: dict[str, Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    result = _job(tmp_path, packaged_sweep, signing_keys, monkeypatch, "off", "--model", "tiny_packaged", package="0")
    assert not result["dynamo_cache"], result["dynamo_cache"]  # Dynamo never looked for a package
    assert result["stats"]["artifacts_loaded"] >= 1 and result["stats"]["packages_refused"] == 0
    torch.testing.assert_close(torch.load(result["output"]), torch.load(result["eager_output"]))
