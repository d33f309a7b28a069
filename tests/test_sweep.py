"""A full CPU sweep through a local Ray into SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.cache import Store
from autotune.settings import Settings
from autotune.sweep import run_sweep
from autotune.sweep.report import SweepOptions
from autotune.workers.faults import FAULT_ENV
from autotune.workers.jobs import TuneJob

TINY = str(Path(__file__).parent / "models" / "tiny_mlp.py")


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _sweep(url: str, **options: object) -> object:
    return run_sweep(SweepOptions(TINY, **options), Settings.from_env(cache=url, device="cpu"))  # type: ignore[arg-type]


def test_sweep_stores_every_request_then_skips_them(postgres_url: str) -> None:
    # Into PostgreSQL only: full sweeps into SQLite run in every other sweep test (and in
    # the session's signed sweep, tests/conftest.py), and a CPU sweep costs about a minute.
    store_url = postgres_url
    report = _sweep(store_url)
    assert (report.found, report.tuned, report.failed, report.cached) == (2, 2, 0, 0), _debug(report)
    # The profile of the serial part: each milestone once, seconds from the start, in causal order.
    timeline = report.to_json()["timeline"]
    for before, after in (("models_loaded", "capture_done"), ("first_request_queued", "first_result"),
                          ("first_child_warm", "first_result"), ("first_result", "last_result")):
        assert 0 <= timeline[before] <= timeline[after] <= report.wall_seconds, timeline
    assert timeline["ray_up"] <= timeline["actors_requested"] <= timeline["all_children_warm"], timeline
    assert report.adopted >= 1  # a lane took a spare started before Ray (workers/spares.py)
    with Store(store_url) as store:
        rows = store.list_results()
        assert len(rows) == 2
        for _row_id, result in rows:
            assert result.status == "ok"
            assert result.request.op == "packed_linear"
            assert {c.kind for c in result.candidates} == {"aten", "cpp"}
            assert all(c.time_ms and c.time_ms > 0 for c in result.candidates)
            assert result.winner is not None and result.validation["passed"] is True
            assert result.provenance.sweep_id == report.sweep_id
            assert set(result.request.choice_hashes) == {c.choice_hash for c in result.candidates}
        first_sweep = {r.request.key: r.provenance.created_at for _, r in rows}

    again = _sweep(store_url)
    assert (again.found, again.cached, again.tuned) == (2, 2, 0)  # nothing retuned
    with Store(store_url) as store:
        assert {r.request.key: r.provenance.created_at for _, r in store.list_results()} == first_sweep


def test_dry_run_plans_without_tuning_or_writing(sqlite_url: str) -> None:
    report = _sweep(sqlite_url, dry_run=True)
    assert report.found == 2 and report.count("planned") == 2 and report.tuned == 0
    with Store(sqlite_url) as store:
        assert store.list_results() == []


@pytest.mark.slow
def test_a_worker_that_dies_is_recorded_and_the_rest_finish(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned = _sweep(sqlite_url, dry_run=True).outcomes
    doomed = planned[0].request.key
    monkeypatch.setenv(FAULT_ENV, f"crash:{doomed[:16]}")
    report = _sweep(sqlite_url)
    by_key = {o.request.key: o for o in report.outcomes}
    assert by_key[doomed].status == "failed" and "crash" in (by_key[doomed].result.error or "")
    assert [o.status for k, o in by_key.items() if k != doomed] == ["ok"]
    with Store(sqlite_url) as store:
        assert store.cached_request_keys(report.env) == {k for k in by_key if k != doomed}


def _debug(report) -> str:  # type: ignore[no-untyped-def]
    return "; ".join(f"{o.status}: {o.result.error if o.result else ''}" for o in report.outcomes)


def test_a_failed_background_start_raises_its_worker_error_when_the_pool_is_needed() -> None:
    from autotune.workers.errors import WorkerError
    from autotune.workers.pool import PoolStarter

    starter = PoolStarter(None, None, "cuda", None, 60.0)  # the local Ray of this module has no GPU
    with pytest.raises(WorkerError, match="no GPU in the Ray cluster"):
        starter.pool()
    starter.close()


def test_actors_handle_jobs_without_importing_torch() -> None:
    """The actor and the driver's pool only pass jobs and results along; importing torch
    there cost each actor's first job ~2.7 s (CPU probe)."""
    import subprocess
    import sys

    code = "import sys, workers.jobs, workers.actor, workers.pool; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_several_models_make_one_plan_and_their_union_is_planned_once(sqlite_url: str, tmp_path: Path) -> None:
    """A dry run (the tuning itself is the one-model path; the cluster tests run it for real)."""
    twin = tmp_path / "twin_mlp.py"  # the same layers under another file: every request a duplicate
    twin.write_text(Path(TINY).read_text())
    options = SweepOptions(TINY, more_models=(str(twin), TINY), dry_run=True)
    report = run_sweep(options, Settings.from_env(cache=sqlite_url, device="cpu"))
    assert [Path(m.path).name for m in report.models] == ["tiny_mlp.py", "twin_mlp.py"]
    assert (report.captured, report.found, report.count("planned")) == (4, 2, 2), _debug(report)
    assert [m.new for m in report.models] == [2, 0]
    assert report.to_json()["totals"]["deduplicated"] == 2


@pytest.mark.slow  # the side-by-side capture's own tests are tests/test_capture_lanes.py
def test_models_captured_side_by_side_are_planned_as_captured_in_turn(sqlite_url: str) -> None:
    bmm = str(Path(TINY).parent / "tiny_bmm.py")
    reports = [run_sweep(SweepOptions(TINY, more_models=(bmm,), dry_run=True),
                         Settings.from_env(cache=sqlite_url, device="cpu", capture_processes=n)) for n in (1, 2)]
    in_turn, side_by_side = ({o.request.key: o.model for o in r.outcomes} for r in reports)
    assert side_by_side == in_turn and len(in_turn) >= 2, _debug(reports[1])
    assert [(m.path, m.requests, m.new) for m in reports[1].models] == [
        (m.path, m.requests, m.new) for m in reports[0].models]


def test_a_model_file_that_defines_train_step_is_captured_first_as_a_training_step_beside_an_inference_one(
        sqlite_url: str, tmp_path: Path) -> None:
    # One sweep, no --train: the copy that defines train_step() is captured forward and backward
    # (its backward asks for the forward's two bmm shapes again: two lookups more), and before
    # the inference model given ahead of it (the longest chain starts first). torch 2.13 tunes
    # the two bmms alone on a CPU (2 and 4 lookups); 2.11 tunes the Linear's addmm too (4 and 6).
    bmm = Path(TINY).parent / "tiny_bmm.py"
    trained = tmp_path / "tiny_bmm_train.py"
    trained.write_text(bmm.read_text() + "\n\ndef train_step(model, optimizer, inputs):\n"
                       "    return model(*inputs).sum()\n")
    report = run_sweep(SweepOptions(str(bmm), more_models=(str(trained),), dry_run=True),
                       Settings.from_env(cache=sqlite_url, device="cpu"))
    training, inference = report.models
    assert (training.path, inference.path) == (str(trained), str(bmm)), _debug(report)
    assert inference.lookups >= 2 and training.lookups - inference.lookups == 2, _debug(report)


def _tiny_cpu_jobs() -> list[TuneJob]:
    """The tiny MLP's requests, captured on CPU, as tuning jobs."""
    from autotune.inductor_glue.capture import capture_model
    from autotune.inductor_glue.modelfile import load_model_file

    model = load_model_file(TINY)
    captured = capture_model(model, device="cpu")
    return [TuneJob(r, captured.env, captured.mode, model.config_overrides, "cpu") for r in captured.requests]


@pytest.mark.slow
def test_an_actor_with_two_lanes_tunes_two_requests_at_once() -> None:
    """--jobs-per-gpu: while one lane's request hangs, the other lane's request is tuned and
    comes back (on CPU here, where a sweep keeps one lane; the lanes work the same)."""
    from autotune.workers.pool import ListSource, TuningPool

    stuck, free = _tiny_cpu_jobs()
    # The stuck request's timeout is longer than this test waits: nothing here waits for it
    # (the next test times a request out).
    pool = TuningPool(None, "cpu", actors=1, timeout=600.0, lanes=2, fault=f"hang:{stuck.request.key[:16]}")
    try:
        pool.warm()
        results = pool.run(ListSource([stuck, free]))
        first = next(results)
        in_flight = [slot.job.request.key for slot in pool.slots if slot.ref is not None and slot.job is not None]
        results.close()
    finally:
        pool.shutdown()
    assert len(pool.slots) == 2
    assert first.request.key == free.request.key and first.status == "ok", first.error
    assert in_flight == [stuck.request.key]


def test_a_request_that_hangs_past_its_timeout_is_failed_with_the_reason() -> None:
    """The pool gives up on a request after its timeout and records it as failed, saying so."""
    from autotune.workers.pool import ListSource, TuningPool

    stuck = _tiny_cpu_jobs()[0]
    pool = TuningPool(None, "cpu", actors=1, timeout=5.0, lanes=1, fault=f"hang:{stuck.request.key[:16]}")
    try:
        pool.warm()
        results = list(pool.run(ListSource([stuck])))
    finally:
        pool.shutdown()
    assert [r.request.key for r in results] == [stuck.request.key]
    assert results[0].status == "failed" and "timeout" in (results[0].error or ""), results[0].error
