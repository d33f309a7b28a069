"""Training jobs as clusters run them: DDP and FSDP2 under torchrun (gloo, 2 ranks on a CPU),
served from one `autotune sweep --ddp`, and the ranks of a node sharing one cache reader.

One sweep and one torchrun launch serve every test here (module-scoped): the job trains
tests/models/tiny_bmm.py one step under DDP, then one under FSDP2 (tests/dist_job.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.cache.records import Environment
from autotune.cache.store import Store
from autotune.job.node_share import NodeClient, NodeServer, SharedReads, node_role

pytestmark = pytest.mark.xdist_group("distributed")

ROOT = Path(__file__).resolve().parent.parent
MODEL = str(ROOT / "tests" / "models" / "tiny_bmm.py")
# torchrun gives each rank one thread (OMP_NUM_THREADS=1) where several share a CPU, and a
# CPU's thread count is part of the cache's key: the sweep runs as the ranks do.
RANK_THREADS = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('dist-sweep') / 'cache.db'}"
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", "sweep", MODEL, "--train", "--ddp",
                           "--bucket-cap-mb", "1", "--device", "cpu", "--cache", url, "--json"],
                          env={**os.environ, **RANK_THREADS}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    totals = json.loads(proc.stdout)["totals"]
    assert totals["found"] >= 2 and totals["failed"] == 0, totals
    return url


@pytest.fixture(scope="module")
def ranks(swept: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("dist-job")
    env = {**os.environ, **RANK_THREADS, "AUTOTUNE_CACHE": swept, "AUTOTUNE_READ_ONLY": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "tests" / "dist_job.py"), str(out), "ddp,fsdp"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_every_rank_of_the_job_hits_the_sweep_and_benchmarks_nothing(ranks: list[dict[str, Any]], kind: str) -> None:
    for rank in ranks:
        step = rank[kind]
        assert step["hits"] >= 2 and step["misses"] == 0, (rank["rank"], step)
        assert step["benchmarks"] == 0 and step["inductor_benchmarks"] == 0, (rank["rank"], step)


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_the_served_steps_output_matches_the_step_without_the_hook(ranks: list[dict[str, Any]], kind: str) -> None:
    assert all(rank[kind]["matches_eager"] for rank in ranks)


def test_only_local_rank_0_reads_the_database(ranks: list[dict[str, Any]]) -> None:
    """Over the whole job: local rank 1's reads (its prefetch's among them) crossed the node
    share's socket as typed rows and were served as hits."""
    assert ranks[0]["database_calls"] > 0
    assert ranks[1]["database_calls"] == 0
    assert all(ranks[1][kind]["database_calls"] == 0 and ranks[1][kind]["hits"] >= 2 for kind in ("ddp", "fsdp"))


def test_eight_ranks_make_the_database_calls_of_one(tmp_path: Path) -> None:
    """In process: local rank 0's server and seven clients asking what one rank asks."""
    store = Store(f"sqlite:///{tmp_path / 'cache.db'}")
    calls: list[str] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            calls.append(name)
            return getattr(store, name)

    role = node_role({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "8", "MASTER_PORT": str(os.getpid()),
                      "TORCHELASTIC_RUN_ID": tmp_path.name})
    assert role is not None and role.serves
    env = Environment("cpu", "a cpu", "2.x", None, None, "hash", "config")
    server = NodeServer(role.socket_path, SharedReads(lambda: Counting(), role.local_world_size))
    clients = [NodeClient(role.socket_path, timeout=5) for _ in range(7)]
    try:
        for asker in [server.reads, *clients]:
            assert asker.lookup(env, "absent") is None
            assert asker.get_artifact("fx_graph", "absent") is None
        assert sorted(calls) == ["get_artifact", "lookup"]
    finally:
        for client in clients:
            client.close()
        server.close()
        store.close()


def test_outside_torchrun_or_alone_on_the_node_nothing_is_shared() -> None:
    assert node_role({}) is None
    assert node_role({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}) is None


def test_bad_distributed_flags_are_one_line_and_exit_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", "sweep", MODEL, "--ddp", "--fsdp"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--ddp and --fsdp" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_distributed_benchmark_judges_every_rank() -> None:
    """benchmarks.distributed's goals, on figures as its jobs report them (no torch, no GPU)."""
    from benchmarks import distributed

    def ranks(**fields: Any) -> dict[str, Any]:
        return {"ranks": [{"rank": r, **fields} for r in (0, 1)]}

    run = {"cpu_ranks": 8,
           "gpu": {"cold-single": ranks(kernel_ms_per_step=10.0),
                   "ddp": {"default": ranks(first_step_s=20.0),
                           "warm": ranks(first_step_s=8.0, hits=30, misses=0, benchmarks=0, inductor_benchmarks=0,
                                         kernel_ms_per_step=9.5)}},
           "cpu": {"ranks_1": ranks(database_calls=3), "ranks_8": ranks(database_calls=1)}}
    verdicts = {g["goal"]: g["met"] for g in distributed.goals(run)}
    assert all(verdicts.values()) and len(verdicts) == 5, verdicts
    run["gpu"]["ddp"]["warm"]["ranks"][1]["misses"] = 1
    assert not {g["goal"]: g["met"] for g in distributed.goals(run)}["ddp: every lookup a hit"]
    assert distributed.render({**run, "goals": distributed.goals(run)})


def _as_local_rank(rank: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This process as local rank ``rank`` of a 2-rank torchrun job of its own (node_share.py)."""
    for name, value in {"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "1",
                        "TORCHELASTIC_RUN_ID": tmp_path.name}.items():
        monkeypatch.setenv(name, value)


def test_a_rank_whose_local_rank_0_never_serves_reads_the_database_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.job.serve_policy import ServePolicy
    from autotune.settings import Settings

    _as_local_rank(1, monkeypatch, tmp_path)
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    Store(url).close()  # the schema made here: the lookup's time is the wait for rank 0 and one read
    policy = ServePolicy(Settings(cache=url, lookup_timeout=4.0))
    try:
        assert policy.store.call(lambda store: store.misses()) == []
        assert policy.stats.database_calls == 1 and policy.stats.errors == 0
    finally:
        policy.close()


def test_a_ranks_end_to_end_pass_is_marked_apart_from_the_bare_models() -> None:
    """A sweep --ddp compiles other graphs than a plain sweep: their pass marks differ."""
    from autotune.sweep import pass_marks
    from autotune.sweep.pass_spec import EndToEndSpec

    bare = EndToEndSpec(MODEL, "example", [None], "max-autotune", {}, True, None, device="cpu")
    ddp = EndToEndSpec(MODEL, "example", [None], "max-autotune", {}, True, None, device="cpu",
                        distributed={"kind": "ddp", "world_size": 2, "bucket_cap_mb": 1.0})
    assert pass_marks.digest(bare) != pass_marks.digest(ddp)


def test_a_ranks_prefetch_waits_for_a_local_rank_0_that_starts_late(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Seen on 2 GPUs: local rank 0 opened its socket after rank 1 first asked, and rank 1's
    # whole prefetch read the database itself.
    import time

    from autotune.cache.signing import NO_TRUSTED_KEYS
    from autotune.job.serve_policy import ServePolicy
    from autotune.settings import Settings

    _as_local_rank(1, monkeypatch, tmp_path)
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    Store(url).close()
    other = ServePolicy(Settings(cache=url))
    other.start_prefetch(NO_TRUSTED_KEYS, "cpu")
    time.sleep(1.5)  # longer than the first ask's wait (half the lookup timeout)
    _as_local_rank(0, monkeypatch, tmp_path)
    serving = ServePolicy(Settings(cache=url))
    try:
        assert other.prefetch is not None
        other.prefetch._thread.join(timeout=30)
        assert not other.prefetch._thread.is_alive()
        assert other.stats.database_calls == 0  # its prefetch read through rank 0
        assert serving.stats.database_calls >= 1
    finally:
        other.close()
        serving.close()
