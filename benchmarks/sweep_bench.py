"""The sweep against one cold compile, and its scaling on 1, 2 and 4 GPUs of one host.

Steps, each a fresh process with a fresh SQLite cache and fresh compile caches:
``cold`` (max-autotune's first call, compile_time's scenario); ``sweep1``, ``sweep2``,
``sweep4`` (``autotune sweep MODEL --gpus N``: the whole command's wall time and its phases;
the 1-GPU sweep against cold, goal < 0.6; efficiency T1 / (N TN), goals 0.9 at 2 GPUs and
0.8 at 4, and the serial fraction each implies); ``multi`` (three models in one sweep against
the sum of their single sweeps). A step that would not finish within ``--budget`` is skipped
and listed; ``--resume FILE`` keeps the steps an earlier run of the same label measured.

    python -m benchmarks.sweep_bench --out $OUT                             # resnet,gpt; every step
    python -m benchmarks.sweep_bench --steps cold,sweep1,sweep2,sweep4 --out $OUT  # a 4-GPU host
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import compile_time, harness
from benchmarks.harness import fmt

log = logging.getLogger("sweep_bench")
STEPS = ("cold", "sweep1", "sweep2", "sweep4", "multi")
GPU_STEPS = {"sweep1": 1, "sweep2": 2, "sweep4": 4}


def sweep(paths: list[str], gpus: int, keep: Path | None, tmp: Path, timeout: float,
          log_path: Path | None = None) -> dict[str, Any]:
    """One ``autotune sweep`` command: its wall time, the report's phases and each request's time;
    its log (Inductor's, Ray's, the workers') at ``log_path`` if given."""
    cache_url = f"sqlite:///{tmp / 'cache.db'}"
    cmd = harness.AUTOTUNE + ["sweep", *paths, "--cache", cache_url, "--gpus", str(gpus), "--json"]
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd += ["--log", str(log_path)]
    done = harness.run(cmd, harness.child_env(tmp, cache_url), timeout)
    if keep is not None and (tmp / "cache.db").exists():  # SQLite's backup: the last writes may be in the WAL
        keep.mkdir(parents=True, exist_ok=True)
        harness.copy_sqlite(tmp / "cache.db", keep / f"{'_'.join(Path(p).stem for p in paths)}_{gpus}gpu.db")
    report = harness.sweep_report(done.stdout)
    result: dict[str, Any] = {"gpus": gpus, "wall_s": done.wall_s, "rc": done.rc}
    if report is None or done.rc != 0:
        return {**result, "status": "error", "stderr_tail": harness.tail(done.stderr)}
    totals, pointwise = report["totals"], report.get("pointwise") or {}
    return {**result, "status": "ok", "startup_s": totals["startup_seconds"], "capture_s": totals["capture_seconds"],
            "tuning_s": totals["tuning_seconds"], "pointwise_s": pointwise.get("seconds"),
            **{key: totals.get(key) for key in ("found", "tuned", "failed", "captured", "spares_adopted")},
            # the milestones in the process, and what it spent outside the sweep (start, imports, exit)
            "timeline": report.get("timeline"), "outside_s": done.wall_s - totals["wall_seconds"],
            "requests": [{k: r.get(k) for k in ("shapes", "status", "winner", "tuning_seconds", "node")}
                         for r in report.get("requests") or []],
            "passes": pass_rows(pointwise)}


PHASES_KEPT = 12  # each compile's longest phases kept in the results (the tables show four)


def pass_rows(pointwise: dict[str, Any]) -> list[dict[str, Any]]:
    """Each end-to-end compile of the pass: its model, kind, start (seconds after the first
    compile began) and length: where the passes' time went."""
    rows = []
    entries = pointwise.get("passes") or []
    phases = pointwise.get("phases") or []  # each compile's longest phases, in the passes' order
    first = min((e["began_at"] for e in entries if e.get("began_at")), default=None)
    for index, entry in enumerate(entries):
        began = entry.get("began_at")
        longest = phases[index] if index < len(phases) and len(phases) == len(entries) else {}
        rows.append({"model": Path(entry.get("model") or "?").stem, "seconds": entry.get("seconds"),
                     "began_s": round(began - first, 1) if began and first else None,
                     "time_in_graph": entry.get("time_in_graph"), "publishes": entry.get("publishes"),
                     "kernels_tuned": entry.get("kernels_tuned"), "node": entry.get("node"),
                     "phases": dict(sorted(longest.items(), key=lambda kv: -kv[1])[:PHASES_KEPT])})
    rows += [{"model": Path(f.get("model") or "?").stem, "error": f.get("error")} for f in pointwise.get("failed") or []]
    return rows


def cold(path: str, tmp: Path, timeout: float) -> dict[str, Any]:
    result = compile_time.run_file_scenario("max-autotune-cold", path, tmp, f"sqlite:///{tmp / 'unused.db'}", timeout)
    return {"status": result.get("status"), "wall_s": result.get("process_wall_s"),
            "first_call_s": result.get("first_call_s"), "error": result.get("error")}


def derive(run: dict[str, Any]) -> None:
    """Ratios against cold, efficiencies and the serial fractions they imply (Amdahl)."""
    for entry in run["models"].values():
        one, base = entry.get("sweep1") or {}, entry.get("cold") or {}
        if one.get("status") != "ok":
            continue
        if base.get("status") == "ok":
            entry["sweep_vs_cold"] = one["wall_s"] / base["wall_s"]
        for label, n in list(GPU_STEPS.items())[1:]:
            many = entry.get(label) or {}
            if many.get("status") == "ok":
                entry[f"efficiency_{n}"] = one["wall_s"] / (n * many["wall_s"])
                entry[f"serial_fraction_{n}"] = min(1.0, max(0.0, (n * many["wall_s"] / one["wall_s"] - 1) / (n - 1)))
    multi = run.get("multi") or {}
    singles = [((run["models"].get(n) or {}).get("sweep1") or {}) for n in multi.get("names", [])]
    if multi.get("status") == "ok" and singles and all(s.get("status") == "ok" for s in singles):
        multi["sum_of_singles_s"] = sum(s["wall_s"] for s in singles)
        multi["vs_sum"] = multi["wall_s"] / multi["sum_of_singles_s"]


def render(run: dict[str, Any]) -> list[str]:
    rows = []
    for name, e in run["models"].items():
        one, base = e.get("sweep1") or {}, e.get("cold") or {}
        rows.append([name, fmt(base.get("wall_s")), fmt(one.get("wall_s")), fmt(e.get("sweep_vs_cold"), ".2f"),
                     fmt(one.get("startup_s")), fmt(one.get("capture_s")), fmt(one.get("tuning_s")),
                     fmt(one.get("pointwise_s")), fmt((e.get("sweep2") or {}).get("wall_s")),
                     fmt(e.get("efficiency_2"), ".2f"), fmt((e.get("sweep4") or {}).get("wall_s")),
                     fmt(e.get("efficiency_4"), ".2f")])
    lines = harness.table(["model", "cold s", "sweep 1 GPU s", "vs cold (< 0.6)", "start-up", "capture", "GEMM tuning",
                           "pointwise", "2 GPUs s", "eff. 2 (>= 0.9)", "4 GPUs s", "eff. 4 (>= 0.8)"], rows)
    multi = run.get("multi")
    if multi:
        lines += ["", f"Three models in one sweep ({', '.join(multi.get('names', []))}): {fmt(multi.get('wall_s'))} s "
                  f"against {fmt(multi.get('sum_of_singles_s'))} s for the single sweeps "
                  f"({fmt(multi.get('vs_sum'), '.2f')}x), {multi.get('found', '-')} requests."]
    return lines + (["", "Skipped (the time budget): " + ", ".join(run["skipped"])] if run.get("skipped") else [])


def results(out: Path) -> harness.Results:
    return harness.Results(out, "sweep_bench", "The sweep: against cold max-autotune, and on 1, 2 and 4 GPUs", render)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sweep_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet,gpt", help="names (resnet, gpt, ...) or paths")
    parser.add_argument("--multi", default="resnet,gpt,lm_train", help="the three models of the `multi` step")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"any of {', '.join(STEPS)}")
    harness.output_options(parser, "sweep_bench", "the GPU and its count")
    parser.add_argument("--budget", type=float, default=570.0, help="seconds for the whole run (default 570)")
    parser.add_argument("--resume", default=None, help="a results file: keep what its run of this label measured")
    parser.add_argument("--keep-caches", default=None, help="copy each sweep's SQLite cache into this folder")
    args = parser.parse_args(argv)
    harness.log_to_stderr()
    steps, deadline = {s.strip() for s in args.steps.split(",")}, time.monotonic() + args.budget
    keep = Path(args.keep_caches) if args.keep_caches else None
    harness.warm_bytecode()  # else the first step pays ~5 s of bytecode that the rest reuse
    store = results(Path(args.out))
    run, earlier, gpus = harness.resumable_run(store, args, "benchmarks.sweep_bench", argv)
    run.update(models=earlier.get("models") or {}, skipped=[])

    def step(key: str, name: str, fn: Callable[..., dict[str, Any]], *fn_args: Any) -> dict[str, Any] | None:
        entry = run["models"].setdefault(name, {}) if name else run
        if (entry.get(key) or {}).get("status") == "ok":
            return entry[key]  # measured by the run resumed
        if deadline - time.monotonic() < 30:
            run["skipped"].append(f"{name} {key}")
            return None
        tmp = Path(tempfile.mkdtemp(prefix="sweep_bench_"))
        try:
            log.info("%s %s ...", name, key)
            entry[key] = fn(*fn_args, tmp, deadline - time.monotonic())
            log.info("%s %s: %s %.1f s", name, key, entry[key].get("status"), entry[key].get("wall_s") or 0)
            return entry[key]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            derive(run)
            store.save()

    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        path = compile_time.MODELS.get(name, name)
        if "cold" in steps:
            step("cold", name, cold, path)
        for key, n in GPU_STEPS.items():
            if key in steps and n <= max(gpus, 1):
                step(key, name, sweep, [path], n, keep)
    multi = [m.strip() for m in args.multi.split(",") if m.strip()] if "multi" in steps else []
    for name in multi:  # the single sweeps that the three-model sweep is held against
        step("sweep1", name, sweep, [compile_time.MODELS.get(name, name)], 1, keep)
    if multi:
        result = step("multi", "", sweep, [compile_time.MODELS.get(n, n) for n in multi], 1, keep)
        if result is not None:
            run["multi"] = {**result, "names": multi}
    derive(run)
    store.save()
    print(store.path.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
