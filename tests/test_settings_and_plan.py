"""Pure parts: settings from flags and AUTOTUNE_* variables, planning, shape summaries."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cache.records import InputLayout, TuningRequest
from autotune.settings import Settings, SettingsError, warm_start_settings
from autotune.shapes import shape_summary
from autotune.sweep.plan import dedupe, make_plan


def _request(op: str = "mm", m: int = 64, hashes: tuple[str, ...] = ("a", "b")) -> TuningRequest:
    layouts = (
        InputLayout((m, 128), (128, 1), 0, "torch.bfloat16", "cuda"),
        InputLayout((128, 256), (256, 1), 0, "torch.bfloat16", "cuda"),
    )
    key = repr([(lay.device, lay.dtype, *lay.sizes, *lay.strides, lay.offset) for lay in layouts])
    return TuningRequest(op, key, "highest", layouts, {}, hashes)


def test_settings_read_environment_and_flags_win() -> None:
    env = {"AUTOTUNE_CACHE": "sqlite:///x.db", "AUTOTUNE_WORKERS": "3", "AUTOTUNE_WRITE_BACK": "no"}
    settings = Settings.from_env(env)
    assert (settings.cache, settings.workers, settings.write_back) == ("sqlite:///x.db", 3, False)
    assert Settings.from_env(env, workers=5, cache="postgresql://h/db").workers == 5
    assert Settings.from_env(env, cache=None).cache == "sqlite:///x.db"  # None means "not given"
    assert Settings.from_env({"AUTOTUNE_JOBS_PER_GPU": "2"}).jobs_per_gpu == 2
    assert Settings.from_env({"AUTOTUNE_JOBS_PER_GPU": "2"}, jobs_per_gpu=6).jobs_per_gpu == 6


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [("AUTOTUNE_WORKERS", "many", "AUTOTUNE_WORKERS"), ("AUTOTUNE_READ_ONLY", "maybe", "boolean"),
     ("AUTOTUNE_ON_MISS", "panic", "on_miss"), ("AUTOTUNE_DEVICE", "tpu", "device"),
     ("AUTOTUNE_JOBS_PER_GPU", "0", "AUTOTUNE_JOBS_PER_GPU")],
)
def test_settings_fail_loudly_on_bad_environment(name: str, value: str, needle: str) -> None:
    with pytest.raises(SettingsError, match=needle):
        Settings.from_env({name: value})


def test_warm_start_keeps_the_environment_unless_its_arguments_say_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_ON_MISS", "aten")
    monkeypatch.setenv("AUTOTUNE_WRITE_BACK", "0")
    from_env = warm_start_settings()
    assert (from_env.on_miss, from_env.write_back) == ("aten", False)
    given = warm_start_settings(on_miss="error", write_back=True)
    assert (given.on_miss, given.write_back) == ("error", True)
    monkeypatch.delenv("AUTOTUNE_ON_MISS")
    monkeypatch.delenv("AUTOTUNE_WRITE_BACK")
    default = warm_start_settings()
    assert (default.on_miss, default.write_back) == ("tune", True)


def test_dedupe_merges_identical_requests_and_their_candidates() -> None:
    merged = dedupe([_request(hashes=("a",)), _request(m=32), _request(hashes=("b", "c"))])
    assert len(merged) == 2
    assert merged[0].choice_hashes == ("a", "b", "c")


def test_plan_skips_cached_unless_forced() -> None:
    requests = [_request(m=32), _request(m=64)]
    plan = make_plan(requests, {requests[0].key})
    assert [r.key for r in plan.cached] == [requests[0].key]
    assert [r.key for r in plan.to_tune] == [requests[1].key]
    assert len(make_plan(requests, {requests[0].key}, force=True).to_tune) == 2


def test_shape_summary_reads_like_the_op() -> None:
    assert shape_summary(_request()) == "mm 64x128 @ 128x256 bf16"


def test_an_in_graph_verdict_weighs_only_the_choices_timed_in_the_graph() -> None:
    from factories import make_result

    from autotune.job.in_graph import SOURCE, verdict

    # Isolated: ATen 1.0 ms, three templates at 0.9, 0.8 and 0.7 ms (the winner).
    stored = make_result(times=[1.0, 0.9, 0.8, 0.7])
    aten, pinned = stored.candidates[0], stored.candidates[3]
    assert stored.winner == pinned
    # In the graph the job weighs ATen and the pinned winner only; ATen is faster there.
    found = verdict(stored, {aten.choice_hash: 0.5, pinned.choice_hash: 0.6})
    assert found is not None and found.changed
    assert found.result.winner_hash == aten.choice_hash  # not the 0.8 ms template timed elsewhere
    assert found.in_graph == {aten.name: 0.5, pinned.name: 0.6}
    assert found.isolated == {aten.name: 1.0, pinned.name: 0.7}
    assert found.result.provenance.source == SOURCE
    assert [c.time_ms for c in found.result.candidates] == [0.5, 0.9, 0.8, 0.6]
    # One choice timed (or one that failed): nothing was weighed, no verdict.
    assert verdict(stored, {aten.choice_hash: 0.5, pinned.choice_hash: float("inf")}) is None
    assert verdict(stored, {"unknown": 0.1, aten.choice_hash: 0.5}) is None


@pytest.mark.parametrize(
    ("source", "may_define"),
    [("def example(batch_size=None):\n    pass\n", True), ("from models import make as example\n", True),
     ("example = lambda batch_size=None: None\n", True), ("from models import *\n", True),
     ("try:\n    from a import example\nexcept ImportError:\n    pass\n", True),
     ("import torch\ndef other():\n    pass\n", False), ("def example(:\n", False)],
)
def test_a_model_file_that_cannot_define_its_entry_starts_no_ray(tmp_path: Path, source: str, may_define: bool) -> None:
    """The sweep starts a local Ray before it loads the model files only where the file parses
    and may bind the entry at its top level; the load then names any other problem."""
    from autotune.sweep.runner import _may_define

    path = tmp_path / "model.py"
    path.write_text(source)
    assert _may_define(str(path), "example") is may_define
    assert _may_define(str(tmp_path / "missing.py"), "example") is False
