"""The sweep against its goals, in one command on a 1-, 2- or 4-GPU machine.

Steps (each a fresh process with a fresh SQLite cache and fresh Inductor/Triton dirs):

- ``cold``: ``torch.compile(mode="max-autotune")`` of each model, first call (compile_time.py's scenario).
- ``sweep1``: ``autotune sweep MODEL --gpus 1``: the whole command's wall time and its phases
  (start-up, capture, GEMM tuning, pointwise), and its ratio to ``cold`` (goal < 0.6).
- ``sweep2``: the same on 2 GPUs: efficiency T1 / (2 T2) for the whole command (goal >= 0.9),
  the serial fraction it implies (Amdahl: s = 2 T2 / T1 - 1) and the efficiency that predicts
  at 4 and 8 GPUs, 1 / (N s + 1 - s).
- ``sweep4``: the same on 4 GPUs (issue 15's goal: efficiency T1 / (4 T4) >= 0.8), and the
  serial fraction that the 4-GPU time implies, s = (4 T4 / T1 - 1) / 3.
- ``multi``: ``autotune sweep A B C --gpus 1`` against the sum of the three single sweeps
  (those of ``sweep1``, plus any model not swept there), with the de-duplicated request count.

    python benchmarks/sweep_bench.py --out /tmp/results                      # resnet,gpt; every step
    python benchmarks/sweep_bench.py --models gpt --steps cold,sweep1,sweep2 --out /tmp/results
    python benchmarks/sweep_bench.py --steps cold,sweep1,sweep2,sweep4 --out /tmp/results  # a 4-GPU host

A step that cannot finish before ``--budget`` seconds (default 570) is skipped and
recorded as such; results are written after every step, so a cut-off run keeps
what it measured. ``--resume FILE`` (an earlier run's JSON, on the same machine kind)
keeps the steps that FILE measured and runs only the rest. Writes ``<out>/sweep_bench_<gpu>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import shutil
import socket
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_time import (  # noqa: E402
    MODELS,
    ModelRun,
    _child_env,
    _run,
    _warm_bytecode,
    _sweep_payload,
    _tail,
    machine_info,
    run_model_scenario,
    slug,
)

log = logging.getLogger("sweep_bench")
STEPS = ("cold", "sweep1", "sweep2", "sweep4", "multi")


def sweep(paths: list[str], gpus: int, keep: Path | None, tmp: Path, timeout: float) -> dict[str, Any]:
    """One ``autotune sweep`` command: its wall time, the report's phases and each request's time
    (``keep``: a directory where its SQLite cache is copied, for --keep-caches)."""
    cache_url = f"sqlite:///{tmp / 'cache.db'}"
    cmd = [sys.executable, "-c", "from autotune.cli import main; main(prog_name='autotune')", "sweep", *paths,
           "--cache", cache_url, "--gpus", str(gpus), "--json"]
    done = _run(cmd, _child_env(tmp, cache_url), timeout, None)
    if keep is not None and (tmp / "cache.db").exists():
        keep.mkdir(parents=True, exist_ok=True)
        # SQLite's backup, not a file copy: the workers' last writes may still be in the WAL file.
        target = keep / f"{'_'.join(Path(p).stem for p in paths)}_{gpus}gpu.db"
        with sqlite3.connect(tmp / "cache.db") as source, sqlite3.connect(target) as copy:
            source.backup(copy)
    result: dict[str, Any] = {"gpus": gpus, "wall_s": done.wall_s, "rc": done.rc}
    report = _sweep_payload(done.stdout)
    if report is None or done.rc != 0:
        return {**result, "status": "error", "stderr_tail": _tail(done.stderr)}
    totals, pointwise = report["totals"], report.get("pointwise") or {}
    return {**result, "status": "ok", "startup_s": totals["startup_seconds"], "capture_s": totals["capture_seconds"],
            "tuning_s": totals["tuning_seconds"], "pointwise_s": pointwise.get("seconds"),
            "found": totals["found"], "tuned": totals["tuned"], "failed": totals["failed"],
            "captured": totals.get("captured"), "models": report.get("models"),
            "spares_adopted": totals.get("spares_adopted"),
            # The in-process milestones, and what the process spent outside run_sweep (start, imports, exit).
            "timeline": report.get("timeline"), "in_process_s": totals["wall_seconds"],
            "outside_s": done.wall_s - totals["wall_seconds"],
            "pointwise_detail": {k: v for k, v in pointwise.items() if k not in ("saved_keys", "verdicts")},
            "verdicts_changed": sum(1 for v in pointwise.get("verdicts") or [] if v.get("changed")),
            "requests": [{k: r.get(k) for k in ("shapes", "status", "winner", "tuning_seconds", "node")}
                         for r in report.get("requests") or []]}


def cold(name: str, path: str, tmp: Path, timeout: float) -> dict[str, Any]:
    run = ModelRun(name, path, ["max-autotune-cold"], tmp, f"sqlite:///{tmp / 'unused.db'}", train=False)
    args = argparse.Namespace(runs=5, warmup=1, optimizer_step="compiled", batch_size=None, kernel_profile=False,
                              timeout=timeout)
    result = run_model_scenario("max-autotune-cold", run, args, None)
    return {"status": result.get("status"), "wall_s": result.get("process_wall_s"),
            "first_call_s": result.get("first_call_s"), "error": result.get("error")}


def derive(report: dict[str, Any]) -> None:
    """Ratios, efficiency, serial fraction and the predicted efficiencies."""
    for entry in report["models"].values():
        one, two, base = entry.get("sweep1") or {}, entry.get("sweep2") or {}, entry.get("cold") or {}
        if one.get("status") == "ok" and base.get("status") == "ok" and base.get("wall_s"):
            entry["sweep_vs_cold"] = one["wall_s"] / base["wall_s"]
        if one.get("status") == "ok" and two.get("status") == "ok":
            t1, t2 = one["wall_s"], two["wall_s"]
            serial = min(1.0, max(0.0, 2 * t2 / t1 - 1))
            entry["efficiency_2"] = t1 / (2 * t2)
            entry["serial_fraction"] = serial
            entry["predicted_efficiency"] = {n: 1 / (n * serial + 1 - serial) for n in (4, 8)}
        four = entry.get("sweep4") or {}
        if one.get("status") == "ok" and four.get("status") == "ok":
            t1, t4 = one["wall_s"], four["wall_s"]
            entry["efficiency_4"] = t1 / (4 * t4)
            entry["serial_fraction_4"] = min(1.0, max(0.0, (4 * t4 / t1 - 1) / 3))
    multi = report.get("multi") or {}
    singles = [(report["models"].get(n) or {}).get("sweep1") or {} for n in multi.get("names", [])]
    if multi.get("status") == "ok" and singles and all(s.get("status") == "ok" for s in singles):
        multi["sum_of_singles_s"] = sum(s["wall_s"] for s in singles)
        multi["vs_sum"] = multi["wall_s"] / multi["sum_of_singles_s"]


def _f(value: Any, spec: str = ".1f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def render(report: dict[str, Any]) -> str:
    info = report["machine"]
    where = f"{info.get('gpu')} x{info.get('gpu_count')}" if info.get("gpu") else f"CPU, {info.get('cpu')} (one worker)"
    lines = [f"# Sweep goals: {where}", "",
             f"Generated {report['date']} by `python benchmarks/sweep_bench.py {report['argv']}`; "
             f"python {info.get('python')}, torch {info.get('torch')}, triton {info.get('triton')}."]
    for earlier in report.get("resumed") or []:
        machine = earlier.get("machine") or {}
        lines.append(f"Resumed from a run of {earlier.get('date')} (`{earlier.get('argv')}`, {machine.get('gpu')} "
                     f"x{machine.get('gpu_count')}, host {earlier.get('host', '-')}; this run's host: "
                     f"{report.get('host')}): its steps are kept.")
    lines += ["",
             "| model | cold s | sweep 1 GPU s | vs cold (< 0.6) | start-up | capture | GEMM tuning | pointwise "
             "| sweep 2 GPUs s | eff. 2 (>= 0.9) | serial | pred. eff. 4 / 8 | sweep 4 GPUs s | eff. 4 (>= 0.8) "
             "| serial (4) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for name, e in report["models"].items():
        one, two, base = e.get("sweep1") or {}, e.get("sweep2") or {}, e.get("cold") or {}
        four = e.get("sweep4") or {}
        pred = e.get("predicted_efficiency") or {}
        lines.append(f"| {name} | {_f(base.get('wall_s'))} | {_f(one.get('wall_s'))} | {_f(e.get('sweep_vs_cold'), '.2f')} "
                     f"| {_f(one.get('startup_s'))} | {_f(one.get('capture_s'))} | {_f(one.get('tuning_s'))} "
                     f"| {_f(one.get('pointwise_s'))} | {_f(two.get('wall_s'))} | {_f(e.get('efficiency_2'), '.2f')} "
                     f"| {_f(e.get('serial_fraction'), '.2f')} | {_f(pred.get(4), '.2f')} / {_f(pred.get(8), '.2f')} "
                     f"| {_f(four.get('wall_s'))} | {_f(e.get('efficiency_4'), '.2f')} "
                     f"| {_f(e.get('serial_fraction_4'), '.2f')} |")
    adopted = [f"{name} on {run['gpus']} GPU(s): {run['spares_adopted']}" for name, e in report["models"].items()
               for label in ("sweep1", "sweep2", "sweep4") if (run := e.get(label) or {}).get("spares_adopted") is not None]
    if adopted:
        lines += ["", "Lanes (tuning processes; `--jobs-per-gpu` per GPU) that took a spare started before Ray "
                  "(`totals.spares_adopted`): " + "; ".join(adopted) + "."]
    multi = report.get("multi")
    if multi:
        lines += ["", f"Three models at once ({', '.join(multi.get('names', []))}): {_f(multi.get('wall_s'))} s "
                  f"against {_f(multi.get('sum_of_singles_s'))} s for the single sweeps "
                  f"({_f(multi.get('vs_sum'), '.2f')}x); {multi.get('captured', '-')} requests captured, "
                  f"{multi.get('found', '-')} after de-duplication; status {multi.get('status')}."]
    skipped = report.get("skipped") or []
    if skipped:
        lines += ["", "Skipped (the time budget): " + ", ".join(skipped)]
    return "\n".join(lines) + "\n"


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet,gpt", help="names (resnet, gpt, ...) or paths")
    parser.add_argument("--multi", default="resnet,gpt,lm_train", help="the three models of the `multi` step")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"any of {', '.join(STEPS)}")
    parser.add_argument("--out", required=True, help="directory for the results")
    parser.add_argument("--budget", type=float, default=570.0, help="seconds for the whole run (default 570)")
    parser.add_argument("--resume", default=None, help="an earlier run's JSON: keep what it measured")
    parser.add_argument("--keep-caches", default=None, help="copy each sweep's SQLite cache into this directory")
    args = parser.parse_args()
    keep = Path(args.keep_caches) if args.keep_caches else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    steps = {s.strip() for s in args.steps.split(",") if s.strip()}
    budget = Budget(args.budget)
    _warm_bytecode()  # else the first step (cold) pays ~5 s of torch bytecode that the rest reuse
    info = machine_info(120)
    gpus = int(info.get("gpu_count") or 0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"sweep_bench_{slug(info.get('gpu') or 'cpu')}"
    report: dict[str, Any] = {"machine": info, "host": socket.gethostname(), "argv": " ".join(sys.argv[1:]),
                              "models": {}, "skipped": [],
                              "date": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()}

    def save() -> None:
        derive(report)
        (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
        (out / f"{stem}.md").write_text(render(report))

    if args.resume and Path(args.resume).exists():
        earlier = json.loads(Path(args.resume).read_text())
        report["models"] = earlier.get("models") or {}
        report["resumed"] = [{"date": earlier.get("date"), "argv": earlier.get("argv"), "host": earlier.get("host"),
                              "machine": earlier.get("machine")}, *(earlier.get("resumed") or [])]

    def measured(name: str, key: str) -> bool:
        return ((report["models"].get(name) or {}).get(key) or {}).get("status") == "ok"

    def step(label: str, fn: Any, *fn_args: Any) -> dict[str, Any] | None:
        if budget.left() < 30:
            report["skipped"].append(label)
            return None
        tmp = Path(tempfile.mkdtemp(prefix="sweep_bench_"))
        try:
            log.info("%s ...", label)
            result = fn(*fn_args, tmp, budget.left())
            log.info("%s: %s %.1f s", label, result.get("status"), result.get("wall_s") or 0.0)
            return result
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            save()

    names = [m.strip() for m in args.models.split(",") if m.strip()]
    multi = [m.strip() for m in args.multi.split(",") if m.strip()]
    for name in names:
        path = MODELS.get(name, name)
        entry = report["models"].setdefault(name, {})
        if "cold" in steps and not measured(name, "cold"):
            entry["cold"] = step(f"{name} max-autotune cold", cold, name, path)
        if ("sweep1" in steps or ("multi" in steps and name in multi)) and not measured(name, "sweep1"):
            entry["sweep1"] = step(f"{name} sweep 1 GPU", sweep, [path], 1, keep)
        if "sweep2" in steps and gpus >= 2 and not measured(name, "sweep2"):
            entry["sweep2"] = step(f"{name} sweep 2 GPUs", sweep, [path], 2, keep)
        if "sweep4" in steps and gpus >= 4 and not measured(name, "sweep4"):
            entry["sweep4"] = step(f"{name} sweep 4 GPUs", sweep, [path], 4, keep)
    if "multi" in steps:
        for name in multi:  # the single sweeps the three-model sweep is compared with
            entry = report["models"].setdefault(name, {})
            if not measured(name, "sweep1"):
                entry["sweep1"] = step(f"{name} sweep 1 GPU", sweep, [MODELS.get(name, name)], 1, keep)
        result = step("three models at once", sweep, [MODELS.get(n, n) for n in multi], 1, keep)
        if result is not None:
            report["multi"] = {**result, "names": multi}
    save()
    print((out / f"{stem}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
