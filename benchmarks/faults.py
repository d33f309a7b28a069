"""Fault injection at full size: the scenarios of benchmarks/fault_scenarios.py with N
up to 32, on SQLite and the local PostgreSQL, written to
benchmarks/results/faults_<device>.md and .json (machine, versions, date).

usage: python benchmarks/faults.py [--writers 2,8,32] [--importer-rounds 3] [--only WORDS] [--out NAME]

Needs root (a tmpfs for the disk-full scenarios, pg_ctlcluster for the restart)
and the local PostgreSQL ($AUTOTUNE_TEST_POSTGRES, default postgres@127.0.0.1/test);
each PostgreSQL scenario runs in a database it creates and drops.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import fault_scenarios as faults
import sqlalchemy as sa

RESULTS = faults.REPO / "benchmarks" / "results"
ADMIN = os.environ.get("AUTOTUNE_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@contextmanager
def pg_database() -> Iterator[str]:
    name = f"autotune_faults_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(ADMIN, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield sa.make_url(ADMIN).set(database=name).render_as_string(hide_password=False)
    finally:
        faults.ensure_postgres_running()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@contextmanager
def sqlite_database() -> Iterator[str]:
    directory = faults.scratch()
    try:
        yield f"sqlite:///{directory / 'cache.db'}"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def tmpfs(size: str = "400k") -> Iterator[Path]:
    directory = faults.scratch() / "tmpfs"
    why = faults.small_tmpfs(directory, size)
    if why is not None:
        raise SystemExit(f"cannot mount a tmpfs ({why}); run as root")
    try:
        yield directory
    finally:
        faults.unmount(directory)


def importers_into_fresh_postgres(rounds: int, per_round: int = 6) -> faults.Outcome:
    """The issue's race: `autotune cache import` processes at once into a new database."""
    out = faults.Outcome(f"{per_round} concurrent `autotune cache import` into a fresh PostgreSQL database, "
                         f"{rounds} rounds", "every importer exits 0; every row arrives once", True)
    work = faults.scratch()
    with faults.Store(f"sqlite:///{work / 'src.db'}") as src:
        src.put_results(faults._result(k) for k in range(40))
        with (work / "x.jsonl").open("w") as fp:
            src.export_jsonl(fp)
    failures, seconds = 0, []
    for _ in range(rounds):
        with pg_database() as url:
            command = [sys.executable, "-m", "autotune.cli", "cache", "--cache", url, "import", str(work / "x.jsonl")]
            began = time.perf_counter()
            procs = [subprocess.Popen(command, cwd=faults.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True) for _ in range(per_round)]
            codes = [p.wait(300) for p in procs]
            seconds.append(time.perf_counter() - began)
            failures += sum(1 for c in codes if c != 0)
            counts = faults.table_counts(url)
            out.require(counts["requests"] == 40 and counts["duplicates"] == 0, f"{counts}")
    out.require(failures == 0, f"{failures} importers failed")
    out.figures = {"importers": rounds * per_round, "succeeded": rounds * per_round - failures,
                   "failed": failures, "seconds_per_round": [round(s, 2) for s in seconds]}
    return out


def sweep_on_full_disk() -> faults.Outcome:
    out = faults.Outcome("a real sweep (tests/models/tiny_mlp.py, batch sizes 4,8,16: 8 requests) on a full disk",
                         "one Error line, no traceback; stops at the first refused result; exit 1; "
                         "summary counts stored / not stored / not run; file intact", True)
    with tmpfs() as directory:
        with faults.Store(f"sqlite:///{directory / 'c.db'}") as store:
            faults.fill(store)
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "autotune.cli", "sweep", str(faults.REPO / "tests/models/tiny_mlp.py"),
                               "--device", "cpu", "--batch-sizes", "4,8,16", "--cache", str(directory / "c.db"),
                               "--json"], cwd=faults.REPO, capture_output=True, text=True, timeout=600)
        seconds = time.perf_counter() - began
        integrity = faults._integrity(f"sqlite:///{directory / 'c.db'}")
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    totals = json.loads(done.stdout)["totals"] if done.stdout.strip() else {}
    out.require(done.returncode == 1 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-500:])
    out.require(integrity == "ok" and totals.get("failed") == 0, f"{integrity} {totals}")
    out.figures = {key: totals.get(key) for key in ("found", "stored", "not_stored", "not_run", "failed")}
    out.figures.update(seconds=round(seconds, 1), integrity=integrity, error=errors[0][:200] if errors else None)
    return out


def slow_database(delays: tuple[float, ...] = (0.05, 1.5)) -> list[faults.Outcome]:
    """The same job cold and warm against PostgreSQL directly, then through a proxy that
    delays every packet: under the lookup timeout (still served) and past it."""
    work = faults.scratch()
    with pg_database() as url:
        baseline = faults.baseline_jobs(url, work)
        return [faults.slow_database(url, delay, work, baseline) for delay in delays]


def scenarios(writers: list[int], rounds: int) -> Iterator[Callable[[], faults.Outcome | list[faults.Outcome]]]:
    for n in writers:
        for backend in (sqlite_database, pg_database):
            for fresh in (True, False):
                def run(n: int = n, backend: Callable[[], object] = backend, fresh: bool = fresh) -> faults.Outcome:
                    with backend() as url:  # type: ignore[attr-defined]
                        return faults.concurrent_writers(url, n, fresh, faults.scratch())
                yield run
    yield lambda: importers_into_fresh_postgres(rounds)

    def restart() -> faults.Outcome:
        with pg_database() as url:
            return faults.postgres_restart_mid_sweep(url, 150, faults.scratch())
    yield restart
    yield slow_database
    for backend in (sqlite_database, pg_database):
        def kills(backend: Callable[[], object] = backend) -> faults.Outcome:
            with backend() as url:  # type: ignore[attr-defined]
                outcome = faults.killed_writer(url, 5, faults.scratch())
                outcome.scenario += " (sqlite)" if url.startswith("sqlite") else " (postgresql)"
                return outcome
        yield kills

    def write_back() -> faults.Outcome:
        with pg_database() as url:
            return faults.killed_job_mid_write_back(url, 3, faults.scratch())
    yield write_back
    # tiny_mlp at batch sizes 4,8,16: 8 requests (3 static graphs, 1 dynamic); SQLite killed twice, PostgreSQL once.
    for backend, kills_n, grace in ((sqlite_database, 2, 60.0), (pg_database, 1, 10.0)):
        def sweeps(backend: Callable[[], object] = backend, kills_n: int = kills_n, grace: float = grace) \
                -> faults.Outcome:
            with backend() as url:  # type: ignore[attr-defined]
                return faults.killed_sweeps(url, "4,8,16", kills_n, faults.scratch(), seed=kills_n, grace=grace)
        yield sweeps

    def full() -> faults.Outcome:
        with tmpfs() as directory:
            return faults.disk_full(directory)
    yield full

    def read_only() -> faults.Outcome:
        with tmpfs("2m") as directory:
            return faults.read_only_file(directory)
    yield read_only
    yield sweep_on_full_disk


def machine() -> dict[str, object]:
    import torch

    import alembic
    import psycopg

    with sa.create_engine(ADMIN, poolclass=sa.NullPool).connect() as conn:
        server = conn.exec_driver_sql("SHOW server_version").scalar_one()
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
            "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__, "sqlalchemy": sa.__version__,
            "alembic": alembic.__version__, "psycopg": psycopg.__version__, "postgresql": server,
            "sqlite": faults.sqlite3.sqlite_version}


def write(results: list[faults.Outcome], info: dict[str, object], name: str) -> None:
    data = {"machine": info, "scenarios": [o.__dict__ for o in results]}
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = [f"# Fault injection ({info['date']})", "",
             "`python benchmarks/faults.py`; " + ", ".join(f"{k} {v}" for k, v in info.items() if k != "date"), "",
             f"**{sum(o.passed for o in results)} of {len(results)} scenarios passed.**", "",
             "| scenario | checks | passed | figures |", "| --- | --- | --- | --- |"]
    for o in results:
        figures = ", ".join(f"{k} {v}" for k, v in o.figures.items()).replace("|", "/")
        problems = f" PROBLEMS: {'; '.join(o.problems)}" if o.problems else ""
        lines.append(f"| {o.scenario} | {o.checks} | {'yes' if o.passed else 'NO'} | {figures}{problems} |")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", default="2,8,32")
    parser.add_argument("--importer-rounds", type=int, default=3)
    parser.add_argument("--only", help="run only scenarios whose function name contains one of these "
                        "comma-separated words (a trial run; the results files are not written)")
    parser.add_argument("--out", default="faults_cpu")
    args = parser.parse_args()
    info = machine()
    results = []
    only = args.only.split(",") if args.only else None
    for scenario in scenarios([int(n) for n in args.writers.split(",")], args.importer_rounds):
        if only and not any(word in scenario.__name__ for word in only):
            continue
        produced = scenario()
        for outcome in produced if isinstance(produced, list) else [produced]:
            print(f"{'ok  ' if outcome.passed else 'FAIL'} {outcome.scenario}: {json.dumps(outcome.figures)}",
                  flush=True)
            results.append(outcome)
    if only:
        return 0 if all(o.passed for o in results) else 1
    write(results, info, args.out)
    return 0 if all(o.passed for o in results) else 1


if __name__ == "__main__":
    sys.exit(main())
