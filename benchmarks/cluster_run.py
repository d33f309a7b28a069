"""Sweeps through ``--address`` on a real multi-node Ray cluster on one host.

A team's set-up in miniature (README, "A multi-node Ray cluster"): a token-auth Ray
cluster of ``--nodes`` nodes, each its own ``ray start`` with its own GPU
(``CUDA_VISIBLE_DEVICES``) or, on CPU, its own CPUs; the cache on one database
(PostgreSQL for a team). Then:

1. ``spread``: one sweep of ``--models`` through ``--address``, into a fresh database:
   which node tuned what. With ``--kill-node I``, node I (not the head) is killed as a whole
   (SIGKILL to its ``ray start`` session) once ``--kill-after`` results are stored: the sweep
   must still finish, and every request it found must be stored exactly once, each ``ok``.
2. ``concurrent`` (with ``--concurrent A;B``): two sweeps started at the same moment
   over overlapping model lists, into a fresh database: every request must be tuned
   exactly once. Each report's ``totals.tuned`` counts what that sweep tuned itself,
   so their sum must equal the number of distinct requests stored.

    python benchmarks/cluster_run.py --out /tmp/cluster --cache postgresql://postgres@127.0.0.1/test \\
        --models examples/mlp.py --concurrent 'examples/mlp.py,tests/models/tiny_mlp.py;tests/models/tiny_mlp.py'
    python benchmarks/cluster_run.py --out /tmp/cluster --cache postgresql://postgres@127.0.0.1/test \
        --nodes 4 --gpus-per-node 1 --cpus-per-node 16 --models examples/resnet.py,examples/gpt.py --kill-node 3

On a GPU host, ``--gpus-per-node 1`` gives node i the GPU i. Writes
``<out>/cluster_<gpu or cpu>.json`` and ``.md``, and each command's log under ``<out>/logs``.
"""

from __future__ import annotations

import argparse
import datetime as dt
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_time import machine_info, slug  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
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
    """``nodes`` Ray nodes on this host, token auth on; stop() ends them all.

    ``env`` is what a host that joins needs (RAY_AUTH_MODE=token and the token's path);
    ``node_env`` is added to the nodes' own environment (tests shorten Ray's health checks).
    tests/test_cluster.py runs its cluster through this class too.
    """

    def __init__(self, nodes: int, gpus_per_node: int, cpus_per_node: int, logs: Path,
                 node_env: dict[str, str] | None = None) -> None:
        self.temp = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # Ray's socket paths must stay short
        token = self.temp / "token"
        token.write_text(secrets.token_hex(32))
        self.env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "CUDA_VISIBLE_DEVICES")}
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token),
                        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
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
        """End node ``index`` as a whole: every process of its session (``ray start``, its raylet,
        and its workers, which Ray puts in process groups of their own); after ``grace``
        seconds of a graceful stop, SIGKILL."""
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
        # Nothing of the cluster is kept: a head's graceful stop that takes longer than a
        # few seconds (up to 20 s was seen in the tests' teardown) is cut short.
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
    cmd = [sys.executable, "-c", "from autotune.cli import main; main(prog_name='autotune')", "sweep", *models,
           "--address", cluster.address, "--cache", cache, "--device", device, "--json", *extra]
    sink = open(log_path, "w")
    sink.write("$ autotune " + " ".join(cmd[3:]) + "\n")
    sink.flush()
    proc = subprocess.Popen(cmd, env=cluster.env, stdout=subprocess.PIPE, stderr=sink, text=True, cwd=ROOT)
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
    try:
        report = json.loads(stdout[stdout.index("{"):])
    except ValueError:
        report = None
    return {"rc": proc.returncode, "wall_s": wall, "report": report}


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


def stored_request_keys(cache: str) -> list[str]:
    return sorted({key for key, _ in stored_results(cache)})


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
    stored = stored_request_keys(cache)
    tuned_sum = sum(int(r["totals"]["tuned"] or 0) + int(r["totals"]["failed"] or 0) for r in runs)
    return {"models": lists, "runs": runs, "stored_requests": len(stored),
            "tuned_by_both": sorted(keys[0] & keys[1]) if len(keys) == 2 else [],
            "sum_of_tuned": tuned_sum, "exactly_once": (tuned_sum == len(stored) and not (keys[0] & keys[1])
                                                        and all(r["rc"] == 0 for r in runs))}


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


def render(report: dict[str, Any]) -> str:
    info = report["machine"]
    lines = [f"# Sweeps on a {report['nodes']}-node Ray cluster: {info.get('gpu') or 'CPU'}", "",
             f"Generated {report['date']} by `python benchmarks/cluster_run.py {report['argv']}`; "
             f"python {info.get('python')}, torch {info.get('torch')}, triton {info.get('triton')}, "
             f"ray {report.get('ray')}, cache {report['cache_kind']}.", "", "Nodes (each its own `ray start`):", ""]
    lines += [f"- `{c}`" for c in report["node_commands"]]
    lines += ["", "| run | models | rc | wall s | captured | found | tuned | failed | elsewhere | results per node |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]

    names = node_names(report.get("ray_nodes") or [])

    def row(label: str, models: list[str], run: dict[str, Any]) -> str:
        t = run["totals"]
        nodes = ", ".join(f"{names.get(k, k[:8])}: {v}" for k, v in run["results_per_node"].items()) or "-"
        return (f"| {label} | {', '.join(Path(m).stem for m in models)} | {run['rc']} | {run['wall_s']} | "
                f"{t['captured']} | {t['found']} | {t['tuned']} | {t['failed']} | {t['elsewhere']} | {nodes} |")

    if report.get("spread"):
        lines.append(row("spread", report["spread"]["models"], report["spread"]["run"]))
    killed = (report.get("spread") or {}).get("killed")
    if killed:
        lines += ["", f"Node {killed['node']} killed (SIGKILL to its `ray start` session) {killed['at_s']} s into the "
                  f"spread sweep, with {killed['stored_before']} results stored (sweep still running: "
                  f"{killed['sweep_still_running']}). Jobs re-queued: {killed['requeued']}. Stored at the end: "
                  f"{killed['stored']} results, {killed['distinct']} distinct requests, statuses "
                  f"{', '.join(killed['statuses']) or '-'}; live nodes afterwards: {killed.get('live_nodes_after', '-')}; "
                  f"nothing lost or stored twice: **{killed['nothing_lost']}**."]
    conc = report.get("concurrent")
    if conc:
        for i, run in enumerate(conc["runs"]):
            lines.append(row(f"concurrent {i + 1}", conc["models"][i], run))
        lines += ["", f"Concurrent sweeps: {conc['sum_of_tuned']} tuned in all (tuned + failed of both reports), "
                  f"{conc['stored_requests']} distinct requests stored, tuned by both: {len(conc['tuned_by_both'])}; "
                  f"exactly once: **{conc['exactly_once']}**."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cache", required=True,
                        help="a cache URL: each run writes to a fresh database beside it (SQLite: a fresh file)")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--gpus-per-node", type=int, default=0, help="0: a CPU cluster (--device cpu)")
    parser.add_argument("--cpus-per-node", type=int, default=1)
    parser.add_argument("--models", default="", help="comma-separated model files for the spread sweep")
    parser.add_argument("--concurrent", default="", help="two comma-separated model lists, split by ';'")
    parser.add_argument("--sweep-args", default="", help="extra arguments for every sweep")
    parser.add_argument("--kill-node", type=int, default=None,
                        help="kill this node (1 .. nodes-1) during the spread sweep")
    parser.add_argument("--kill-after", type=int, default=1, help="... once this many results are stored")
    parser.add_argument("--timeout", type=float, default=540.0)
    args = parser.parse_args()
    if args.kill_node is not None and not 0 < args.kill_node < args.nodes:
        parser.error(f"--kill-node must name a node other than the head: 1 .. {args.nodes - 1}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = Path(args.out)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    device = "cuda" if args.gpus_per_node else "cpu"
    extra = args.sweep_args.split()
    if device == "cpu" and "--workers" not in extra:
        extra += ["--workers", str(args.nodes * args.cpus_per_node)]
    info = machine_info(120)
    import ray

    report: dict[str, Any] = {"machine": info, "argv": " ".join(sys.argv[1:]), "nodes": args.nodes, "ray": ray.__version__,
                              "cache_kind": args.cache.split(":", 1)[0],
                              "date": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()}
    stem = f"cluster_{slug(info.get('gpu') or 'cpu')}"
    def save() -> None:  # after each run, and before the cluster stops (a slow stop can be cut off)
        (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
        (out / f"{stem}.md").write_text(render(report))

    cluster = Cluster(args.nodes, args.gpus_per_node, args.cpus_per_node, logs)
    try:
        report["node_commands"] = cluster.commands
        report["ray_nodes"] = cluster.nodes()
        log.info("cluster at %s: %d live nodes", cluster.address, sum(1 for n in report["ray_nodes"] if n["alive"]))
        if args.models:
            models = [m for m in args.models.split(",") if m]
            cache = fresh_database(args.cache, "autotune_spread")
            report["spread"] = spread(cluster, models, cache, device, extra, logs, args.timeout, args.kill_node,
                                      args.kill_after)
            log.info("spread: %s", report["spread"]["run"]["totals"])
            save()
        if args.concurrent:
            lists = [[m for m in part.split(",") if m] for part in args.concurrent.split(";")]
            cache = fresh_database(args.cache, "autotune_concurrent")
            report["concurrent"] = concurrent(cluster, lists, cache, device, extra, logs, args.timeout)
            log.info("concurrent: exactly once %s", report["concurrent"]["exactly_once"])
        save()
    finally:
        cluster.stop()
    print((out / f"{stem}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
