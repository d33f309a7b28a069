"""Leases with real concurrent processes on SQLite and PostgreSQL, and the sweep's queue."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from autotune.cache import Store
from autotune.cache.leases import CLAIMED, DONE, TAKEN
from autotune.cache.records import InputLayout, TuningRequest
from autotune.inductor_glue.capture import kernel_owner
from autotune.sweep.end_to_end import EndToEndReport, Shard, merge_reports, plan_lanes
from autotune.sweep.queue import SweepQueue
from autotune.workers.jobs import TuneJob

WORKER = str(Path(__file__).parent / "lease_worker.py")
ROOT = str(Path(__file__).resolve().parent.parent)


def job(name: str) -> TuneJob:
    layout = InputLayout(sizes=(4, 4), strides=(4, 1), offset=0, dtype="torch.float32", device="cpu")
    return TuneJob(TuningRequest("mm", f"inputs-{name}", "highest", (layout,), {}, ()), None)


def _spawn(url: str, name: str, log: Path, keys: int, seconds: float, *extra: str,
           since: float | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    began = str(since if since is not None else time.time())
    return subprocess.Popen([sys.executable, WORKER, url, name, str(log), str(keys), str(seconds), began, *extra],
                            stdout=subprocess.PIPE, text=True, env=env)


def test_concurrent_processes_take_each_key_exactly_once(store_url: str, tmp_path: Path) -> None:
    Store(store_url).connect()  # migrate once, before the race
    log = tmp_path / "log"
    began = time.time()
    procs = [_spawn(store_url, f"p{i}", log, 40, 30.0, since=began) for i in range(3)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    done = [line.split() for line in log.read_text().splitlines()]
    assert Counter(key for _, key in done) == Counter({f"{i:064d}": 1 for i in range(40)})
    assert len({name for name, _ in done}) >= 2, "the work was not shared"


def test_a_killed_holders_leases_expire_and_are_taken_over(store_url: str, tmp_path: Path) -> None:
    Store(store_url).connect()
    log = tmp_path / "log"
    holder = _spawn(store_url, "dead", log, 5, 2.0, "--hold")
    assert holder.stdout is not None and holder.stdout.readline().split() == ["held", "5"]
    with Store(store_url) as store:
        assert store.leases("early", seconds=2.0).claim(("e" * 64, f"{0:064d}")) == TAKEN  # alive: not taken
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    began = time.monotonic()
    heir = _spawn(store_url, "heir", log, 5, 2.0)
    assert heir.wait(timeout=60) == 0
    assert sorted(line.split()[0] for line in log.read_text().splitlines()) == ["heir"] * 5
    assert time.monotonic() - began < 30


def test_a_release_since_this_sweep_began_reads_as_done(sqlite_url: str) -> None:
    with Store(sqlite_url) as store:
        key = ("e" * 64, "r" * 64)
        early = store.leases("early")
        first = store.leases("first")
        assert first.claim(key) == CLAIMED and early.claim(key) == TAKEN
        first.release(key, "ok")
        assert early.claim(key) == DONE  # tuned while "early" ran: skip it
        assert store.leases("later").claim(key) == CLAIMED  # a later sweep may retune (e.g. --force)


def test_queue_skips_what_another_sweep_finished_and_waits_for_what_it_holds(sqlite_url: str) -> None:
    with Store(sqlite_url) as store:
        a, b = job("a"), job("b")
        other = store.leases("other")
        queue = SweepQueue(store.leases("me", seconds=30), retry_seconds=0.05)
        assert other.claim(("", a.request.key)) == CLAIMED and other.claim(("", b.request.key)) == CLAIMED
        assert queue.put(a) and queue.put(b) and not queue.put(a)  # de-duplicated
        queue.close()
        assert queue.take() is None and not queue.exhausted()  # both held elsewhere: wait
        other.release(("", a.request.key), "ok")  # finished there
        other.release_all()  # b given back unfinished (that sweep stopped)
        time.sleep(0.1)
        assert queue.take() == b and queue.take() is None
        assert queue.exhausted() and [j.request.key for j in queue.elsewhere] == [a.request.key]
        queue.stop()


def test_queue_hands_out_a_training_steps_requests_first_and_a_retry_before_all() -> None:
    # Its end-to-end pass waits for them and is the sweep's longest chain; equals keep their order.
    queue = SweepQueue()
    infer, train, later, retried = job("infer"), job("train"), job("later"), job("retried")
    assert queue.put(infer) and queue.put(train, priority=1.0) and queue.put(later)
    assert queue.take() == train
    queue.retry(retried)  # handed out, failed to reach a worker: it goes again first
    assert [j.request.key for j in queue.left()] == [retried.request.key, infer.request.key, later.request.key]
    assert [queue.take(), queue.take(), queue.take(), queue.take()] == [retried, infer, later, None]


def test_pointwise_lanes_cover_every_model_once_and_every_gpu() -> None:
    for models in range(1, 5):
        for gpus in range(1, 9):
            lanes = plan_lanes(models, gpus)
            assert len(lanes) == min(gpus, max(models, gpus))
            shards = [s for lane in lanes for s in lane]
            for model in range(models):
                mine = sorted(s.rank for s in shards if s.model == model)
                count = next(s.count for s in shards if s.model == model)
                assert mine == list(range(count))  # every share of the model exactly once
    assert plan_lanes(3, 2) == [[Shard(0), Shard(2)], [Shard(1)]]
    assert plan_lanes(1, 2) == [[Shard(0, 0, 2)], [Shard(0, 1, 2)]]


def test_more_models_than_gpus_run_passes_per_gpu_lanes_of_whole_models(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.sweep.end_to_end import lane_gpus, pass_lanes

    assert pass_lanes(8, 4, 2, splits=True) == 8  # two lanes on each GPU
    assert pass_lanes(5, 4, 2, splits=True) == 5  # never more lanes than models
    assert pass_lanes(5, 1, 2, splits=True) == 2
    assert pass_lanes(3, 4, 2, splits=True) == 4  # more GPUs than models: shares, a GPU each, as before
    assert pass_lanes(3, 4, 2, splits=False) == 3
    assert pass_lanes(8, 4, 1, splits=True) == 4
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert lane_gpus(4, 2) == ["2", "3", "2", "3"]  # lane i on GPU i mod 2
    assert lane_gpus(2, 1) == ["2", "2"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert lane_gpus(3, 3) == ["0", "1", "2"] and lane_gpus(1, 4) == [None]


def test_the_longest_passes_start_first_on_the_least_loaded_lanes() -> None:
    from pathlib import Path

    from autotune.inductor_glue.modelfile import ModelFile
    from autotune.sweep import pass_costs
    from autotune.sweep.report import ModelCapture

    # Costs 1, 1 and 4 on 2 GPUs: dealt in file order, lane 0 runs the 1 then the 4 (ends at 5);
    # the longest first gives the 4 a lane of its own and the two 1s the other (ends at 4).
    assert plan_lanes(3, 2, [1, 1, 4]) == [[Shard(2)], [Shard(0), Shard(1)]]
    assert plan_lanes(3, 2, [1, 5, 3]) == [[Shard(1)], [Shard(2), Shard(0)]]
    assert plan_lanes(2, 3, [1, 4]) == [[Shard(0, 0, 1)], [Shard(1, 0, 2)], [Shard(1, 1, 2)]]  # the spare GPU
    models = [ModelFile(Path(name), "example", lambda: None, {}) for name in ("a.py", "b.py", "c.py")]
    captured = [ModelCapture("a.py", requests=2, lookups=6), ModelCapture("b.py", requests=3)]
    assert pass_costs(models, captured) == [6.0, 3.0, 1.0]  # lookups, else requests, else 1
    owners = Counter(kernel_owner(f"triton_poi_fused_{i}:abc", 4) for i in range(400))
    assert set(owners) == {0, 1, 2, 3} and min(owners.values()) > 60  # spread evenly enough
    merged = merge_reports([EndToEndReport(saved=2, saved_keys=["x"]), EndToEndReport(saved=3, error="e")], 1.0)
    assert (merged.saved, merged.saved_keys, merged.error) == (5, ["x"], "e")


def test_a_distributed_gpu_pass_compiles_on_each_rank_device() -> None:
    """Rank r of a GPU job compiles on cuda:r, and Inductor keys graphs and kernels by that
    index: the sweep's pass runs once per device index, up to the job's world size and the GPUs."""
    from autotune.sweep.end_to_end import rank_copies
    from autotune.sweep.pass_spec import EndToEndSpec

    def spec(device: str, world: int | None) -> EndToEndSpec:
        dist = None if world is None else {"kind": "ddp", "world_size": world, "bucket_cap_mb": None}
        return EndToEndSpec("m.py", "example", [None], "max-autotune", {}, True, None, device=device,
                             distributed=dist, gpu="3")

    copies = rank_copies([spec("cuda", 4)], gpus=2)
    assert [(c.device_index, c.gpu, c.time_in_graph) for c in copies] == [(1, None, False)]
    assert [c.device_index for c in rank_copies([spec("cuda", 8)], gpus=8)] == list(range(1, 8))
    assert rank_copies([spec("cuda", None), spec("cpu", 2), spec("cuda", 1)], gpus=4) == []


def test_the_pass_plans_a_timing_compile_first_and_publishes_last() -> None:
    from autotune.settings import Settings
    from autotune.sweep.end_to_end import Pass, plan_passes

    signed = Settings(signing_key="/keys/sweeper")
    unsigned = Settings()
    # GPU, signed: time and tune without publishing, then publish served (every config known).
    assert plan_passes(signed, "cuda", True) == [Pass(Settings(signing_key=None), True), Pass(signed)]
    # GPU, unsigned: one timing compile (a served one follows only if a verdict changed a winner).
    assert plan_passes(unsigned, "cuda", True) == [Pass(unsigned, True)]
    # CPU: no pointwise tuning, no fusion benchmarks: one compile, as a job's, publishing if signed.
    assert plan_passes(signed, "cpu", False) == [Pass(signed)]
    assert Settings.from_env({"AUTOTUNE_TIME_IN_GRAPH": "0"}).time_in_graph is False


def test_the_pass_compiles_again_before_publishing_graphs_with_kernels_untuned() -> None:
    from autotune.settings import Settings
    from autotune.sweep.end_to_end import Pass, follow_up

    timing, publishing = Pass(Settings(), True), Pass(Settings(signing_key="/keys/sweeper"))
    # A changed winner: a served compile first, publishing nothing, to tune the kernels around it.
    assert follow_up(timing, verdict_changed=True, withheld=False) == Pass(Settings())
    assert follow_up(timing, verdict_changed=False, withheld=False) is None
    # A publishing compile that tuned kernels after compiling them withheld its graphs: once more.
    again = follow_up(publishing, verdict_changed=False, withheld=True)
    assert again == Pass(publishing.settings, may_republish=False) and again.publishes
    assert follow_up(publishing, verdict_changed=False, withheld=False) is None
