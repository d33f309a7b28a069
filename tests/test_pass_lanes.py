"""The sweep's end-to-end passes in lanes (autotune/pointwise.py ``PointwisePass``): several
models' passes side by side, a pass whose process is killed run again, and a pass that crashes
recorded against its model while the others go on."""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from factories import in_process_sweep

from autotune.pointwise import PointwisePass, PointwiseSpec

MODELS = Path(__file__).parent / "models"
MLP, BMM = str(MODELS / "tiny_mlp.py"), str(MODELS / "tiny_bmm.py")


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("lanes")
    in_process_sweep(MLP, folder)
    return str(in_process_sweep(BMM, folder)["url"])


@pytest.fixture(autouse=True)
def no_fault_markers() -> Iterator[None]:
    yield
    for marker in glob.glob(os.path.join(tempfile.gettempdir(), f"autotune-fault-{os.getpid()}-*")):
        os.remove(marker)


def _spec(model: str, url: str) -> PointwiseSpec:
    return PointwiseSpec(model, "example", [None], "max-autotune", {}, False, url, device="cpu")


def test_two_models_passes_run_side_by_side(swept: str) -> None:
    passes = PointwisePass([_spec(MLP, swept), _spec(BMM, swept)], gpus=2)
    assert len(passes.units) == 2  # a lane each
    report = passes.run(timeout=300)
    assert report.error is None and report.failed == [] and report.gemm_misses == 0, report.failed
    spans = {model: (min(p["began_at"] for p in report.passes if p["model"] == model),
                     max(p["began_at"] + p["seconds"] for p in report.passes if p["model"] == model))
             for model in (MLP, BMM)}
    began, ended = zip(*spans.values())
    assert max(began) < min(ended), report.passes  # the two models' compiles overlapped


def test_a_killed_pass_runs_again_and_a_crashing_one_is_recorded_against_its_model(
        swept: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # One lane: the recommender-sized bmm model's pass crashes, the MLP's is SIGKILLed once.
    monkeypatch.setenv("AUTOTUNE_FAULT_INJECT", "crash:pass:tiny_bmm,kill-once:pass:tiny_mlp")
    report = PointwisePass([_spec(BMM, swept), _spec(MLP, swept)], gpus=1).run(timeout=300)
    assert [f["model"] for f in report.failed] == [BMM], report.failed
    assert "exited 17" in report.failed[0]["error"]  # a crash is recorded, not run again
    assert report.requeued == 1  # the killed one ran again in a fresh process
    assert {p["model"] for p in report.passes} == {MLP} and report.gemm_misses == 0  # and compiled
