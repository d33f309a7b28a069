"""Fault-injection scenarios for the cache, shared by benchmarks/faults.py (large N,
committed figures) and tests/test_faults.py (small N, in CI).

Each scenario runs real processes against a real database and returns a
``Outcome``: what it checks, whether every check held, and its figures (rows
written, retries, seconds to recover). Nothing is mocked: writers are spawned
Python processes using the Store exactly as sweeps, imports and write-backs do.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # factories: the records tests also use

from factories import make_env, make_result  # noqa: E402

from cache import CacheUnavailable, CacheWriteRefused, Store  # noqa: E402

PG_RESTART = ["pg_ctlcluster", "--skip-systemctl-redirect"]


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
            count["orphans"] = conn.execute(sa.text(  # a request without its candidates: half-written
                "SELECT count(*) FROM requests r WHERE NOT EXISTS "
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


def restart_postgres() -> None:
    cluster = sorted(os.listdir("/etc/postgresql"))[0]
    subprocess.run([*PG_RESTART, cluster, "main", "restart"], check=True, capture_output=True, timeout=120)


def ensure_postgres_running() -> None:
    cluster = sorted(os.listdir("/etc/postgresql"))[0]
    subprocess.run([*PG_RESTART, cluster, "main", "start"], capture_output=True, timeout=120)


def postgres_restart_mid_sweep(url: str, count: int, workdir: Path) -> Outcome:
    out = Outcome("PostgreSQL restarted mid-sweep",
                  "the writer retries with backoff, exits 0 and every result is stored; "
                  "a reader meeting the restart gets one error, then reads again", True)
    report = workdir / "retries.txt"
    with Store(url) as store:
        store.upgrade()  # the reader opens read-only: the schema must be there
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
        restart_postgres()
    finally:
        ensure_postgres_running()
    restarted = time.perf_counter() - began
    read_errors, recovered_after = 0, None
    while recovered_after is None and time.perf_counter() - began < 60:
        try:
            reader.lookup(make_env(), _result(0).request.key)
            recovered_after = time.perf_counter() - began
        except Exception:  # noqa: BLE001 - the hook turns exactly this into its one warning
            read_errors += 1
            time.sleep(0.2)
    reader.close()
    proc.join(300)
    counts = table_counts(url)
    retries = int(report.read_text()) if report.exists() else None
    out.require(proc.exitcode == 0, f"writer exit code {proc.exitcode}")
    out.require(counts["requests"] == count and counts["orphans"] == 0, f"{counts}")
    out.require(recovered_after is not None, "the reader never read again")
    out.figures = {"rows": counts["requests"], "expected_rows": count, "lost": count - counts["requests"],
                   "write_retries": retries, "restart_seconds": round(restarted, 2),
                   "reader_errors": read_errors,
                   "reader_recovered_s": round(recovered_after, 2) if recovered_after else None}
    return out


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
