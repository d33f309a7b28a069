"""A real two-node Ray cluster on this host, with token authentication, as a team would run it.

Each node is a `ray start --block` process of its own (the head, then a node that
joins it with --address), one CPU each, so a sweep with --workers 2 gets one
actor per node. The sweep runs as the CLI does, in its own process.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cache import Store

# Both tests share one two-node cluster (module fixture): one xdist worker starts it once.
pytestmark = pytest.mark.xdist_group("cluster")

ROOT = Path(__file__).resolve().parent.parent
TINY = str(Path(__file__).parent / "models" / "tiny_mlp.py")


@dataclass
class Cluster:
    address: str
    env: dict[str, str]  # what a host that joins needs: RAY_AUTH_MODE=token and the token's path
    nodes: dict[str, subprocess.Popen[bytes]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_start(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    # Its own session, so the node can be killed as a whole (raylet, workers), by its id.
    return subprocess.Popen(["ray", "start", "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1",
                             "--num-cpus", "1", *args], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _alive_nodes(address: str, env: dict[str, str]) -> int:
    code = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
            "print(sum(1 for n in ray.nodes() if n['Alive']))")
    out = subprocess.run([sys.executable, "-c", code, address], env=env, capture_output=True, text=True, timeout=60)
    return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """One cluster for the module (a start costs ~15 s here); the last test kills its second node."""
    if shutil.which("ray") is None:
        pytest.fail("the `ray` command is not on PATH (it comes with `pip install ray`)")
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # Ray's socket paths must stay short
    token = temp / "token"
    token.write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    # Notice a lost node in about 2 s rather than Ray's default 15 s or so.
    node_env = {**env, "RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
                "RAY_health_check_failure_threshold": "3"}
    port = _free_port()
    address = f"127.0.0.1:{port}"
    nodes = {"head": _ray_start(node_env, "--head", "--port", str(port), "--include-dashboard", "false",
                                "--temp-dir", str(temp / "ray"), "--resources", '{"autotune_head": 1}')}
    try:
        deadline = time.monotonic() + 60
        while _alive_nodes(address, env) < 1:
            assert time.monotonic() < deadline, "the head node did not start"
            time.sleep(1)
        nodes["second"] = _ray_start(node_env, "--address", address, "--resources", '{"autotune_second": 1}')
        while _alive_nodes(address, env) < 2:
            assert time.monotonic() < deadline, "the second node did not join"
            time.sleep(1)
        yield Cluster(address, env, nodes)
    finally:
        for name in ("second", "head"):
            if name in nodes:
                _stop(nodes[name])
        shutil.rmtree(temp, ignore_errors=True)


def _sweep(cluster: Cluster, cache: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-c", "from cli import main; main()", "sweep", TINY, "--address", cluster.address,
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

    proc = _sweep(cluster, sqlite_url)
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
    report = _report(out)
    assert report["totals"]["tuned"] == 2
    assert len({r["node"] for r in report["requests"]}) == 2, report["requests"]  # both nodes tuned


def test_a_node_killed_mid_sweep_loses_nothing(cluster: Cluster, sqlite_url: str) -> None:
    proc = _sweep(cluster, sqlite_url, "--batch-sizes", "16,32")
    deadline = time.monotonic() + 300
    store = Store(sqlite_url)
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if store.list_results():
                break
        except Exception:  # the sweep has not created the database yet
            pass
        time.sleep(0.5)
    _stop(cluster.nodes["second"], signal.SIGKILL)  # the node dies as a whole, mid-sweep
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]
    report = _report(out)
    # Two static graphs and the dynamic recompile between them, two GEMMs each.
    assert report["totals"]["found"] == 6 and report["totals"]["tuned"] == 6, err[-3000:]
    rows = store.list_results()
    assert len(rows) == 6 and {r.status for _, r in rows} == {"ok"}
    assert len({r.request.key for _, r in rows}) == 6
    assert report["totals"]["requeued"] >= 1, "the node died after its last job: nothing was re-queued"
    store.close()
