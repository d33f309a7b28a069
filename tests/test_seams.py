"""The private torch seams: declared once, resolving on this torch, and reported when one is missing.
tests/test_seam_names.py checks that every private name the code touches is declared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune import cli
from autotune.cache import Store
from autotune.inductor_glue import seams

# The fast subset CI also runs on the oldest supported torch (.ci/run).
pytestmark = pytest.mark.torch_subset

TESTS = Path(__file__).parent
# Deleted in the subprocess below: a patch seam of a feature a CPU job uses, whose absence
# leaves torch's own compile intact (torch calls it only with caching_precompile on).
DELETED = seams.PACKAGE_LOAD


def test_every_declared_seam_resolves_on_the_installed_torch() -> None:
    import torch

    missing = {seam.path: seam.problem() for seam in seams.SEAMS if seam.required and seam.problem()}
    assert missing == {}, f"torch {torch.__version__}"


def test_each_seam_is_declared_once_and_patched_by_one_patch() -> None:
    from autotune.inductor_glue import capture, descent, fusion, padding, pinning  # noqa: F401
    from autotune.inductor_glue.patching import _PATCHED
    from autotune.job import artifacts, dynamo_package, kernel_configs  # noqa: F401 - their patches

    paths = [seam.path for seam in seams.SEAMS]
    assert len(paths) == len(set(paths))
    patch_seams = {seam.path for seam in seams.SEAMS if seam.kind == seams.PATCH}
    assert _PATCHED <= patch_seams
    with pytest.raises(ValueError, match="already has its patch"):
        from autotune.inductor_glue.patching import StackedPatch

        StackedPatch(seams.COORDINATE_DESCENT, lambda original, patch: original)


def test_doctor_reports_every_feature_on_with_this_torch_and_exits_0() -> None:
    result = CliRunner().invoke(cli.main, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [f["name"] for f in report["features"]] == [f.name for f in seams.FEATURES]
    assert all(f["on"] and not f["missing"] for f in report["features"]), report["features"]
    import torch

    assert report["torch"] == torch.__version__ and report["python"] and report["device"] and report["triton"]
    text = CliRunner().invoke(cli.main, ["doctor"])
    assert text.exit_code == 0
    lines = text.output.splitlines()
    assert lines[0].startswith("torch") and "triton" in lines[1] and "Python" in lines[2] and "device" in lines[3]
    assert all(any(line.startswith(f.name) and " on" in line for line in lines) for f in seams.FEATURES)


def test_a_torch_without_a_seam_gets_doctors_off_and_exit_1_and_one_warning_and_still_compiles(
        tmp_path: Path, signing_keys: dict[str, Path]) -> None:
    """In a process where a seam was deleted: doctor names it, off, exit 1; warm_start() warns
    once for its feature and the job compiles, the other features working (its C++ kernels
    are published: the artifact tier's own seams resolve)."""
    doctor_out, job_out = tmp_path / "doctor.json", tmp_path / "job.json"
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    env = {**os.environ, "AUTOTUNE_SIGNING_KEY": str(signing_keys["writer"]), "PYTHONUNBUFFERED": "1",
           "AUTOTUNE_LOOKUP_TIMEOUT": "60"}  # a loaded CI machine must not turn the cache off mid-test
    proc = subprocess.run([sys.executable, str(TESTS / "seam_job.py"), DELETED.path, str(doctor_out),
                           str(job_out), "--cache", url], check=False, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]

    doctor = json.loads(doctor_out.read_text())
    assert doctor["exit_code"] == 1
    off = {f["key"]: f for f in doctor["report"]["features"] if not f["on"]}
    assert list(off) == [seams.DYNAMO_PACKAGE.key]
    assert [m["seam"] for m in off[seams.DYNAMO_PACKAGE.key]["missing"]] == [DELETED.path]

    warnings = [line for line in proc.stderr.splitlines() if " is off: " in line]
    assert len(warnings) == 1, proc.stderr[-3000:]
    assert warnings[0].startswith(f"autotune: {seams.DYNAMO_PACKAGE.name} is off") and DELETED.path in warnings[0]
    stats = json.loads(job_out.read_text())["stats"]
    assert stats["misses"] == 2 and stats["errors"] == 0, stats
    with Store(url, read_only=True) as store:  # the job's writes are done once it has exited
        assert len(store.list_results()) == 2 and store.artifacts(limit=100)


def test_a_renamed_seam_resolves_under_either_name_and_is_missing_under_neither() -> None:
    """A seam torch renamed (torch 2.15: bypass_current_compile, benchmark_template_fusion)
    resolves to whichever of its names this torch has; with none, it is missing under its own."""
    renamed = seams.Seam("torch._inductor.config", "autotune_no_such_option", seams.ASSIGN, (), "a test",
                         alternatives=("max_autotune",))
    assert renamed.present_attr() == "max_autotune" and renamed.problem() is None
    gone = seams.Seam("torch._inductor.config", "autotune_no_such_option", seams.ASSIGN, (), "a test",
                      alternatives=("autotune_nor_this_one",))
    assert gone.present_attr() == gone.attr
    assert "torch._inductor.config.autotune_no_such_option" in (gone.problem() or "")


def test_the_capture_sets_inductor_options_under_their_current_names() -> None:
    """torch 2.15 renamed benchmark_epilogue_fusion; its old name, an alias there, warns
    (FutureWarning) each process that reads or sets it."""
    import torch._inductor.config as inductor_config

    from autotune.inductor_glue.capture import capture_config

    entries = vars(inductor_config)["_config"]
    for name in capture_config():
        entry = entries[name]
        assert not getattr(entry, "deprecated", False) and getattr(entry, "alias", None) is None, name


def test_the_selector_takes_torchs_benchmark_policy_off_the_inputs_key() -> None:
    """torch 2.15 looks timings up under the inputs key and a benchmark policy after it; a
    request is described and stored under the inputs key alone (as on earlier torches)."""
    from torch._inductor import select_algorithm

    from autotune.inductor_glue.inductor import _plain_inputs_key

    key = "torch.float32;cpu;[8, 16];[16, 1];0"
    assert _plain_inputs_key(key) == key
    make = getattr(select_algorithm, "create_benchmark_cache_key", None)
    for device, cudagraphs in (("cpu", False), ("cuda", True)):
        if make is not None:
            assert make(key, device, cudagraphs) != key and _plain_inputs_key(make(key, device, cudagraphs)) == key
