"""The sweep's end-to-end passes in lanes (autotune/sweep/end_to_end.py ``EndToEndPass``): passes side
by side, a pass whose process is killed run again, a pass that crashes recorded against its
model while its lane goes on, and a pass that waits for its model's GEMMs while a ready one runs
(autotune/sweep/pass_readiness.py)."""

from __future__ import annotations

import glob
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.sweep.end_to_end import EndToEndPass, EndToEndProcess
from autotune.sweep.pass_readiness import ModelReadiness
from autotune.sweep.pass_spec import EndToEndSpec

MODELS = Path(__file__).parent / "models"
MLP, BMM, BLOCK = str(MODELS / "tiny_mlp.py"), str(MODELS / "tiny_bmm.py"), str(MODELS / "tiny_block.py")


@pytest.fixture(scope="module")
def swept(signed_tiny_sweep: str) -> str:
    """The session's sweep of tiny_mlp.py: its passes compile from stored winners."""
    return signed_tiny_sweep


@pytest.fixture(autouse=True)
def no_fault_markers() -> Iterator[None]:
    yield
    for marker in glob.glob(os.path.join(tempfile.gettempdir(), f"autotune-fault-{os.getpid()}-*")):
        os.remove(marker)


def _spec(model: str, url: str, mode: str = "max-autotune") -> EndToEndSpec:
    return EndToEndSpec(model, "example", [None], mode, {}, False, url, device="cpu")


def test_two_passes_run_side_by_side(swept: str) -> None:
    # Two passes of the swept model (another mode: the same GEMMs on a CPU), a lane each.
    passes = EndToEndPass([_spec(MLP, swept), _spec(MLP, swept, "max-autotune-no-cudagraphs")], gpus=2)
    assert len(passes.units) == 2
    report = passes.run(timeout=300)
    assert report.error is None and report.failed == [] and report.gemm_misses == 0, report.failed
    first, second = report.passes  # one compile each, in lane order
    assert max(first["began_at"], second["began_at"]) < min(first["began_at"] + first["seconds"],
                                                             second["began_at"] + second["seconds"]), report.passes


@pytest.mark.slow  # CI's 15 minutes; tests/test_cluster.py covers the lanes added on a cluster's nodes (full suite too)
def test_a_lane_added_while_the_pass_runs_takes_a_pass_no_lane_has_begun(swept: str) -> None:
    # One planned lane: the MLP's pass is its first, the bmm's waits for a lane. A lane added as
    # the pass runs (as the other nodes' lanes are on a cluster) takes the bmm's at once.
    passes = EndToEndPass([_spec(MLP, swept), _spec(BMM, swept)], gpus=1)
    added: list[EndToEndSpec] = []

    def make(spec: EndToEndSpec) -> EndToEndProcess:
        added.append(spec)
        return EndToEndProcess(spec)

    assert passes.add_lanes([make]) == 1
    report = passes.run(timeout=300)
    assert report.error is None and report.failed == [] and [s.model_path for s in added] == [BMM], report.failed
    mlp, bmm = sorted(report.passes, key=lambda p: p["model"] != MLP)
    assert bmm["began_at"] < mlp["began_at"] + mlp["seconds"], report.passes  # side by side
    assert passes.add_lanes([make]) == 0  # every lane has ended: nothing is left to take


def test_a_killed_pass_runs_again_and_a_crashing_one_is_recorded_against_its_model(
        swept: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # One lane: the bmm model's pass crashes as it begins, then the MLP's is SIGKILLed once.
    monkeypatch.setenv("AUTOTUNE_FAULT_INJECT", "crash:pass:tiny_bmm,kill-once:pass:tiny_mlp")
    report = EndToEndPass([_spec(BMM, swept), _spec(MLP, swept)], gpus=1).run(timeout=300)
    assert [f["model"] for f in report.failed] == [BMM], report.failed
    assert "exited 17" in report.failed[0]["error"]  # a crash is recorded, not run again
    assert report.requeued == 1  # the killed one ran again in a fresh process
    assert {p["model"] for p in report.passes} == {MLP} and report.gemm_misses == 0  # and compiled


def test_a_pass_waits_for_its_models_gemms_a_ready_one_goes_first_and_one_with_nothing_new_is_left_out(
        swept: str) -> None:
    # One lane. The block model, dealt first, has nothing new (every GEMM cached, its last pass
    # finished); the bmm model's GEMM is still being tuned; the MLP's are answered. The lane
    # drops the first, runs the MLP's pass meanwhile, and the bmm's once its GEMM is answered.
    readiness = ModelReadiness()
    readiness.skip(BLOCK)
    for model in (BMM, MLP):
        readiness.captured(model)
    readiness.needs(BMM, "bmm-request")
    answered_at: list[float] = []
    done: list[str] = []

    def on_done(model: str) -> None:
        done.append(model)
        if model == MLP:  # tuning answers the bmm's request after the MLP's pass
            answered_at.append(time.time())
            readiness.answered("bmm-request")

    passes = EndToEndPass([_spec(BLOCK, swept), _spec(BMM, swept), _spec(MLP, swept)], gpus=1)
    report = passes.run(timeout=300, on_done=on_done, readiness=readiness)
    assert report.error is None and report.failed == [], report.failed
    assert [p["model"] for p in report.passes] == [MLP, BMM], report.passes
    assert report.passes[1]["began_at"] >= answered_at[0] - 0.01
    assert passes.skipped == report.skipped == [BLOCK] and done == [BLOCK, MLP, BMM]
    assert passes.first[0].proc.poll() is not None  # the process started for the block model ended


def test_readiness_waits_for_capture_and_every_queued_request() -> None:
    readiness = ModelReadiness()
    readiness.needs("a.py", "k1")
    readiness.needs("b.py", "k1")  # found by both models, queued once
    readiness.needs("b.py", "k2")
    assert not readiness.ready("a.py")  # capture of a.py not complete
    readiness.captured("a.py")
    readiness.captured("b.py")
    assert readiness.waits_on("k1") and not readiness.ready("a.py")
    readiness.answered("k1")
    assert readiness.ready("a.py") and not readiness.ready("b.py")
    assert readiness.first_ready(["b.py", "a.py"], timeout=0.1) == 1
    began = time.perf_counter()
    assert readiness.first_ready(["b.py"], timeout=0.2) is None and time.perf_counter() - began >= 0.2
    threading.Timer(0.1, readiness.release).start()  # tuning ended: every pass may go
    assert readiness.first_ready(["b.py"], timeout=30) == 0

