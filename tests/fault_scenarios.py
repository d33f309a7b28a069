"""Fault-injection scenarios for the cache: tests/test_faults.py runs them at small N in CI,
and ``python -m benchmarks.faults`` runs that file at full size (N up to 32) for the figures
it commits.

Each scenario runs real processes against a real database and returns an ``Outcome``: what
it checks, whether every check held, and its figures (rows written, retries, seconds to
recover). Nothing is mocked: writers are spawned Python processes using the Store exactly
as sweeps, imports and write-backs do.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from factories import make_env, make_result
from private_postgres import PrivatePostgres

from autotune.cache import CacheUnavailable, CacheWriteRefused, Store

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Outcome:
    scenario: str
    checks: str  # what "passed" means, in words
    passed: bool
    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def require(self, condition: bool, problem: str) -> None:
        if not condition:
            self.problems.append(problem)
            self.passed = False


# ------------------------------------------------------------------ helpers


def _result(key: int, writer: int = 0) -> Any:
    """Request key ``key``; each writer offers different times, so rows differ by writer."""
    return make_result(m=16 + key, host=f"w{writer}", times=[1.0, 0.8 + writer / 1000, 0.7, 0.9])


def _spawn(target: Any, args_list: list[tuple[Any, ...]]) -> list[multiprocessing.process.BaseProcess]:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=args) for args in args_list]
    for proc in procs:
        proc.start()
    return procs


def _join(procs: list[Any], timeout: float = 600) -> list[int | None]:
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(0.1, deadline - time.monotonic()))
    return [proc.exitcode for proc in procs]


def table_counts(url: str) -> dict[str, int]:
    """Rows per table, and duplicate (env, key) pairs (must be 0: the unique index)."""
    import sqlalchemy as sa

    with Store(url, read_only=True) as store:
        engine = store._engine()  # noqa: SLF001 - the scenario inspects raw rows
        with engine.connect() as conn:
            count = {t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one()
                     for t in ("requests", "candidates", "misses")}
            count["duplicates"] = conn.execute(sa.text(
                "SELECT count(*) FROM (SELECT env_id, key FROM requests GROUP BY env_id, key "
                "HAVING count(*) > 1) d")).scalar_one()
            count["orphans"] = conn.execute(sa.text(  # a result without its candidates: half-written
                "SELECT count(*) FROM requests r WHERE r.status = 'ok' AND NOT EXISTS "
                "(SELECT 1 FROM candidates c WHERE c.request_id = r.id)")).scalar_one()
    return count


# ------------------------------------------------------- concurrent writers

KEYS_PER_WRITER = 12
SHARED_KEYS = 8  # every writer writes these: overlapping upserts


def _writer(url: str, role: str, index: int, barrier: Any, jsonl: str) -> None:
    """One process: a sweep's actor, an importer, or a job writing back."""
    store = Store(url)
    own = [_result(1000 + index * KEYS_PER_WRITER + i, index) for i in range(KEYS_PER_WRITER)]
    shared = [_result(i, index) for i in range(SHARED_KEYS)]
    barrier.wait()
    if role == "import":
        with open(jsonl) as fp:
            store.import_jsonl(fp)  # the shared keys, as a team's export
        store.put_results(own)
    elif role == "write_back":
        for result in own + shared:
            store.record_miss(result.env, result.request, host=f"job{index}")
            store.put_result(result)
    else:  # sweep: one result at a time, as each arrives
        for result in own + shared:
            store.put_result(result)
    store.close()


def concurrent_writers(url: str, writers: int, fresh: bool, workdir: Path) -> Outcome:
    backend = "postgresql" if url.startswith("postgres") else "sqlite"
    out = Outcome(f"concurrent writers: {writers} on {backend}, {'fresh' if fresh else 'existing'} database",
                  "every process exits 0; rows == unique keys written; 0 duplicates; 0 half-written", True)
    jsonl = workdir / "shared.jsonl"
    with Store(f"sqlite:///{workdir / 'export_src.db'}") as src:
        src.put_results(_result(i, 999) for i in range(SHARED_KEYS))
        with jsonl.open("w") as fp:
            src.export_jsonl(fp)
    if not fresh:
        with Store(url) as store:
            store.put_results(_result(i, 998) for i in range(SHARED_KEYS))
    roles = ("sweep", "import", "write_back")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(writers)
    began = time.perf_counter()
    procs = _spawn(_writer, [(url, roles[i % 3], i, barrier, str(jsonl)) for i in range(writers)])
    codes = _join(procs)
    seconds = time.perf_counter() - began
    counts = table_counts(url)
    expected = SHARED_KEYS + writers * KEYS_PER_WRITER
    written = writers * (KEYS_PER_WRITER + SHARED_KEYS)
    out.require(codes == [0] * writers, f"exit codes {codes}")
    out.require(counts["requests"] == expected, f"{counts['requests']} rows, expected {expected}")
    out.require(counts["duplicates"] == 0 and counts["orphans"] == 0, f"{counts}")
    out.figures = {"processes": writers, "errors": sum(1 for c in codes if c != 0),
                   "rows": counts["requests"], "expected_rows": expected,
                   "lost": max(0, expected - counts["requests"]), "duplicates": counts["duplicates"],
                   "results_written": written, "seconds": round(seconds, 2),
                   "results_per_s": round(written / seconds, 1)}
    return out


# ------------------------------------------------------ database restart


def _sweep_writer(url: str, count: int, pause: float, report: str) -> None:
    """Writes results one at a time, as a sweep does; reports its retries."""
    store = Store(url)
    store.connect()
    for key in range(count):
        store.put_result(_result(key))
        time.sleep(pause)
    Path(report).write_text(str(store.write_retries))
    store.close()


# The longest the server stays down waiting for the job's first lookup: the writer
# retries a write for 30 s (cache.store._connection.WRITE_RETRY_S).
MAX_DOWN_S = 20.0


def postgres_restart_mid_sweep(server: PrivatePostgres, count: int, workdir: Path) -> Outcome:
    """Stop PostgreSQL while a sweep writes and a training job compiles; start it again
    once the job's first lookup has failed (so the job read while it was down). The server is
    the test's own cluster (tests/private_postgres.py), never the shared one."""
    url = server.url
    out = Outcome("PostgreSQL restarted mid-sweep, a job compiling meanwhile",
                  "the writer retries with backoff, exits 0 and every result is stored; the job, "
                  "whose lookups meet the stopped server, warns once, compiles (exit 0, right output); "
                  "a reader gets errors while it is down, then reads again", True)
    report = workdir / "retries.txt"
    with Store(url) as store:
        store.upgrade()  # the reader opens read-only: the schema must be there
    job = Job(workdir, "job", "--cache", url, "--ready-file", str(workdir / "job.ready"),
              "--go-file", str(workdir / "job.go"))
    if not job.wait_file(job.ready):  # hook installed, Inductor warmed up; else never stop the server
        out.require(False, f"the job never got ready: {job.finish().get('output_text', '')[-1500:]}")
        return out
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_sweep_writer, args=(url, count, 0.05, str(report)))
    proc.start()
    reader = Store(url, read_only=True, connect_timeout=2)
    reader.connect()
    deadline = time.monotonic() + 60
    while reader.stats()["requests"] < 5 and time.monotonic() < deadline:
        time.sleep(0.1)  # restart mid-sweep: once the writer is well under way
    began = time.perf_counter()
    try:
        server.stop()
        job.go.write_text("go")  # its compile starts now: every lookup meets the stopped server
        job.warned.wait(MAX_DOWN_S)
        read_errors = _read_errors(reader)
    finally:
        if not server.running():
            server.start()
    down = time.perf_counter() - began
    read_errors += _read_until_up(reader, began)
    recovered_after = time.perf_counter() - began
    reader.close()
    proc.join(300)
    result = job.finish()
    counts = table_counts(url)
    retries = int(report.read_text()) if report.exists() else None
    out.require(proc.exitcode == 0, f"writer exit code {proc.exitcode}")
    out.require(counts["requests"] == count and counts["orphans"] == 0, f"{counts}")
    out.require(job.warned.is_set() and down < MAX_DOWN_S + 10,
                f"the job did not read while the server was down (no lookup within {MAX_DOWN_S:.0f} s of 'go')")
    out.require(read_errors >= 1 and recovered_after < 60, "the reader never met the restart or never read again")
    _job_checks(out, result, 1)
    out.figures = {"rows": counts["requests"], "expected_rows": count, "lost": count - counts["requests"],
                   "write_retries": retries, "down_seconds": round(down, 2), "reader_errors": read_errors,
                   "reader_recovered_s": round(recovered_after, 2), "job_exit": result.get("returncode"),
                   "job_warnings": result.get("warnings"), "job_cache_errors": (result.get("stats") or {}).get("errors"),
                   "job_compile_s": round(sum(result.get("compile_seconds") or [0]), 1),
                   "job_right_output": right_output(result)}
    return out


def _read_errors(reader: Store) -> int:
    """One read while the server is down: 1 if it failed (as it must), else 0."""
    try:
        reader.lookup(make_env(), _result(0).request.key)
    except Exception:  # noqa: BLE001 - the hook turns exactly this into its one warning
        return 1
    return 0


def _read_until_up(reader: Store, began: float) -> int:
    errors = 0
    while time.perf_counter() - began < 90:
        try:
            reader.lookup(make_env(), _result(0).request.key)
            return errors
        except Exception:  # noqa: BLE001 - reported as reader_errors
            errors += 1
            time.sleep(0.2)
    return errors


# ----------------------------------------------------------- killed writer


def _batch_writer(url: str, batches: int, size: int) -> None:
    store = Store(url)
    for batch in range(batches):
        store.put_results(_result(batch * size + i) for i in range(size))


def killed_writer(url: str, kills: int, workdir: Path, seed: int = 0) -> Outcome:
    """SIGKILL a process writing batches at random moments; then re-run it to the end."""
    import random

    rng = random.Random(seed)
    out = Outcome("writer SIGKILLed at random points",
                  "integrity check passes; no half-written request; a re-run writes only what is missing", True)
    batches, size = 40, 5
    survived = [0]
    with Store(url) as store:
        store.upgrade()
    for _ in range(kills):
        proc = _spawn(_batch_writer, [(url, batches, size)])[0]
        deadline = time.monotonic() + 60
        while table_counts(url)["requests"] <= survived[-1] and time.monotonic() < deadline:
            time.sleep(0.02)  # until it writes (the first rows are rewritten by each run)
        time.sleep(rng.uniform(0.0, 0.3))  # then somewhere mid-writes
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        survived.append(table_counts(url)["requests"])
    before = table_counts(url)
    with Store(url) as store:
        missing = batches * size - len(store.cached_request_keys(make_env()))
        began = time.perf_counter()
        store.put_results(_result(k) for k in range(batches * size))
        rerun = time.perf_counter() - began
    after = table_counts(url)
    integrity = _integrity(url)
    out.require(integrity == "ok", f"integrity_check: {integrity}")
    out.require(before["orphans"] == 0 and before["duplicates"] == 0, f"after the kills: {before}")
    out.require(after["requests"] == batches * size, f"after the re-run: {after}")
    out.figures = {"kills": kills, "rows_after_each_kill": survived[1:], "missing_before_rerun": missing,
                   "integrity": integrity, "rerun_seconds": round(rerun, 2), "lost": 0 if out.passed else None}
    return out


def _integrity(url: str, immutable: bool = False) -> str:
    """PRAGMA integrity_check, read-only. immutable: on a read-only filesystem (where
    even a reader cannot make the -shm file); only valid with no WAL left over."""
    if not url.startswith("sqlite"):
        return "ok"  # PostgreSQL: transactions are atomic; the orphan check covers it
    path = url.split("sqlite:///", 1)[1]
    # closing(): sqlite3's own context manager commits but leaves the file open (and busy).
    with closing(sqlite3.connect(f"file:{path}?mode=ro{'&immutable=1' if immutable else ''}", uri=True)) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


# ------------------------------------------------------------- disk full


def small_tmpfs(directory: Path, size: str = "400k") -> str | None:
    """Mount a tiny tmpfs at directory; None if done, else why not (not root, no mount)."""
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr.strip() or "mount failed")


def unmount(directory: Path) -> None:
    if subprocess.run(["umount", str(directory)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True)  # busy: detach now, free later


def fill(store: Store) -> int:
    """Store junk results until the disk is full; how many fitted."""
    for key in range(100_000):
        try:
            store.put_result(_result(50_000 + key))
        except CacheWriteRefused:
            return key
    raise AssertionError("the disk never filled")


def disk_full(directory: Path) -> Outcome:
    """Write until the filesystem is full: the store says so in one line, and stops."""
    out = Outcome("SQLite on a full disk",
                  "the first refused write raises CacheWriteRefused (one line); the file stays intact; "
                  "every result reported stored is there", True)
    url = f"sqlite:///{directory / 'cache.db'}"
    stored, error = 0, ""
    with Store(url) as store:
        for key in range(5000):
            try:
                store.put_result(_result(key))
            except CacheWriteRefused as refused:
                error = str(refused)
                break
            stored += 1
    counts = table_counts(url)
    integrity = _integrity(url)
    out.require(bool(error) and "\n" not in error and "full" in error, f"error: {error!r}")
    out.require(integrity == "ok" and counts["requests"] == stored, f"{integrity}, {counts}, stored {stored}")
    out.figures = {"stored": stored, "rows": counts["requests"], "integrity": integrity, "error": error[:160]}
    return out


def read_only_file(directory: Path) -> Outcome:
    """The filesystem holding the cache turns read-only (as root ignores file modes,
    this remounts a tmpfs read-only): writes stop with one line, the file is unchanged."""
    out = Outcome("SQLite cache on a read-only filesystem",
                  "a write raises one line (CacheWriteRefused or CacheUnavailable), no traceback; "
                  "the file is unchanged", True)
    path = directory / "ro.db"
    url = f"sqlite:///{path}"
    with Store(url) as store:
        store.put_result(_result(0))
    subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True, capture_output=True)
    error = ""
    try:
        with Store(url) as store:
            store.put_result(_result(1))
    except (CacheWriteRefused, CacheUnavailable) as refused:
        error = str(refused)
    except Exception as other:  # noqa: BLE001 - reported as the scenario's failure
        error = f"unexpected {type(other).__name__}: {other}"
    integrity = _integrity(url, immutable=True)
    out.require(bool(error) and "\n" not in error and not error.startswith("unexpected"), f"error: {error!r}")
    out.require(integrity == "ok", f"integrity_check: {integrity}")
    out.figures = {"error": error[:200], "integrity": integrity}
    return out


def scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="autotune-faults-"))


# ------------------------------------------------- processes: jobs and sweeps

HOOK_JOB = REPO / "tests" / "hook_job.py"
TINY = REPO / "tests" / "models" / "tiny_mlp.py"
WARNING = "kernel cache unavailable"  # the hook's one warning


def _proc_parents() -> dict[int, int]:
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            parents[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])  # comm may hold spaces
    return parents


def descendants(pid: int) -> list[int]:
    """Every live process below pid (Ray's raylet, actors, their tuning children)."""
    parents, found, todo = _proc_parents(), [], [pid]
    while todo:
        pid = todo.pop()
        children = [p for p, parent in parents.items() if parent == pid]
        found += children
        todo += children
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on; None once the pid is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # comm may hold ")"
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot: with the pid, it names one
    process, even after the pid is reused by another."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None  # field 22 of stat


def alive(pid: int, started: int | None = None) -> bool:
    """pid is running (not a zombie) and, if started is given, is still the process that
    started then rather than a later one that reused the pid."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return False
    return started is None or int(fields[19]) == started


def reap(pids: list[int], grace: float) -> dict[int, float | None]:
    """Wait up to grace s for processes a SIGKILL orphaned to end; SIGKILL the rest
    (ours to end). Seconds until each ended (None: it was still there). Each process
    is known by its pid and start time, so a pid reused meanwhile is never killed."""
    began, ended = time.monotonic(), {}
    started = {pid: start_time(pid) for pid in pids}
    while len(ended) < len(pids) and time.monotonic() - began < grace:
        ended.update({pid: time.monotonic() - began for pid in pids
                      if pid not in ended and not alive(pid, started[pid])})
        time.sleep(0.2)
    for pid in pids:
        if pid not in ended and alive(pid, started[pid]):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return {pid: (round(ended[pid], 1) if pid in ended else None) for pid in pids}


def right_output(report: dict[str, Any]) -> bool:
    """The compiled model's output matches the eager model's, both saved by the job.

    (Never import the model file here: it sets Inductor's freezing in this process,
    and a later in-process capture would then miss it as the model's own override.)
    """
    import torch

    if "output" not in report or "eager_output" not in report:
        return False
    expected = torch.load(report["eager_output"])
    return bool(torch.allclose(torch.load(report["output"]), expected, rtol=1e-4, atol=1e-4))


class Job:
    """tests/hook_job.py in its own process: a training job with the hook installed."""

    def __init__(self, workdir: Path, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.out = workdir / f"{name}.json"
        self.ready, self.go = workdir / f"{name}.ready", workdir / f"{name}.go"
        self.began = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, str(HOOK_JOB), str(self.out), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.lines: list[str] = []
        self.warned = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if WARNING in line:
                self.warned.set()

    def wait_file(self, path: Path, timeout: float = 240) -> bool:
        deadline = time.monotonic() + timeout
        while not path.exists() and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return path.exists()

    def finish(self, timeout: float = 300) -> dict[str, Any]:
        """Wait for the exit; the job's report plus exit code, output, wall and exit lag."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        ended = time.time()
        self._reader.join(10)
        report = json.loads(self.out.read_text()) if self.out.exists() else {}
        report.update(returncode=code, output_text="".join(self.lines), wall_s=time.perf_counter() - self.began,
                      warnings=sum(WARNING in line for line in self.lines))
        if "finished_at" in report:
            report["exit_lag_s"] = ended - report["finished_at"]
        return report


def _job_checks(out: Outcome, report: dict[str, Any], warnings: int) -> None:
    out.require(report.get("returncode") == 0, f"job exit {report.get('returncode')}: "
                f"{report.get('output_text', '')[-1500:]}")
    out.require(report.get("warnings") == warnings,
                f"{report.get('warnings')} warnings, expected {warnings}")
    out.require(right_output(report), "the job's output differs from the eager model's")


def _seconds(values: Any) -> Any:
    return [round(v, 2) for v in values] if isinstance(values, list) else values


# --------------------------------------------------------- a slow database


class LatencyProxy:
    """A TCP forwarder to PostgreSQL that delivers everything the server sends
    ``delay`` seconds late, like a distant or overloaded server: every round trip
    (connecting, each query, each commit) costs ``delay`` more. What the client
    sends goes through at once. A client that goes away (a killed job) takes its
    server connection with it, as the server would see."""

    def __init__(self, url: str, delay: float) -> None:
        import sqlalchemy as sa

        parsed = sa.make_url(url)
        self.target = (parsed.host or "127.0.0.1", parsed.port or 5432)
        self.delay = delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        port = self.listener.getsockname()[1]
        self.url = url.replace(f"@{parsed.host}:{parsed.port or 5432}/", f"@127.0.0.1:{port}/", 1)
        assert self.url != url or parsed.port is None, "the URL must name host:port"
        self.server_ports: set[int] = set()  # our side of each server connection (pg_stat_activity.client_port)
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.target)
            except OSError:
                return
            self.server_ports.add(server.getsockname()[1])
            self._sockets += [client, server]
            threading.Thread(target=self._forward, args=(client, server, 0.0), daemon=True).start()
            threading.Thread(target=self._forward, args=(server, client, self.delay), daemon=True).start()

    @staticmethod
    def _forward(src: socket.socket, dst: socket.socket, delay: float) -> None:
        """Copy src to dst, each chunk ``delay`` after it arrived (a queue, so chunks in
        flight overlap: latency, not a slower line); at the end close both ways."""
        import queue

        chunks: queue.Queue[tuple[float, bytes]] = queue.Queue()

        def send() -> None:
            while True:
                due, data = chunks.get()
                time.sleep(max(0.0, due - time.monotonic()))
                if not data:
                    break
                try:
                    dst.sendall(data)
                except OSError:
                    break
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        threading.Thread(target=send, daemon=True).start()
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            chunks.put((time.monotonic() + delay, data))
            if not data:
                return

    def stop(self) -> None:
        _close_all(self.listener, self._sockets)

    def __enter__(self) -> LatencyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _close_all(listener: socket.socket, sockets: list[socket.socket]) -> None:
    """A proxy's listener and every socket it opened; shutdown() wakes its accept(), which
    close() alone would not."""
    try:
        listener.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    listener.close()
    for sock in sockets:
        try:
            sock.close()
        except OSError:
            pass


def baseline_jobs(url: str, workdir: Path, lookup_timeout: float = 2.0) -> dict[str, dict[str, Any]]:
    """The same job against the database directly: cold (an empty cache, so it tunes
    and writes back) and then warm (every request a hit)."""
    with Store(url) as store:
        store.upgrade()
    env = {"AUTOTUNE_LOOKUP_TIMEOUT": str(lookup_timeout)}
    return {name: Job(workdir, name, "--cache", url, env=env).finish() for name in ("cold", "warm")}


def slow_database(url: str, delay: float, workdir: Path, baseline: dict[str, dict[str, Any]] | None = None,
                  lookup_timeout: float = 2.0) -> Outcome:
    """A real job (tests/hook_job.py: an Inductor CPU compile under max-autotune through
    autotune.warm_start) whose database answers every packet ``delay`` s late.

    baseline: baseline_jobs() of the same database, for the figures (and, under the
    timeout, the results the slow job should be served).
    """
    slow = delay >= lookup_timeout / 2  # a connection takes >= 2 round trips: past the timeout
    out = Outcome(f"PostgreSQL answering {delay * 1000:.0f} ms late (lookup timeout {lookup_timeout:g} s)",
                  ("the job's compile waits on the cache at most the lookup timeout, then it warns once "
                   "and compiles as plain max-autotune: exit 0, right output" if slow else
                   "lookups stay under the timeout: every request served from the cache, no warning, "
                   "right output"), True)
    with Store(url) as store:
        store.upgrade()
    with LatencyProxy(url, delay) as proxy:
        report = Job(workdir, f"slow{delay:g}", "--cache", proxy.url,
                     env={"AUTOTUNE_LOOKUP_TIMEOUT": str(lookup_timeout)}).finish()
    stats = report.get("stats") or {}
    _job_checks(out, report, 1 if slow else 0)
    if slow:
        out.require(stats.get("store_wait_s", 1e9) <= lookup_timeout + 0.5,
                    f"the compile waited {stats.get('store_wait_s')} s on the cache")
    else:
        out.require(stats.get("hits") == 2 and report.get("benchmarks") == 0, f"not served: {stats}")
    for name, run in (baseline or {}).items():
        out.require(run.get("returncode") == 0, f"{name} job exit {run.get('returncode')}")
        out.figures[f"compile_s_{name}_direct"] = round(sum(run.get("compile_seconds") or [0]), 2)
    out.figures.update(
        compile_s_slow=round(sum(report.get("compile_seconds") or [0]), 2), delay_ms=round(delay * 1000),
        lookup_timeout_s=lookup_timeout, waited_on_cache_s=round(stats.get("store_wait_s", 0), 2),
        warnings=report.get("warnings"), hits=stats.get("hits"), cache_errors=stats.get("errors"),
        benchmarks=report.get("benchmarks"), exit_after_compile_s=round(report.get("exit_lag_s", -1), 2),
        job_wall_s=round(report["wall_s"], 1), right_output=right_output(report))
    return out


# ------------------------------------------------------ a stalled database


class StallingProxy:
    """A TCP server on 127.0.0.1 that a job takes for PostgreSQL and that stops answering.

    ``stall_on`` empty: it accepts connections and never sends a byte (a server that hangs
    before its greeting). Otherwise it forwards to the real server until the client sends bytes
    holding ``stall_on`` (the job's first lookup, say), and from then on that connection and
    every later one get nothing more, though none is closed: a server stalled after connecting,
    which no server-side timeout ends (the query never reaches it). Everything ends by
    ``limit_s`` at the latest, and with ``stop()``."""

    def __init__(self, url: str, stall_on: bytes = b"", limit_s: float = 300.0) -> None:
        import sqlalchemy as sa

        parsed = sa.make_url(url)
        self.target = (parsed.host or "127.0.0.1", parsed.port or 5432)
        self.stall_on = stall_on
        self.stalled = threading.Event()
        self.ended = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        port = self.listener.getsockname()[1]
        self.url = url.replace(f"@{parsed.host}:{parsed.port or 5432}/", f"@127.0.0.1:{port}/", 1)
        assert self.url != url, "the URL must name host:port"
        self.connections = 0
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Timer(limit_s, self.stop).start()

    def _accept(self) -> None:
        while not self.ended.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self._sockets.append(client)
            if not self.stall_on or self.stalled.is_set():
                continue  # held open, never answered
            try:
                server = socket.create_connection(self.target)
            except OSError:
                continue
            self._sockets.append(server)
            threading.Thread(target=self._forward, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._forward, args=(server, client, False), daemon=True).start()

    def _forward(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        while not self.ended.is_set():
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            if from_client and self.stall_on in data:
                self.stalled.set()
            if self.stalled.is_set():
                self.ended.wait()  # swallowed: the client waits for an answer that never comes
                return
            try:
                dst.sendall(data)
            except OSError:
                return

    def stop(self) -> None:
        self.ended.set()
        _close_all(self.listener, self._sockets)

    def __enter__(self) -> StallingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# The goal (issue 78): a job whose database stalls exits within this long of its last result.
STALLED_EXIT_S = 10.0


def _locked_tables(url: str, tables: tuple[str, ...]) -> Any:
    """A connection holding ACCESS EXCLUSIVE locks on ``tables`` of the URL's schema in an open
    transaction, as any role with UPDATE on them can take; the caller closes it (which releases them)."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.NullPool)
    conn = engine.connect()
    conn.exec_driver_sql("SET lock_timeout = '10s'")  # taking the lock itself must not hang the test
    conn.exec_driver_sql(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")
    return conn, engine


def stalled_database(url: str, how: str, workdir: Path, env: dict[str, str], lookup_timeout: float = 2.0) -> Outcome:
    """A real job (tests/hook_job.py: a CPU Inductor compile through warm_start) whose
    database stalls: ``how`` is "lock" (another session holds ACCESS EXCLUSIVE on the results'
    tables for the job's whole life), "silent" (a server that accepts and never answers) or
    "stalls" (the real server until the job's first lookup, then nothing more)."""
    out = Outcome(f"a stalled database ({how}; {' '.join(f'{k}={v}' for k, v in env.items()) or 'defaults'})",
                  f"the job warns once, computes the right result, exits 0 within {STALLED_EXIT_S:g} s of "
                  "its last result, and its compile waited on the cache about the lookup timeout", True)
    with Store(url) as store:
        store.upgrade()
        store.put_result(_result(0))  # something stored: the job's reads have rows to reach for
    job_env = {"AUTOTUNE_LOOKUP_TIMEOUT": str(lookup_timeout), **env}
    held = None
    proxy = None
    try:
        if how == "lock":
            held = _locked_tables(url, ("requests", "candidates", "misses", "kernel_configs", "artifacts"))
            job_url = url
        else:
            proxy = StallingProxy(url, stall_on=b"requests" if how == "stalls" else b"")
            job_url = proxy.url
        report = Job(workdir, f"stalled-{how}", "--cache", job_url, env=job_env).finish(timeout=420)
        still_locked = held is not None and not held[0].closed
    finally:
        if held is not None:
            held[0].close()
            held[1].dispose()
        if proxy is not None:
            proxy.stop()
    stats = report.get("stats") or {}
    _job_checks(out, report, 1)
    lag = report.get("exit_lag_s", 1e9)
    out.require(lag <= STALLED_EXIT_S, f"the job exited {lag:.1f} s after its last result")
    out.require(stats.get("store_wait_s", 1e9) <= lookup_timeout + 1.0,
                f"the compile waited {stats.get('store_wait_s')} s on the cache")
    if proxy is not None:
        out.require(proxy.connections >= 1, "the job never connected to the stalling server")
        if how == "stalls":
            out.require(proxy.stalled.is_set(), "the job never sent a lookup to the stalling server")
    out.figures = {"exit_after_last_result_s": round(lag, 2), "waited_on_cache_s": round(stats.get("store_wait_s", 0), 2),
                   "cache_errors": stats.get("errors"), "warnings": report.get("warnings"),
                   "job_wall_s": round(report.get("wall_s", 0), 1), "right_output": right_output(report),
                   "lock_held_throughout": still_locked if how == "lock" else None}
    return out


# ------------------------------------------------ a job killed mid-write-back

# Statements of the write-back's transaction (cache/store/_results.py: _put), in order;
# a kill right after one of them leaves the ones before it uncommitted.
WRITE_BACK_STAGES = ("INSERT INTO requests", "INSERT INTO candidates")


def _open_write(admin: Any, ports: set[int], stage: str) -> int | None:
    """The backend pid of a proxied connection whose open transaction last ran ``stage``."""
    import sqlalchemy as sa

    with admin.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT pid, client_port, query FROM pg_stat_activity "
            "WHERE backend_xid IS NOT NULL AND state = 'idle in transaction'")).all()
    return next((pid for pid, port, query in rows if port in ports and query.lstrip().startswith(stage)), None)


def killed_job_mid_write_back(url: str, kills: int, workdir: Path, seed: int = 0, delay: float = 0.1,
                              then_write: bool = True) -> Outcome:
    """SIGKILL a real job while its write-back transaction is open on the server.

    A LatencyProxy (``delay`` per round trip) stretches each write-back to ~1 s, so the
    kill lands between two statements of it: after the request row, or after the
    candidates, before COMMIT. then_write: a last job writes back without a kill.
    """
    import random

    import sqlalchemy as sa

    rng = random.Random(seed)
    out = Outcome("training job SIGKILLed mid-write-back (PostgreSQL)",
                  "each kill lands inside an open write-back transaction; afterwards no request without "
                  "its candidates, no duplicate, no row of the killed transaction; a later job writes back "
                  "both results", True)
    with Store(url) as store:
        store.upgrade()
    admin = sa.create_engine(url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    env = {"AUTOTUNE_LOOKUP_TIMEOUT": "60"}  # the proxy makes every call slow: do not give up on it
    landed, after_kill = [], []
    with LatencyProxy(url, delay) as proxy:
        for index in range(kills):
            stage = rng.choice(WRITE_BACK_STAGES)
            job = Job(workdir, f"killed{index}", "--cache", proxy.url, env=env)
            backend = None
            deadline = time.monotonic() + 240
            while backend is None and job.proc.poll() is None and time.monotonic() < deadline:
                backend = _open_write(admin, proxy.server_ports, stage)
                time.sleep(0.01)
            job.proc.kill()
            job.finish()
            landed.append(stage if backend is not None else None)
            _wait_gone(admin, backend)
            after_kill.append(table_counts(url))
    last = Job(workdir, "after", "--cache", url).finish() if then_write else None
    admin.dispose()
    final = table_counts(url)
    out.require(all(landed), f"kills that missed a write-back: {landed}")
    out.require(all(c["orphans"] == 0 and c["duplicates"] == 0 for c in after_kill), f"{after_kill}")
    out.require(all(c["requests"] == 0 for c in after_kill), f"rows of a killed transaction: {after_kill}")
    if last is not None:
        out.require(last.get("returncode") == 0 and (last.get("stats") or {}).get("written") == 2,
                    f"{last.get('stats')}")
        out.require(final["requests"] == 2 and final["orphans"] == 0, f"{final}")
    out.figures = {"kills": kills, "killed_after": landed, "rows_after_each_kill": [c["requests"] for c in after_kill],
                   "orphans": sum(c["orphans"] for c in after_kill), "delay_ms": round(delay * 1000),
                   "later_job_written": (last.get("stats") or {}).get("written") if last else None,
                   "rows_at_end": final["requests"]}
    return out


def _wait_gone(admin: Any, backend: int | None, timeout: float = 30) -> None:
    """Until the killed job's server session has ended (and rolled back)."""
    import sqlalchemy as sa

    deadline = time.monotonic() + timeout
    while backend is not None and time.monotonic() < deadline:
        with admin.connect() as conn:
            if not conn.execute(sa.text("SELECT 1 FROM pg_stat_activity WHERE pid = :p"), {"p": backend}).first():
                return
        time.sleep(0.05)


# ------------------------------------------------- sweeps and their workers killed


def tiny_mlp_requests(batch_sizes: str) -> int:
    """tiny_mlp's two GEMMs per batch size, and per graph recompiled with a dynamic batch
    (one, when there are several sizes: see inductor_glue.capture)."""
    sizes = len(batch_sizes.split(","))
    return 2 * sizes + (2 if sizes > 1 else 0)


def sweep_command(url: str, batch_sizes: str) -> list[str]:
    return [sys.executable, "-m", "autotune.cli", "sweep", str(TINY), "--device", "cpu", "--batch-sizes", batch_sizes,
            "--cache", url, "--json"]


class ChildWatch:
    """Follows the tuning child (``python -m workers.child``) under a sweep's Ray actor.

    The child runs its warm-up compile, then one job after another, each in fresh
    Inductor cache dirs (workers/tune.py). On CPU the first compiled candidate that
    the child loads from a job's dir marks that job's benchmarking: it is loaded to
    be timed. So the n-th dir it loads from is job n - 1's (the first: the warm-up).
    """

    def __init__(self, sweep_pid: int) -> None:
        self.sweep_pid = sweep_pid
        self.child: int | None = None
        self.child_started: int | None = None  # with the pid, names the child even if the pid is reused
        self.dirs: list[str] = []

    def poll(self) -> None:
        if self.child is None or not alive(self.child, self.child_started):
            found = [p for p in descendants(self.sweep_pid) if "autotune.workers.child" in cmdline(p)]
            if found and (found[0], start_time(found[0])) != (self.child, self.child_started):
                self.child, self.child_started, self.dirs = found[0], start_time(found[0]), []
        if self.child is None:
            return
        try:
            maps = Path(f"/proc/{self.child}/maps").read_text()
        except OSError:
            return
        for line in maps.splitlines():
            path = line.split(None, 5)[-1] if line.count(" ") >= 5 else ""
            if ".main.so" in path:
                directory = str(Path(path.split(" (deleted)")[0]).parent.parent)
                if directory not in self.dirs:
                    self.dirs.append(directory)

    def wait_benchmark(self, sweep: subprocess.Popen[str], job: int, timeout: float = 300) -> int | None:
        """Block until the child benchmarks its job-th job (1-based); its pid, or None."""
        deadline = time.monotonic() + timeout
        while sweep.poll() is None and time.monotonic() < deadline:
            self.poll()
            if len(self.dirs) > job:
                return self.child
            time.sleep(0.02)
        return None


def _ok_rows(url: str) -> int:
    import sqlalchemy as sa

    with Store(url, read_only=True) as store, store._engine().connect() as conn:  # noqa: SLF001
        return int(conn.execute(sa.text("SELECT count(*) FROM requests WHERE status = 'ok'")).scalar_one())


# Processes that must end with a killed sweep: they hold a core and a tuning job each.
TUNING_PROCESSES = ("ray::TuningWorker", "autotune.workers.child")


def _kill_sweep(url: str, batch_sizes: str, rng: Any, workdir: Path, grace: float) -> dict[str, Any]:
    """Run a sweep and SIGKILL it at a random moment of its tuning: a random job, a
    random delay after that job started benchmarking. What it leaves behind."""
    remaining = tiny_mlp_requests(batch_sizes) - _ok_rows(url)
    target = rng.randint(1, max(1, remaining - 1))  # and leave at least one for the re-run
    sweep = subprocess.Popen(sweep_command(url, batch_sizes), cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=(workdir / "killed_sweep.err").open("w"), text=True)
    watch = ChildWatch(sweep.pid)
    watch.wait_benchmark(sweep, target)
    time.sleep(rng.uniform(0.0, 2.0))  # job 1 benchmarks for ~2 s (this 2-core box): before or after it stores
    tree = descendants(sweep.pid)
    names = {pid: cmdline(pid).strip()[:60] for pid in tree}
    sweep.kill()
    sweep.wait()
    lifetimes = reap(tree, grace)
    counts = table_counts(url)
    return {"job": target, "rows": counts["requests"], "ok_rows": _ok_rows(url), "orphans": counts["orphans"],
            "duplicates": counts["duplicates"], "integrity": _integrity(url), "processes": len(tree),
            "tuning_left": [names[p] for p, t in lifetimes.items()
                            if t is None and any(n in names[p] for n in TUNING_PROCESSES)],
            "lingering": {f"{names[p]} [{p}]": t for p, t in lifetimes.items() if t is None or t > 5}}


def _sweep_json(url: str, batch_sizes: str, kill_child: bool, workdir: Path) -> dict[str, Any]:
    """Run a sweep to its end, SIGKILLing its tuning child mid-benchmark of its first job
    if told; the sweep's --json report, with its exit code and what was killed."""
    err = workdir / "sweep.err"
    sweep = subprocess.Popen(sweep_command(url, batch_sizes), cwd=REPO, stdout=subprocess.PIPE,
                             stderr=err.open("w"), text=True)
    killed = None
    if kill_child:
        watch = ChildWatch(sweep.pid)
        killed = watch.wait_benchmark(sweep, 1)
        if killed is not None and alive(killed, watch.child_started):
            os.kill(killed, signal.SIGKILL)
    stdout, _ = sweep.communicate(timeout=600)
    report = json.loads(stdout) if stdout.strip() else {"totals": {}, "requests": []}
    report.update(returncode=sweep.returncode, killed_child=killed, stderr=err.read_text()[-2000:])
    return report


def killed_sweeps(url: str, batch_sizes: str, kills: int, workdir: Path, seed: int = 0,
                  grace: float = 10.0) -> Outcome:
    """A real `autotune sweep` SIGKILLed ``kills`` times at random points, then re-run
    to the end with its tuning child SIGKILLed mid-benchmark of the re-run's first job."""
    import random

    rng = random.Random(seed)
    backend = "postgresql" if url.startswith("postgres") else "sqlite"
    out = Outcome(f"`autotune sweep` SIGKILLed at random points ({kills}x, {backend}), then re-run with its "
                  "worker's tuning child SIGKILLed mid-benchmark",
                  "after each kill: integrity ok, no half-written or duplicate result, no actor or tuning "
                  "child left running; the re-run finds the stored results cached and tunes only the rest, records the "
                  "killed child's request as failed with its reason, finishes (exit 1)", True)
    with Store(url) as store:
        store.upgrade()
    after = [_kill_sweep(url, batch_sizes, rng, workdir, grace) for _ in range(kills)]
    ok_before = _ok_rows(url)
    rerun = _sweep_json(url, batch_sizes, True, workdir)
    totals = rerun["totals"]
    failed = [r for r in rerun["requests"] if r["status"] not in ("ok", "cached")]
    final = table_counts(url)
    for state in after:
        out.require(state["integrity"] == "ok" and state["orphans"] == 0 and state["duplicates"] == 0, f"{state}")
        out.require(not state["tuning_left"], f"tuning processes left running after the kill: {state}")
    out.require(rerun["killed_child"] is not None, "the re-run's tuning child was never seen benchmarking")
    out.require(rerun["returncode"] == 1, f"re-run exit {rerun['returncode']}: {rerun['stderr']}")
    out.require(totals.get("cached") == ok_before, f"cached {totals.get('cached')}, stored before {ok_before}")
    out.require(totals.get("tuned", 0) + totals.get("failed", 0) == totals.get("found", 0) - ok_before, f"{totals}")
    out.require(len(failed) == 1 and "died" in (failed[0]["error"] or ""), f"failures: {failed}")
    out.require(final["requests"] == totals.get("found") and final["orphans"] == 0 and _integrity(url) == "ok",
                f"{final}")
    out.figures = {"requests": totals.get("found"), "kills": kills, "killed_in_job": [a["job"] for a in after],
                   "ok_rows_after_each_kill": [a["ok_rows"] for a in after],
                   "grace_s": grace, "lingering_after_kill": [a["lingering"] for a in after],
                   "integrity": "ok" if all(a["integrity"] == "ok" for a in after) else "FAILED",
                   "rerun_cached": totals.get("cached"), "rerun_tuned": totals.get("tuned"),
                   "rerun_failed": totals.get("failed"), "rerun_exit": rerun["returncode"],
                   "failure_recorded": failed[0]["error"] if failed else None,
                   "rerun_wall_s": totals.get("wall_seconds")}
    return out


# ------------------------------------------------------- imports and a sweep on a full disk


def concurrent_imports(url: str, importers: int, workdir: Path) -> Outcome:
    """`autotune cache import` processes at once into one fresh database: each creates the
    schema if it finds none, so they race to create it."""
    out = Outcome(f"{importers} concurrent `autotune cache import` into a fresh database",
                  "every importer exits 0; every row arrives once", True)
    with Store(f"sqlite:///{workdir / 'src.db'}") as src:
        src.put_results(_result(k) for k in range(40))
        with (workdir / "x.jsonl").open("w") as fp:
            src.export_jsonl(fp)
    command = [sys.executable, "-m", "autotune.cli", "cache", "--cache", url, "import", str(workdir / "x.jsonl")]
    began = time.perf_counter()
    procs = [subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(importers)]
    codes = [proc.wait(300) for proc in procs]
    counts = table_counts(url)
    out.require(codes == [0] * importers, f"exit codes {codes}: {[p.stderr.read()[-300:] for p in procs if p.stderr]}")
    out.require(counts["requests"] == 40 and counts["duplicates"] == 0, f"{counts}")
    out.figures = {"importers": importers, "failed": sum(1 for c in codes if c != 0), "rows": counts["requests"],
                   "seconds": round(time.perf_counter() - began, 2)}
    return out


def sweep_on_full_disk(directory: Path, batch_sizes: str) -> Outcome:
    """A real sweep into a full disk (its leases' heartbeat, every 0.5 s, meets it too)."""
    out = Outcome(f"a real sweep (tests/models/tiny_mlp.py, batch sizes {batch_sizes}) on a full disk",
                  "one Error line naming the full disk, no traceback; stops at the first refused result; exit 3 "
                  "(a refused write, cli.REFUSED_WRITE); "
                  "the summary counts stored / not stored / not run; the file intact", True)
    with Store(f"sqlite:///{directory / 'c.db'}") as store:
        fill(store)  # the disk full, the schema kept
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "autotune.cli", "sweep", str(TINY), "--device", "cpu", "--batch-sizes",
                           batch_sizes, "--cache", str(directory / "c.db"), "--json"], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "AUTOTUNE_LEASE_SECONDS": "1.5"})
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    totals = json.loads(done.stdout)["totals"] if done.stdout.strip() else {}
    integrity = _integrity(f"sqlite:///{directory / 'c.db'}")
    out.require(done.returncode == 3 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:])
    out.require(bool(errors) and "disk holding the SQLite file is full" in errors[0], f"{errors}")
    out.require(totals.get("failed") == 0 and totals.get("stored") == 0 and totals.get("not_stored", 0) >= 1
                and totals.get("not_stored", 0) + totals.get("not_run", 0) == totals.get("found"), f"{totals}")
    out.require(integrity == "ok", f"integrity_check: {integrity}")
    out.figures = {key: totals.get(key) for key in ("found", "stored", "not_stored", "not_run", "failed")}
    out.figures.update(seconds=round(time.perf_counter() - began, 1), integrity=integrity,
                       error=errors[0][:200] if errors else None)
    return out
