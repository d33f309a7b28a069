"""Sweeps through ``--address`` on a real multi-node Ray cluster on one host.

A team's set-up in miniature: a token-auth Ray cluster of ``--nodes`` nodes, each its own
``ray start`` with its own GPU (``--gpus-per-node 1``) or its own CPUs, the cache on one
database (PostgreSQL for a team). Then ``spread``: one sweep of ``--models`` into a fresh
database, which node tuned what; with ``--kill-node I`` node I dies as a whole once
``--kill-after`` results are stored, and every request must still be stored once, ``ok``.
And ``concurrent`` (``--concurrent 'A;B'``): two sweeps started at once over overlapping
model lists; every request must be tuned exactly once (the reports' tuned + failed add up to
the distinct requests stored, and no request was tuned by both).

    python -m benchmarks.cluster_run --out /tmp/cluster --cache postgresql://postgres@127.0.0.1/test \
        --models examples/mlp.py --concurrent 'examples/mlp.py,tests/models/tiny_mlp.py;tests/models/tiny_mlp.py'
    python -m benchmarks.cluster_run --out $OUT --cache postgresql://postgres@127.0.0.1/test --nodes 4 \
        --gpus-per-node 1 --cpus-per-node 16 --models examples/resnet.py,examples/gpt.py --kill-node 3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import harness

log = logging.getLogger("cluster_run")
NOT_TUNED_HERE = ("cached", "elsewhere", "planned", "not_run")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_command() -> str:
    """The ``ray`` CLI: on PATH, else beside this interpreter (a venv that is not activated)."""
    beside = Path(sys.executable).parent / "ray"
    return shutil.which("ray") or str(beside)


class Cluster:
    """``nodes`` Ray nodes on this host, token auth on; stop() ends them all. ``env`` is what a
    host that joins needs; ``node_env`` goes to the nodes only (tests shorten Ray's health checks)."""

    def __init__(self, nodes: int, gpus_per_node: int, cpus_per_node: int, logs: Path,
                 node_env: dict[str, str] | None = None) -> None:
        self.temp = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # Ray's socket paths must stay short
        token = self.temp / "token"
        token.write_text(secrets.token_hex(32))
        self.env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "CUDA_VISIBLE_DEVICES")}
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token),
                        PYTHONPATH=os.pathsep.join(p for p in (str(harness.REPO), os.environ.get("PYTHONPATH")) if p))
        # The sweep runs on the head's host, which on a real cluster has the head's GPUs alone: its
        # captures and its own end-to-end passes use those, every other GPU only through Ray.
        self.driver_env = dict(self.env)
        if gpus_per_node:
            self.driver_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(gpus_per_node))
        self.address = f"127.0.0.1:{_free_port()}"
        self.logs = logs
        self.node_env = dict(node_env or {})
        self.procs: list[subprocess.Popen[bytes]] = []
        self.commands: list[str] = []
        try:
            for index in range(nodes):
                args = ["--head", "--port", self.address.rsplit(":", 1)[1], "--include-dashboard", "false",
                        "--temp-dir", str(self.temp / "ray")] if index == 0 else ["--address", self.address]
                self._start(index, gpus_per_node, cpus_per_node, args)
                self.wait_nodes(index + 1, 90)
        except BaseException:
            self.stop()
            raise

    def _start(self, index: int, gpus: int, cpus: int, args: list[str]) -> None:
        env = {**self.env, **self.node_env}
        resources = ["--num-cpus", str(cpus), "--resources", json.dumps({f"node{index}": 1})]
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(index * gpus + g) for g in range(gpus))
            resources += ["--num-gpus", str(gpus)]
        cmd = [_ray_command(), "start", "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1", *args, *resources]
        shown = (f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} " if gpus else "") + " ".join(cmd)
        self.commands.append("RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=TOKEN " + shown)
        sink = open(self.logs / f"ray_node{index}.log", "wb")
        self.procs.append(subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True))

    def nodes(self) -> list[dict[str, Any]]:
        code = ("import json, ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
                "print(json.dumps([{'id': n['NodeID'], 'alive': n['Alive'], 'resources': n['Resources']} "
                "for n in ray.nodes()]))")
        done = subprocess.run([sys.executable, "-c", code, self.address], env=self.env, capture_output=True,
                              text=True, timeout=60)
        lines = done.stdout.strip().splitlines()
        return json.loads(lines[-1]) if done.returncode == 0 and lines else []

    def wait_nodes(self, count: int, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while sum(1 for n in self.nodes() if n["alive"]) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Ray cluster did not reach {count} live nodes in {seconds:.0f} s")
            time.sleep(1)

    def kill(self, index: int, sig: int = signal.SIGTERM, grace: float = 20) -> None:
        """End node ``index`` as a whole: every process of its session (``ray start``, its raylet, its
        workers, in process groups of their own); SIGKILL after ``grace`` seconds of a graceful stop."""
        proc = self.procs[index]
        _signal_session(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_session(proc.pid, signal.SIGKILL)
            proc.wait()
        if sig != signal.SIGKILL:  # workers that outlive their raylet's graceful stop
            time.sleep(1)
            _signal_session(proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        # Nothing of the cluster is kept: a head's graceful stop (up to 20 s) is cut short.
        for index in reversed(range(len(self.procs))):
            self.kill(index, grace=3)
        shutil.rmtree(self.temp, ignore_errors=True)


def _signal_session(session: int, sig: int) -> None:
    """Send ``sig`` to every process of ``session`` (Linux: the sixth field of /proc/PID/stat)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
            if int(fields[3]) == session:
                os.kill(int(stat.parent.name), sig)
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to signal


def start_sweep(cluster: Cluster, models: list[str], cache: str, device: str, extra: list[str],
                log_path: Path) -> tuple[subprocess.Popen[str], Any]:
    cmd = harness.AUTOTUNE + ["sweep", *models, "--address", cluster.address, "--cache", cache, "--device", device,
                              "--json", *extra]
    sink = open(log_path, "w")
    sink.write("$ autotune " + " ".join(cmd[3:]) + "\n")
    sink.flush()
    proc = subprocess.Popen(cmd, env=cluster.driver_env, stdout=subprocess.PIPE, stderr=sink, text=True,
                            cwd=harness.REPO)
    return proc, sink


def finish_sweep(proc: subprocess.Popen[str], sink: Any, started: float, timeout: float) -> dict[str, Any]:
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, _ = proc.communicate()
    wall = time.perf_counter() - started
    sink.write(f"# rc={proc.returncode} wall={wall:.1f}s\n--- stdout\n{stdout}")
    sink.close()
    return {"rc": proc.returncode, "wall_s": wall, "report": harness.sweep_report(stdout)}


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """The report's totals, and which request each node tuned (by request key)."""
    report = run.get("report") or {}
    totals = report.get("totals") or {}
    # Tuned (or failed) by this sweep's own workers: not cached, done elsewhere or left undone.
    results = [r for r in report.get("requests") or [] if r.get("status") not in NOT_TUNED_HERE]
    by_node: dict[str, int] = {}
    for r in results:
        node = r.get("node") or "?"
        by_node[node] = by_node.get(node, 0) + 1
    return {"rc": run["rc"], "wall_s": round(run["wall_s"], 1),
            "totals": {k: totals.get(k) for k in ("captured", "found", "cached", "tuned", "failed", "stored",
                                                   "elsewhere", "requeued", "startup_seconds", "capture_seconds",
                                                   "tuning_seconds", "wall_seconds")},
            "tuned_keys": sorted(r["request_key"] for r in results if r.get("request_key")),
            "results_per_node": by_node,
            "pointwise": {k: (report.get("pointwise") or {}).get(k) for k in ("saved", "seconds", "error")}}


def stored_results(cache: str) -> list[tuple[str, str]]:
    """(request key, status) of every stored result; [] while the sweep has not made its tables."""
    from autotune.cache.store import Store

    store = Store(cache)
    try:
        return [(result.request.key, result.status) for _, result in store.list_results()]
    except Exception:  # noqa: BLE001 - the database exists before the sweep creates its schema
        return []
    finally:
        store.close()


def spread(cluster: Cluster, models: list[str], cache: str, device: str, extra: list[str], logs: Path,
           timeout: float, kill_node: int | None, kill_after: int) -> dict[str, Any]:
    """One sweep through the cluster; with ``kill_node``, that node dies once ``kill_after``
    results are stored, and the check is that nothing was lost or stored twice."""
    started = time.perf_counter()
    proc, sink = start_sweep(cluster, models, cache, device, extra, logs / "spread.log")
    killed: dict[str, Any] | None = None
    if kill_node is not None:
        stored_before = 0
        while proc.poll() is None and time.perf_counter() - started < timeout:
            stored_before = len(stored_results(cache))
            if stored_before >= kill_after:
                break
            time.sleep(0.5)
        cluster.kill(kill_node, signal.SIGKILL)
        killed = {"node": kill_node, "at_s": round(time.perf_counter() - started, 1),
                  "stored_before": stored_before, "sweep_still_running": proc.poll() is None}
        log.info("killed node %d at %.1f s, %d results stored", kill_node, killed["at_s"], stored_before)
    run = summarize(finish_sweep(proc, sink, started, timeout))
    entry: dict[str, Any] = {"models": models, "run": run}
    if killed is not None:
        rows = stored_results(cache)
        keys = [key for key, _ in rows]
        found = int(run["totals"]["found"] or 0)
        killed.update(stored=len(rows), distinct=len(set(keys)), statuses=sorted({s for _, s in rows}),
                      requeued=run["totals"]["requeued"])
        killed["live_nodes_after"] = sum(1 for n in cluster.nodes() if n["alive"])
        killed["nothing_lost"] = (run["rc"] == 0 and len(set(keys)) == found == len(rows)
                                  and killed["statuses"] == ["ok"])
        entry["killed"] = killed
    return entry


def concurrent(cluster: Cluster, lists: list[list[str]], cache: str, device: str, extra: list[str],
               logs: Path, timeout: float) -> dict[str, Any]:
    started = time.perf_counter()
    procs = [start_sweep(cluster, models, cache, device, extra, logs / f"concurrent_{i}.log")
             for i, models in enumerate(lists)]
    runs = [summarize(finish_sweep(p, s, started, timeout)) for p, s in procs]
    keys = [set(r["tuned_keys"]) for r in runs]
    stored = {key for key, _ in stored_results(cache)}
    tuned_sum = sum(int(r["totals"]["tuned"] or 0) + int(r["totals"]["failed"] or 0) for r in runs)
    return {"models": lists, "runs": runs, "stored_requests": len(stored),
            "tuned_by_both": sorted(keys[0] & keys[1]) if len(keys) == 2 else [],
            "sum_of_tuned": tuned_sum, "exactly_once": (tuned_sum == len(stored) and not (keys[0] & keys[1])
                                                        and all(r["rc"] == 0 for r in runs))}


def _model_files(models: str, directory: Path) -> list[str]:
    """``--models``: paths, or zoo ``name:mode`` entries written as model files into ``directory``
    (the team queue's workload: ``--models $(python -c ...WORKLOAD)``)."""
    from benchmarks.team_queue import model_paths

    directory.mkdir(parents=True, exist_ok=True)
    return model_paths([m for m in models.split(",") if m], directory)


def fresh_database(cache: str, name: str) -> str:
    """A new database beside ``cache``'s (PostgreSQL), or a new SQLite file."""
    if cache.startswith("sqlite"):
        return f"sqlite:///{tempfile.mkdtemp(prefix='cluster_')}/{name}.db"
    import sqlalchemy

    from autotune.cache.url import resolve_cache_url

    url = sqlalchemy.engine.make_url(resolve_cache_url(cache))
    engine = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return url.set(database=name).render_as_string(hide_password=False)


def node_names(ray_nodes: list[dict[str, Any]]) -> dict[str, str]:
    """Ray's node ID -> "node<i> (<id>)", from the custom resource each node was started with."""
    names = {}
    for node in ray_nodes:
        index = next((k for k in node.get("resources") or {} if k.startswith("node") and k[4:].isdigit()), None)
        names[node["id"]] = f"{index} ({node['id'][:8]})" if index else node["id"][:8]
    return names


def render(report: dict[str, Any]) -> list[str]:
    names = node_names(report.get("ray_nodes") or [])

    def row(label: str, models: list[str], run: dict[str, Any]) -> list[Any]:
        t = run["totals"]
        nodes = ", ".join(f"{names.get(k, k[:8])}: {v}" for k, v in run["results_per_node"].items()) or "-"
        return [label, ", ".join(Path(m).stem for m in models), run["rc"], run["wall_s"], t["found"], t["tuned"],
                t["failed"], t["elsewhere"], nodes]

    spread_run, conc = report.get("spread"), report.get("concurrent")
    rows = [row("spread", spread_run["models"], spread_run["run"])] if spread_run else []
    rows += [row(f"concurrent {i + 1}", conc["models"][i], r) for i, r in enumerate(conc["runs"])] if conc else []
    lines = [f"{report['nodes']} Ray nodes (ray {report.get('ray')}), the cache on {report['cache_kind']}.", ""]
    lines += harness.table(["run", "models", "rc", "wall s", "found", "tuned", "failed", "elsewhere",
                            "results per node"], rows)
    killed = (spread_run or {}).get("killed")
    if killed:
        lines += ["", f"Node {killed['node']} SIGKILLed {killed['at_s']} s into the spread sweep, "
                  f"{killed['stored_before']} results stored by then; jobs re-queued: {killed['requeued']}; stored at "
                  f"the end: {killed['stored']} results, {killed['distinct']} distinct; nothing lost or stored twice: "
                  f"**{killed['nothing_lost']}**."]
    if conc:
        lines += ["", f"Concurrent sweeps: {conc['sum_of_tuned']} tuned in all, {conc['stored_requests']} distinct "
                  f"requests stored, tuned by both: {len(conc['tuned_by_both'])}; "
                  f"exactly once: **{conc['exactly_once']}**."]
    return lines


def results(out: Path) -> harness.Results:
    return harness.Results(out, "cluster_run", "Sweeps through a multi-node Ray cluster", render)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cluster_run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.output_options(parser, "cluster_run", "the device and node count", timeout=540.0, per="run",
                           out_help="folder of cluster_run.json/.md and the logs")
    parser.add_argument("--cache", required=True, help="a cache URL: each run writes to a fresh database beside it")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--gpus-per-node", type=int, default=0, help="0: a CPU cluster (--device cpu)")
    parser.add_argument("--cpus-per-node", type=int, default=1)
    parser.add_argument("--models", default="", help="comma-separated model files for the spread sweep")
    parser.add_argument("--concurrent", default="", help="two comma-separated model lists, split by ';'")
    parser.add_argument("--sweep-args", default="", help="extra arguments for every sweep")
    parser.add_argument("--kill-node", type=int, default=None, help="kill this node (not the head) mid-sweep")
    parser.add_argument("--kill-after", type=int, default=1, help="... once this many results are stored")
    args = parser.parse_args(argv)
    if args.kill_node is not None and not 0 < args.kill_node < args.nodes:
        parser.error(f"--kill-node must name a node other than the head: 1 .. {args.nodes - 1}")
    harness.log_to_stderr()
    logs = Path(args.out) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    device = "cuda" if args.gpus_per_node else "cpu"
    extra = args.sweep_args.split()
    if device == "cpu" and "--workers" not in extra:
        extra += ["--workers", str(args.nodes * args.cpus_per_node)]
    info = harness.machine(120)
    import ray

    store = results(Path(args.out))
    label = args.label or f"{harness.slug(info.get('gpu') or 'cpu')}: {args.nodes} nodes"
    report = store.run(label, info, "python -m benchmarks.cluster_run " + " ".join(sys.argv[1:] if argv is None else argv))
    report.update(nodes=args.nodes, ray=ray.__version__, cache_kind=args.cache.split(":", 1)[0])
    cluster = Cluster(args.nodes, args.gpus_per_node, args.cpus_per_node, logs)
    try:
        report.update(node_commands=cluster.commands, ray_nodes=cluster.nodes())
        if args.models:
            report["spread"] = spread(cluster, _model_files(args.models, logs.parent / "models"),
                                      fresh_database(args.cache, "autotune_spread"), device, extra, logs, args.timeout,
                                      args.kill_node, args.kill_after)
            store.save()  # before the cluster stops: a slow stop can be cut off
        if args.concurrent:
            lists = [[m for m in part.split(",") if m] for part in args.concurrent.split(";")]
            report["concurrent"] = concurrent(cluster, lists, fresh_database(args.cache, "autotune_concurrent"),
                                              device, extra, logs, args.timeout)
        store.save()
    finally:
        cluster.stop()
    print(store.path.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
