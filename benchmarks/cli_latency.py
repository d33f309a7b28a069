"""How long the `autotune` command takes to answer: a sweep's mistakes, `--help`, `--version`
and `doctor`, each timed as a whole process (start to exit) several times.

    python -m benchmarks.cli_latency                    # every case, 3 samples each
    python -m benchmarks.cli_latency --samples 5 --cases help,version

Each case is one entry of ``CASES``: its name, the arguments (made in a fresh folder of its
own, with its own cache and log locations), the exit status it must give (None: any) and the
goal it is held to (issue 78). A mistake must also leave nothing behind: the run records any
file it finds in the case's folder afterwards (a cache file, a log). The samples of a case run
one after another, after one untimed run that warms the bytecode and the file cache.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import harness

log = logging.getLogger("cli_latency")

EXAMPLE = str(harness.REPO / "examples" / "mlp.py")


@dataclass(frozen=True)
class Case:
    """One timed command: ``args(folder)`` makes its arguments in ``folder`` (writing what it
    needs there); it must exit ``code`` (None: any) within ``goal_s`` seconds."""

    name: str
    args: Callable[[Path], list[str]]
    code: int | None
    goal_s: float
    leaves_nothing: bool = False  # a mistake: no cache file, no log, nothing new in its folder
    applies: Callable[[], bool] = lambda: True  # False: not a case on this machine (said so in the results)


def _write(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.write_text(text)
    return str(path)


def _cpu_only() -> bool:
    """--device cuda is a mistake only on a host without CUDA."""
    from autotune.cli import _no_cuda_here

    return _no_cuda_here() is not None


_SWEPT: dict[str, str] = {}  # the example's cache after its first sweep, made once per run


def _swept_example(timeout: float = 1800) -> str:
    """The URL of a SQLite cache into which ``autotune sweep EXAMPLE`` has run once (captured and
    tuned), made the first time it is asked for, untimed: what a second sweep of an unchanged,
    fully cached model finds (its capture is replayed: autotune/sweep/capture_reuse.py)."""
    if "url" not in _SWEPT:
        folder = Path(tempfile.mkdtemp(prefix="cli_latency_swept_"))
        url = f"sqlite:///{folder / 'cache.db'}"
        subprocess.run([*_command(), "sweep", EXAMPLE, "--cache", url], cwd=folder, capture_output=True,
                       timeout=timeout, check=True, env={**os.environ, "TMPDIR": str(folder)})
        _SWEPT["url"] = url
    return _SWEPT["url"]


CASES: list[Case] = [
    Case("sweep: missing file", lambda d: ["sweep", str(d / "missing.py")], 2, 3.0, leaves_nothing=True),
    Case("sweep: syntax error", lambda d: ["sweep", _write(d, "broken.py", "def example(:\n")], 2, 3.0,
         leaves_nothing=True),
    Case("sweep: no example()", lambda d: ["sweep", _write(d, "model.py", "import torch\nmodel = None\n")], 2, 3.0,
         leaves_nothing=True),
    Case("sweep: --mode bogus", lambda d: ["sweep", EXAMPLE, "--mode", "bogus"], 2, 3.0, leaves_nothing=True),
    Case("sweep: --device cuda on a CPU host", lambda d: ["sweep", EXAMPLE, "--device", "cuda"], 2, 3.0,
         leaves_nothing=True, applies=_cpu_only),
    Case("--help", lambda d: ["--help"], 0, 1.0),
    Case("--version", lambda d: ["--version"], 0, 1.0),
    Case("doctor", lambda d: ["doctor"], None, 5.0),
    Case("sweep: second, unchanged and cached", lambda d: ["sweep", EXAMPLE, "--cache", _swept_example()], 0, 15.0),
]


def _command() -> list[str]:
    """The `autotune` a user runs: the installed script beside this Python (not a shim in front of
    it), else the module."""
    script = Path(sys.executable).parent / "autotune"
    return [str(script)] if script.exists() else [sys.executable, "-m", "autotune.cli"]


def measure_case(case: Case, samples: int, timeout: float) -> dict[str, Any]:
    if not case.applies():
        return {"case": case.name, "skipped": "not a mistake on this machine"}
    times: list[float] = []
    cpu: list[float] = []  # the process's own CPU seconds (user + system): what a busy machine does not inflate
    codes: list[int | None] = []
    left: list[str] = []
    for sample in range(samples + 1):  # the first run is untimed: bytecode and file cache
        with tempfile.TemporaryDirectory(prefix="cli_latency_") as tmp:
            folder = Path(tmp) / "work"
            folder.mkdir()
            args = case.args(folder)
            shown = " ".join(args).replace(str(folder), "DIR").replace(str(harness.REPO) + "/", "")
            before = set(Path(tmp).rglob("*"))
            env = {**os.environ, "AUTOTUNE_CACHE": str(Path(tmp) / "cache" / "cache.db"),
                   "XDG_CACHE_HOME": str(Path(tmp) / "xdg"), "TMPDIR": tmp}
            env.pop("AUTOTUNE_LOG", None)
            began, used = time.perf_counter(), _children_cpu()
            try:
                done = subprocess.run([*_command(), *args], cwd=folder, env=env, capture_output=True, text=True,
                                      timeout=timeout)
                code: int | None = done.returncode
            except subprocess.TimeoutExpired:
                code = None
            seconds, cpu_s = time.perf_counter() - began, _children_cpu() - used
            new = sorted(str(p.relative_to(tmp)) for p in set(Path(tmp).rglob("*")) - before)
            shutil.rmtree(tmp, ignore_errors=True)
        if sample == 0:
            continue
        times.append(seconds)
        cpu.append(cpu_s)
        codes.append(code)
        left += new
    return {"case": case.name, "command": f"autotune {shown}",
            "samples_s": [round(t, 3) for t in times], "min_s": round(min(times), 3),
            "median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3), "goal_s": case.goal_s,
            "cpu_s": [round(c, 3) for c in cpu], "cpu_median_s": round(statistics.median(cpu), 3),
            "codes": codes, "expected_code": case.code,
            "code_ok": all(c == case.code for c in codes) if case.code is not None else all(c is not None for c in codes),
            "left_behind": sorted(set(left)) if case.leaves_nothing else None}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def render(run: dict[str, Any]) -> list[str]:
    rows = []
    for entry in run.get("cases", []):
        if entry.get("skipped"):
            rows.append([entry["case"], "-", "-", "-", "-", "-", "-", "-", f"skipped: {entry['skipped']}"])
            continue
        within = "yes" if entry["max_s"] <= entry["goal_s"] else "no"
        left = entry.get("left_behind")
        rows.append([entry["case"], f"`{entry['command']}`", ", ".join(str(c) for c in sorted(set(entry["codes"]), key=str)),
                     harness.fmt(entry["min_s"], ".2f"), harness.fmt(entry["median_s"], ".2f"),
                     harness.fmt(entry["max_s"], ".2f"), f"{entry['goal_s']:g} s ({within})",
                     harness.fmt(entry.get("cpu_median_s"), ".2f"),
                     "-" if left is None else ("nothing" if not left else ", ".join(left))])
    load = (f" Load average (1, 5, 15 min) {run['load_before']} before, {run['load_after']} after."
            if run.get("load_before") else "")
    carried = [f"{e['case']} ({e.get('date')}, code {e.get('commit')})" for e in run.get("cases", []) if e.get("carried")]
    load += f" Measured in an earlier run (kept when this one measured other cases): {'; '.join(carried)}." if carried else ""
    return [f"{run.get('samples')} samples per case, whole process (start to exit), after one untimed run; "
            f"seconds of wall time, and the CPU seconds the process itself used (user + system).{load}", ""] + harness.table(
        ["case", "command", "exit", "min", "median", "max", "goal (max within)", "CPU s (median)", "left behind"], rows)


def _carried(before: dict[str, Any] | None, measured: set[str]) -> list[dict[str, Any]]:
    """The cases of the run this one replaces that it did not measure (--cases), kept with the
    date and code they were measured at: a run of some cases never drops the others'."""
    before = before or {}
    return [{**entry, "date": entry.get("date") or before.get("date"),
             "commit": entry.get("commit") or before.get("commit"), "carried": True}
            for entry in before.get("cases", []) if entry.get("case") not in measured]


def results(out: Path) -> harness.Results:
    return harness.Results(out, "cli_latency", "How long `autotune` takes to answer", render)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cli_latency", description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=3, help="timed runs per case (default %(default)s)")
    parser.add_argument("--cases", default="", help="comma-separated words; only the cases whose name contains one")
    harness.output_options(parser, "cli_latency", "cpu, or the GPU's name", timeout=120, per="run")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    words = [w.strip().lower() for w in args.cases.split(",") if w.strip()]
    chosen = [c for c in CASES if not words or any(w in c.name.lower() for w in words)]
    harness.log_to_stderr()
    store = results(Path(args.out))
    earlier = {entry.get("label"): entry for entry in store.data["runs"]}
    run = harness.new_run(store, args.label, "benchmarks.cli_latency", argv)
    run["samples"] = args.samples
    run["load_before"] = [round(x, 1) for x in os.getloadavg()]  # a shared machine's other work slows every case
    run["cases"] = []
    for case in chosen:
        log.info("timing %s", case.name)
        run["cases"].append({**measure_case(case, args.samples, args.timeout), "date": run["date"],
                             "commit": run["commit"]})
    run["load_after"] = [round(x, 1) for x in os.getloadavg()]
    run["cases"] += _carried(earlier.get(run["label"]), {case.name for case in chosen})
    store.save()
    print("\n".join(render(run)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
