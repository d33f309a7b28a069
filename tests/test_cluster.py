"""A real two-node Ray cluster on this host, with token authentication, as a team would run it.

Each node is a `ray start --block` process of its own (the head, then a node that
joins it with --address), one CPU each, so a sweep with --workers 2 gets one
actor per node. The sweep runs as the CLI does, in its own process.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.cache import Store
from autotune.workers.faults import FAULT_ENV
from benchmarks.cluster_run import Cluster, spread  # a token-auth cluster of `ray start` nodes, as a team runs one

# The tests share one two-node cluster (module fixture; the last test starts its own): one xdist
# worker runs them all.
pytestmark = [pytest.mark.xdist_group("cluster"), pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
TINY = str(Path(__file__).parent / "models" / "tiny_mlp.py")


# A lost node is noticed in about 2 s rather than Ray's default 15 s or so.
FAST_HEALTH_CHECKS = {"RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
                      "RAY_health_check_failure_threshold": "3"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the module (a start costs ~15 s here); the last test kills its second node."""
    if shutil.which("ray") is None:
        pytest.fail("the `ray` command is not on PATH (it comes with `pip install ray`)")
    nodes = Cluster(2, gpus_per_node=0, cpus_per_node=1, logs=tmp_path_factory.mktemp("ray_logs"),
                    node_env=FAST_HEALTH_CHECKS)
    try:
        yield nodes
    finally:
        nodes.stop()


def _sweep(cluster: Cluster, cache: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-c", "from autotune.cli import main; main()", "sweep", TINY, "--address", cluster.address,
           "--device", "cpu", "--workers", "2", "--cache", cache, "--json", *args]
    return subprocess.Popen(cmd, env=env or cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)


def _report(stdout: str) -> dict:  # type: ignore[type-arg]
    return json.loads(stdout[stdout.index("{"):])


def test_a_sweep_spreads_over_both_nodes_and_a_host_without_the_token_is_refused(
    cluster: Cluster, sqlite_url: str
) -> None:
    no_token = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH")}
    began = time.monotonic()
    refused = _sweep(cluster, sqlite_url, env=no_token)
    _, err = refused.communicate(timeout=120)
    assert refused.returncode == 2 and time.monotonic() - began < 60
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("capturing")]
    assert len(lines) == 1 and "RAY_AUTH_MODE=token" in lines[0] and "token" in lines[0], err

    # A job goes to the first warm actor, so two tiny jobs can both finish on one node
    # before the other node's actor is warm (it did on a loaded CI host); 10 s per job
    # outlasts that spread, which is what this test is not about.
    proc = _sweep(cluster, sqlite_url, env={**cluster.env, FAULT_ENV: "slow:10"})
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
    report = _report(out)
    assert report["totals"]["tuned"] == 2
    assert len({r["node"] for r in report["requests"]}) == 2, report["requests"]  # both nodes tuned


def test_the_other_node_runs_end_to_end_passes_once_tuning_is_over(
        cluster: Cluster, sqlite_url: str, signing_keys: dict[str, Path]) -> None:
    # Two models, a signing key (a CPU pass runs to publish): this host's lane and the other
    # node's lane pass one model each (autotune/sweep/remote_passes.py), and both publish.
    bmm = str(Path(TINY).parent / "tiny_bmm.py")
    proc = _sweep(cluster, sqlite_url, bmm, "--signing-key", str(signing_keys["writer"]))
    out, err = proc.communicate(timeout=500)
    assert proc.returncode == 0, err[-3000:]
    pointwise = _report(out)["pointwise"]
    assert pointwise["error"] is None and pointwise["failed"] == [], pointwise
    there = [p for p in pointwise["passes"] if p.get("node")]
    assert {p["model"] for p in pointwise["passes"]} == {TINY, bmm}, pointwise["passes"]
    assert len(there) >= 1 and pointwise["artifacts_published"] >= 2, pointwise
    names = {n["id"]: n["resources"] for n in cluster.nodes()}
    assert all("node1" in names[p["node"]] for p in there), there  # the other node, not the head


def test_a_node_killed_mid_sweep_loses_nothing(cluster: Cluster, sqlite_url: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # benchmarks.cluster_run's own path (its --kill-node): the second node dies as a whole once a
    # result is stored, while the sweep still has jobs on it (3 s a job makes sure its
    # actor is warm and busy by then, however slowly it started).
    monkeypatch.setitem(cluster.env, FAULT_ENV, "slow:3")
    entry = spread(cluster, [TINY], sqlite_url, "cpu", ["--workers", "2", "--batch-sizes", "16,32"], tmp_path,
                   timeout=400, kill_node=1, kill_after=1)
    run, killed = entry["run"], entry["killed"]
    log = (tmp_path / "spread.log").read_text()[-3000:]
    assert run["rc"] == 0 and killed["sweep_still_running"], log
    # Two static graphs and the dynamic recompile between them, two GEMMs each.
    assert run["totals"]["found"] == 6 and run["totals"]["tuned"] == 6, log
    store = Store(sqlite_url)
    rows = store.list_results()
    store.close()
    assert len(rows) == 6 and {r.status for _, r in rows} == {"ok"}
    assert len({r.request.key for _, r in rows}) == 6 and killed["nothing_lost"]
    assert run["totals"]["requeued"] >= 1, "the node died after its last job: nothing was re-queued"


def _remote_pass_running() -> bool:
    """Whether a pass process runs on a node of the cluster: its model file in the folder
    workers/remote_run.py made for it."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"autotune.sweep.end_to_end" in args and any(b"autotune-remote-" in arg for arg in args):
            return True
    return False


def test_a_node_killed_during_its_pass_loses_nothing(tmp_path: Path, sqlite_url: str,
                                                     signing_keys: dict[str, Path]) -> None:
    # A cluster of its own: on its nodes (not on the sweep's host) a pass hangs, so the pass the
    # second node takes is still running when that node is SIGKILLed. It runs again on the
    # sweep's host, and both models publish.
    (tmp_path / "ray_logs").mkdir()
    nodes = Cluster(2, gpus_per_node=0, cpus_per_node=1, logs=tmp_path / "ray_logs",
                    node_env={**FAST_HEALTH_CHECKS, FAULT_ENV: "hang:pass:tiny"})
    try:
        bmm = str(Path(TINY).parent / "tiny_bmm.py")
        proc = _sweep(nodes, sqlite_url, bmm, "--signing-key", str(signing_keys["writer"]))
        deadline = time.monotonic() + 300
        while not _remote_pass_running() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _remote_pass_running(), "no pass ran on the second node"
        nodes.kill(1, signal.SIGKILL)
        out, err = proc.communicate(timeout=400)
    finally:
        nodes.stop()
    assert proc.returncode == 0, err[-3000:]
    pointwise = _report(out)["pointwise"]
    assert pointwise["failed"] == [] and pointwise["requeued"] >= 1, pointwise
    assert {p["model"] for p in pointwise["passes"]} == {TINY, bmm} and pointwise["artifacts_published"] >= 2
