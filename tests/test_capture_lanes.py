"""Capture of several models at once, a process each (autotune/sweep/capture_lanes.py): the requests
each finds are the ones capture in the sweep's own process finds, and a capture process that
fails leaves its model to the sweep."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from autotune.inductor_glue.capture import capture_model
from autotune.inductor_glue.modelfile import load_model_file
from autotune.sweep.capture_lanes import CaptureSpec, Found, capture_side_by_side, prestart

# One worker runs the module: two of its tests read one fixture's capture processes.
pytestmark = pytest.mark.xdist_group("capture_lanes")

MODELS = Path(__file__).parent / "models"
MLP, BMM = str(MODELS / "tiny_mlp.py"), str(MODELS / "tiny_bmm.py")
WRONG = str(MODELS / "wrong_return.py")
KWARGS = {"batch_sizes": [None], "mode": "max-autotune", "inductor_config": {}, "train": False, "device": "cpu",
          "dynamic": False}


def _keys_in_turn(path: str) -> set[str]:
    captured = capture_model(load_model_file(path, "example"), **{**KWARGS, "batch_sizes": (None,)})
    return {request.key for request in captured.requests}


def test_two_models_captured_side_by_side_find_what_capture_in_turn_finds() -> None:
    found = list(capture_side_by_side([CaptureSpec(MLP, "example", KWARGS), CaptureSpec(BMM, "example", KWARGS)],
                                      lanes=2))
    ends = {f.model_path: f.result for f in found if f.done}
    assert set(ends) == {MLP, BMM} and all(ends.values()), ends
    for path in (MLP, BMM):
        streamed = {f.request.key for f in found if f.model_path == path and f.request is not None}
        assert streamed and streamed == _keys_in_turn(path)
        assert ends[path]["requests"] == len(streamed)  # type: ignore[index]
    first, second = sorted((r["began_at"], r["ended_at"]) for r in ends.values() if r)
    assert second[0] < first[1]  # the two processes overlapped in time


@pytest.fixture(scope="module")
def failed_then_replaced() -> list[Found]:
    """One lane's ends for three specs, read by the two tests after it (each capture process
    costs a torch import): the MLP's process fails for a reason of its own, not the model
    file's (here a keyword this capture does not take, as from a sweep of another version);
    the next model file cannot be built (bad input, in the fresh process that replaced the
    dead one); the tiny BMM is captured after it in that same process."""
    specs = [CaptureSpec(MLP, "example", {**KWARGS, "no_such_option": 1}), CaptureSpec(WRONG, "example", KWARGS),
             CaptureSpec(BMM, "example", KWARGS)]
    found = [f for f in capture_side_by_side(specs, lanes=1) if f.done]
    time.sleep(1.0)
    assert _capture_children() == []
    return found


def test_a_failed_capture_process_leaves_its_model_to_the_sweep_and_a_bad_model_is_its_one_line_error(
        failed_then_replaced: list[Found]) -> None:
    # The MLP's process failed: the sweep captures it itself. The bad model file is its one-line error.
    found = {f.model_path: f for f in failed_then_replaced}
    assert found[MLP] == Found(MLP, result=None, done=True)
    assert found[WRONG].done and found[WRONG].result is None
    assert "must return (module" in (found[WRONG].bad_input or "")


def _capture_children() -> list[int]:
    """This process's capture children still running (their /proc entries)."""
    children = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = next((line.split()[1] for line in status.splitlines() if line.startswith("PPid:")), "")
        state = next((line.split()[1] for line in status.splitlines() if line.startswith("State:")), "")
        if parent == str(os.getpid()) and b"autotune.sweep.capture_lanes" in cmdline and state != "Z":
            children.append(int(entry.name))
    return children


def test_a_stopped_capture_ends_its_processes_and_starts_no_more() -> None:
    captures = capture_side_by_side([CaptureSpec(MLP, "example", KWARGS), CaptureSpec(BMM, "example", KWARGS)],
                                    lanes=1)
    first = next(captures)  # the first model's process is running; the second's not begun
    assert first.model_path == MLP and _capture_children()
    captures.close()  # the sweep stopped (bad input elsewhere, an interrupt)
    time.sleep(1.0)
    assert _capture_children() == []


def test_a_lane_started_early_captures_its_models_in_turn_and_one_that_died_is_replaced(
        failed_then_replaced: list[Found]) -> None:
    # The lane's process, started before the specs were known, captures both of its models; a
    # spec whose capture crashes its process leaves the next to a fresh process.
    started = prestart(1, cuda=False)
    found = [f for f in capture_side_by_side([CaptureSpec(MLP, "example", KWARGS), CaptureSpec(BMM, "example", KWARGS)],
                                             lanes=1, started=started) if f.done]
    assert [f.result["pid"] for f in found if f.result] == [started[0].proc.pid] * 2, found
    # The MLP's spec crashed its process; the bad model file and the BMM after it went to a fresh one.
    assert [(f.model_path, f.result is not None) for f in failed_then_replaced] == [(MLP, False), (WRONG, False),
                                                                                   (BMM, True)]
    time.sleep(1.0)
    assert _capture_children() == []


def test_a_sweep_stopped_by_a_bad_model_file_ends_the_capture_processes_it_started(sqlite_url: str) -> None:
    from autotune.inductor_glue.modelfile import ModelFileError
    from autotune.settings import Settings
    from autotune.sweep import run_sweep
    from autotune.sweep.report import SweepOptions

    broken = str(MODELS / "broken_import.py")
    with pytest.raises(ModelFileError):
        run_sweep(SweepOptions(MLP, more_models=(broken,), dry_run=True),
                  Settings.from_env(cache=sqlite_url, device="cpu", capture_processes=2))
    assert _capture_children() == []
