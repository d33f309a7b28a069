"""A finished end-to-end pass leaves a mark; a sweep that tunes nothing runs the passes
without one (autotune/sweep/pass_marks.py). The mark's key and its reading are pure; the store
round trip runs on the real SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from factories import make_env

from autotune.cache.store import Store
from autotune.sweep import pass_marks
from autotune.sweep.pass_spec import EndToEndSpec


def _spec(model: Path, **changes: object) -> EndToEndSpec:
    spec = EndToEndSpec(str(model), "example", [8], "max-autotune", {}, False, None, device="cuda")
    return dataclasses.replace(spec, **changes)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.py"
    path.write_text("def example(batch_size=None):\n    raise NotImplementedError\n")
    return path


def test_a_mark_names_what_the_pass_compiles(model: Path) -> None:
    base = pass_marks.digest(_spec(model))
    assert pass_marks.digest(_spec(model, gpu="1", cache="sqlite:///elsewhere.db")) == base  # where, not what
    for change in ({"batch_sizes": [8, 16]}, {"dynamic": True}, {"train": True}, {"mode": "max-autotune-no-cudagraphs"},
                   {"inductor_config": {"epilogue_fusion": False}}, {"entry": "other"}):
        assert pass_marks.digest(_spec(model, **change)) != base, change
    model.write_text(model.read_text() + "# edited\n")
    assert pass_marks.digest(_spec(model)) != base  # an edited model file has kernels of its own


def test_a_split_pass_is_finished_only_when_every_share_is(model: Path) -> None:
    shares = [_spec(model, shard=[rank, 3]) for rank in range(3)]
    marks = {pass_marks.key(share): {} for share in shares[:2]}
    assert not pass_marks.finished(marks, _spec(model))
    marks[pass_marks.key(shares[2])] = {}
    assert pass_marks.finished(marks, _spec(model))
    assert pass_marks.finished({pass_marks.key(_spec(model)): {}}, _spec(model, shard=[1, 2]))  # any full split
    assert not pass_marks.finished({pass_marks.key(_spec(model)): {}}, _spec(model, batch_sizes=[16]))


def test_marks_round_trip_through_the_store_per_environment(model: Path, store_url: str) -> None:
    h100, h200 = make_env(device_name="NVIDIA H100"), make_env(device_name="NVIDIA H200")
    done, owed = _spec(model), _spec(model, dynamic=True)
    with Store(store_url) as store:
        assert pass_marks.unfinished(store, h100, [done, owed]) == [done, owed]
        pass_marks.mark_finished(store, h100, done)
        assert pass_marks.unfinished(store, h100, [done, owed]) == [owed]
        assert pass_marks.unfinished(store, h200, [done]) == [done]  # another GPU tunes its own kernels
        assert store.stats()["kernel_configs_by_kind"].get("pass") == 1


def test_a_database_that_is_down_owes_every_pass_and_takes_no_mark(model: Path) -> None:
    down = Store("postgresql+psycopg://postgres@127.0.0.1:1/x")  # nothing listens there
    assert pass_marks.unfinished(down, make_env(), [_spec(model)]) == [_spec(model)]
    pass_marks.mark_finished(down, make_env(), _spec(model))  # logs, never raises: the pass's work is stored


def test_a_pass_that_began_and_never_finished_is_resumable(model: Path) -> None:
    """A sweep cut in its pass left the 'started' mark only: the next sweep starts that pass
    beside its capture (autotune/sweep/resumed_pass.py)."""
    begun, other = _spec(model), _spec(model, dynamic=True)
    marks = {pass_marks.started_key(begun): {}}
    assert pass_marks.resumable(marks, [begun, other]) == [begun]  # the other never began: capture first
    assert not pass_marks.finished(marks, begun)  # a started mark is no share of a finished pass
    marks[pass_marks.key(begun)] = {}
    assert pass_marks.resumable(marks, [begun, other]) == []  # finished: nothing owed
    assert pass_marks.resumable({pass_marks.started_key(begun): {}}, [_spec(model, train=True)]) == []


def test_started_marks_round_trip_and_count_as_pass_marks(model: Path, store_url: str) -> None:
    h100, h200 = make_env(device_name="NVIDIA H100"), make_env(device_name="NVIDIA H200")
    spec = _spec(model)
    with Store(store_url) as store:
        assert pass_marks.read(store, h100) == {}
        pass_marks.mark_started(store, h100, spec)
        assert pass_marks.resumable(pass_marks.read(store, h100), [spec]) == [spec]
        assert pass_marks.resumable(pass_marks.read(store, h200), [spec]) == []  # began on another GPU
        pass_marks.mark_finished(store, h100, spec)
        assert pass_marks.resumable(pass_marks.read(store, h100), [spec]) == []
        assert store.stats()["kernel_configs_by_kind"].get("pass") == 2


def test_a_database_that_is_down_resumes_no_pass(model: Path) -> None:
    down = Store("postgresql+psycopg://postgres@127.0.0.1:1/x")
    assert pass_marks.read(down, make_env()) == {}  # logs: the pass then runs after capture, as before
    pass_marks.mark_started(down, make_env(), _spec(model))  # logs, never raises
