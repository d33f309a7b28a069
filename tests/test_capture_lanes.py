"""Capture of several models at once, a process each (autotune/capture_lanes.py): the requests
each finds are the ones capture in the sweep's own process finds, and a capture process that
fails leaves its model to the sweep."""

from __future__ import annotations

from pathlib import Path

from autotune.capture_lanes import CaptureSpec, Found, capture_side_by_side
from autotune.inductor_glue.capture import capture_model
from autotune.inductor_glue.modelfile import load_model_file

MODELS = Path(__file__).parent / "models"
MLP, BMM = str(MODELS / "tiny_mlp.py"), str(MODELS / "tiny_bmm.py")
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


def test_a_failed_capture_process_leaves_its_model_to_the_sweep() -> None:
    # Not the model file's fault (that is bad input, below) but the process's: here a keyword this
    # capture does not take, as from a sweep of another version. The sweep captures it itself.
    found = list(capture_side_by_side([CaptureSpec(MLP, "example", {**KWARGS, "no_such_option": 1})], lanes=2))
    assert found == [Found(MLP, result=None, done=True)]


def test_a_model_that_cannot_be_built_is_its_own_one_line_error() -> None:
    wrong = str(MODELS / "wrong_return.py")
    (found,) = capture_side_by_side([CaptureSpec(wrong, "example", KWARGS)], lanes=2)
    assert found.done and found.result is None and "must return (module" in (found.bad_input or "")
