"""A team's tuning queue: the zoo workload in one `autotune sweep`, on 1, 2 and 4 GPUs of one
host, against the cold-compile alternative (issue 52).

Steps, each with a fresh SQLite cache and fresh compile caches:

- ``queue1``, ``queue2``, ``queue4``: ``autotune sweep`` of every workload model at once with
  ``--gpus N`` (CUDA_VISIBLE_DEVICES the first N): the whole command's wall time, its phases,
  its requests; efficiency T1 / (N TN) and the serial fraction it implies (Amdahl), projected
  to 8 and 16 GPUs from the widest measured;
- ``cold``: the alternative a team has without a shared cache: each model's cold max-autotune
  compile, ``--cold-gpus`` at a time, one per GPU (its first call, then the next model);
- ``warm``: fresh warm-started jobs of ``--warm-models`` against the cache the widest queue step
  of this run filled: the benchmarks each ran (0 is the goal) and its first call.

The workload (``WORKLOAD``, or ``--models``): zoo entries as ``name:mode`` (model files written
by benchmarks/zoo.py) or paths. Two Ray nodes of 2 GPUs each run through
``benchmarks/cluster_run.py``; warm starts through ``benchmarks/compile_time.py`` (see
benchmarks/README.md).

    python -m benchmarks.team_queue --steps queue1 --out $Q                  # one device call
    python -m benchmarks.team_queue --steps queue2,queue4,cold --out $Q --resume $Q/team_queue.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import queue
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import compile_time, harness, sweep_bench, zoo
from benchmarks.harness import fmt

log = logging.getLogger("team_queue")
# Zoo models with many GEMM/conv requests for the time their end-to-end passes take, by their
# single-model sweeps on an H200 (benchmarks/results/conformance.md), and a training row (issue 52:
# at least 6 models and 150 requests, the 1-GPU sweep within one device call).
WORKLOAD = ("resnet50:infer", "mobilenet_v3_large:infer", "efficientnet_b0:infer", "convnext_tiny:infer",
            "unet:infer", "mlp_mixer:infer", "dlrm:infer", "dlrm:train")
QUEUE_STEPS = {"queue1": 1, "queue2": 2, "queue4": 4}
STEPS = (*QUEUE_STEPS, "cold", "warm")
WARM_MODELS = ("resnet50:infer", "dlrm:train")  # a conv net and the training row
PROJECTED = (8, 16)
EFFICIENCY_GOALS = {2: 0.85, 4: 0.8}
COLD_GOAL = 0.5  # the 4-GPU sweep's wall time against the 4-GPU cold-compile alternative's


def model_paths(entries: list[str], directory: Path) -> list[str]:
    """Each entry's model file: a zoo ``name:mode`` written into ``directory``, else a path."""
    paths = []
    for entry in entries:
        name, _, mode = entry.partition(":")
        paths.append(str(zoo.write_stub(name, mode, directory)) if mode else compile_time.MODELS.get(entry, entry))
    return paths


def cold_alternative(paths: list[str], gpus: int, tmp: Path, timeout: float) -> dict[str, Any]:
    """Each model's cold max-autotune compile, ``gpus`` at a time, each on its own GPU."""
    free: queue.Queue[int] = queue.Queue()
    for gpu in range(gpus):
        free.put(gpu)

    def one(path: str) -> dict[str, Any]:
        gpu = free.get()
        try:
            result = compile_time.run_file_scenario("max-autotune-cold", path, tmp / Path(path).stem,
                                                    f"sqlite:///{tmp / 'unused.db'}", timeout,
                                                    {"CUDA_VISIBLE_DEVICES": str(gpu)})
            return {"model": path, "gpu": gpu, "status": result.get("status"),
                    "wall_s": result.get("process_wall_s"), "first_call_s": result.get("first_call_s")}
        finally:
            free.put(gpu)

    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, gpus)) as pool:
        models = list(pool.map(one, paths))
    ok = all(m["status"] == "ok" for m in models)
    return {"status": "ok" if ok else "error", "gpus": gpus, "wall_s": time.perf_counter() - began, "models": models}


def warm_starts(entries: list[str], paths: list[str], cache: Path, tmp: Path, timeout: float) -> dict[str, Any]:
    """A fresh warm-started job of each entry, one after another, against ``cache``."""
    models = {}
    for entry, path in zip(entries, paths):
        result = compile_time.run_file_scenario("warm-start", path, tmp / entry.replace(":", "_"),
                                                f"sqlite:///{cache}", timeout)
        models[entry] = {"status": result.get("status"), "first_call_s": result.get("first_call_s"),
                         "bench": result.get("bench"), "error": result.get("error")}
    ok = all(m["status"] == "ok" for m in models.values())
    return {"status": "ok" if ok else "error", "cache": cache.name, "models": models}


def derive(run: dict[str, Any]) -> None:
    """Efficiencies, serial fractions, their projection and the ratio to the cold alternative."""
    steps = run["steps"]
    _against_cold_and_two(run, steps)
    one = steps.get("queue1") or {}
    if one.get("status") != "ok":
        return
    widest = None
    for key, n in list(QUEUE_STEPS.items())[1:]:
        many = steps.get(key) or {}
        if many.get("status") == "ok":
            many["efficiency"] = one["wall_s"] / (n * many["wall_s"])
            many["serial_fraction"] = serial_fraction(one["wall_s"], many["wall_s"], n)
            widest = many
    if widest is not None:
        s = widest["serial_fraction"]
        run["projected"] = {str(k): {"wall_s": one["wall_s"] * (s + (1 - s) / k), "efficiency": 1 / (k * s + 1 - s)}
                            for k in PROJECTED}


def _against_cold_and_two(run: dict[str, Any], steps: dict[str, Any]) -> None:
    """The 4-GPU sweep against the cold alternative; and its efficiency against 2 GPUs (what
    doubling the GPUs gave), which needs no 1-GPU sweep."""
    four, cold = steps.get("queue4") or {}, steps.get("cold") or {}
    if four.get("status") == "ok" and cold.get("status") == "ok":
        run["vs_cold"] = four["wall_s"] / cold["wall_s"]
        packed = longest_first_wall([m.get("wall_s") for m in cold.get("models") or []], cold.get("gpus") or 4)
        if packed:  # the alternative at its best: a team that knew each compile's length beforehand
            cold["packed_wall_s"] = packed
            run["vs_cold_packed"] = four["wall_s"] / packed
    two = steps.get("queue2") or {}
    if two.get("status") == "ok" and four.get("status") == "ok":  # from 2 GPUs to 4, with or without queue1
        run["scaling_2_to_4"] = 2 * two["wall_s"] / (4 * four["wall_s"])


def longest_first_wall(seconds: list[float | None], gpus: int) -> float | None:
    """The cold alternative's wall time had its compiles been ordered longest first, each to
    the GPU free first (from each compile's own time in the same run); None if one is missing."""
    if not seconds or any(s is None for s in seconds):
        return None
    loads = [0.0] * max(1, gpus)
    for length in sorted((float(s) for s in seconds if s is not None), reverse=True):
        loads[loads.index(min(loads))] += length
    return max(loads)


def serial_fraction(one_s: float, many_s: float, n: int) -> float:
    """Amdahl's serial fraction s from T1 and TN: TN = T1 (s + (1 - s) / N)."""
    return min(1.0, max(0.0, (n * many_s / one_s - 1) / (n - 1)))


def goals(run: dict[str, Any]) -> list[str]:
    out = []
    for n, goal in EFFICIENCY_GOALS.items():
        efficiency = (run["steps"].get(f"queue{n}") or {}).get("efficiency")
        if efficiency is not None:
            out.append(f"- efficiency at {n} GPUs >= {goal}: {efficiency:.2f} ({'met' if efficiency >= goal else 'NOT met'})")
    warm = (run["steps"].get("warm") or {}).get("models") or {}
    if warm:
        clean = all(m.get("status") == "ok" and not any((m.get("bench") or {}).values()) for m in warm.values())
        out.append(f"- every warm-started model ({', '.join(warm)}) ran 0 benchmarks: {'met' if clean else 'NOT met'}")
    if run.get("vs_cold") is not None:
        met = "met" if run["vs_cold"] <= COLD_GOAL else "NOT met"
        out.append(f"- the 4-GPU sweep <= {COLD_GOAL}x the 4-GPU cold-compile alternative: {run['vs_cold']:.2f} ({met})")
    if run.get("vs_cold_packed") is not None:
        met = "met" if run["vs_cold_packed"] <= COLD_GOAL else "NOT met"
        out.append(f"- the same against the alternative ordered longest first: {run['vs_cold_packed']:.2f} ({met})")
    return out


def render(run: dict[str, Any]) -> list[str]:
    steps = run.get("steps") or {}
    rows = [[n, _wall(s), s.get("found", "-"), fmt(s.get("startup_s")), fmt(s.get("capture_s")),
             fmt(s.get("tuning_s")), fmt(s.get("pointwise_s")), fmt(s.get("efficiency"), ".2f"),
             fmt(s.get("serial_fraction"), ".2f")]
            for key, n in QUEUE_STEPS.items() if (s := steps.get(key))]
    per_gpu = f" End-to-end passes per GPU: {run['passes_per_gpu']}." if run.get("passes_per_gpu") else ""
    lines = [f"Workload: {', '.join(run.get('workload') or [])}.{per_gpu}", ""]
    lines += harness.table(["GPUs", "wall s", "requests", "start-up", "capture", "GEMM tuning", "passes",
                            "efficiency", "serial fraction"], rows)
    for k, p in (run.get("projected") or {}).items():
        lines.append(f"- projected to {k} GPUs: {p['wall_s']:.0f} s, efficiency {p['efficiency']:.2f}")
    for entry, warm in ((steps.get("warm") or {}).get("models") or {}).items():
        bench = warm.get("bench") or {}
        lines.append(f"- {entry} warm-started against the {steps['warm'].get('cache')} cache: {warm.get('status')}, "
                     f"first call {fmt(warm.get('first_call_s'))} s, benchmarks "
                     + ", ".join(f"{k} {v}" for k, v in bench.items()))
    cold = steps.get("cold")
    if cold:
        lines.append(f"- cold max-autotune, each model once, {cold.get('gpus')} at a time: {fmt(cold.get('wall_s'))} s "
                     f"({cold.get('status')})")
        if cold.get("packed_wall_s"):
            lines.append(f"- the same compiles ordered longest first (from their own times): "
                         f"{fmt(cold['packed_wall_s'])} s")
    if run.get("scaling_2_to_4") is not None:
        lines.append(f"- from 2 GPUs to 4: efficiency {run['scaling_2_to_4']:.2f} (2 T2 / 4 T4)")
    return lines + _pass_table(steps) + [""] + goals(run)


def _wall(step: dict[str, Any]) -> str:
    """A step's wall time; one that did not finish says so, its time a lower bound."""
    wall = fmt(step.get("wall_s"))
    return wall if step.get("status") == "ok" else f"> {wall} ({step.get('status')})"


def _pass_table(steps: dict[str, Any]) -> list[str]:
    """Each queue step's end-to-end compiles: which model, when it began (after the first), how long."""
    lines: list[str] = []
    for key in QUEUE_STEPS:
        rows = [[p.get("model"), fmt(p.get("began_s")), fmt(p.get("seconds")), p.get("kernels_tuned", "-"),
                 "timing" if p.get("time_in_graph") else "served",
                 ", ".join(f"{name} {fmt(sec)}" for name, sec in list((p.get("phases") or {}).items())[:4]), p.get("error") or ""]
                for p in (steps.get(key) or {}).get("passes") or []]
        if rows:
            lines += ["", f"{key}'s end-to-end compiles:", ""]
            lines += harness.table(["model", "began s (after the first)", "seconds", "kernels tuned", "compile",
                                    "longest phases (s, nested)", "error"], rows)
    return lines


def _warm_step(args: argparse.Namespace, entries: list[str], paths: list[str], kept: Path, tmp: Path,
               timeout: float) -> dict[str, Any]:
    """The warm step against the widest queue step this run swept (its cache kept)."""
    caches = [db for key in reversed(QUEUE_STEPS) for db in sorted((kept / key).glob("*.db"))]
    if not caches:
        return {"status": "error", "error": "no queue step of this run left a cache to warm-start from"}
    chosen = [e.strip() for e in args.warm_models.split(",") if e.strip() in entries]
    return warm_starts(chosen, [paths[entries.index(e)] for e in chosen], caches[0], tmp, timeout)


def results(out: Path) -> harness.Results:
    return harness.Results(out, "team_queue", "A team's tuning queue: the zoo workload on 1, 2 and 4 GPUs", render)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.team_queue", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(WORKLOAD), help="zoo name:mode entries or paths (default: WORKLOAD)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"any of {', '.join(STEPS)}")
    parser.add_argument("--warm-models", default=",".join(WARM_MODELS),
                        help="entries of --models the warm step starts (default: %(default)s)")
    parser.add_argument("--logs", default=None, help="keep each queue step's sweep log in this folder")
    parser.add_argument("--cold-gpus", type=int, default=4, help="compiles at once in the cold step (default 4)")
    harness.output_options(parser, "team_queue", "the GPU and its count")
    parser.add_argument("--budget", type=float, default=570.0, help="seconds for the whole run (default 570)")
    parser.add_argument("--resume", default=None, help="a results file: keep what its run of this label measured")
    args = parser.parse_args(argv)
    harness.log_to_stderr()
    deadline = time.monotonic() + args.budget
    store = results(Path(args.out))
    run, earlier, gpus = harness.resumable_run(store, args, "benchmarks.team_queue", argv)
    entries = [m.strip() for m in args.models.split(",") if m.strip()]
    from autotune.settings import Settings

    # The sweeps read it from the environment (AUTOTUNE_PASSES_PER_GPU): one run per value compares them.
    run.update(workload=entries, steps=earlier.get("steps") or {}, skipped=[],
               passes_per_gpu=Settings.from_env().passes_per_gpu)
    stubs = Path(tempfile.mkdtemp(prefix="team_queue_models_"))
    paths = model_paths(entries, stubs)
    kept = Path(tempfile.mkdtemp(prefix="team_queue_caches_"))  # each queue step's cache, for the warm step
    for key in [s.strip() for s in args.steps.split(",") if s.strip()]:
        if (run["steps"].get(key) or {}).get("status") == "ok":
            continue  # measured by the run resumed
        n = QUEUE_STEPS.get(key)
        if (n is not None and n > max(gpus, 1)) or deadline - time.monotonic() < 30:
            run["skipped"].append(key)
            continue
        tmp = Path(tempfile.mkdtemp(prefix="team_queue_"))
        try:
            log.info("%s ...", key)
            if n is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(n)) if gpus else ""
                log_path = Path(args.logs) / f"{key}-sweep.log" if args.logs else None
                run["steps"][key] = sweep_bench.sweep(paths, n, kept / key, tmp, deadline - time.monotonic(), log_path)
            elif key == "warm":
                run["steps"][key] = _warm_step(args, entries, paths, kept, tmp, deadline - time.monotonic())
            else:
                run["steps"][key] = cold_alternative(paths, min(args.cold_gpus, max(gpus, 1)), tmp,
                                                     deadline - time.monotonic())
            log.info("%s: %s %.1f s", key, run["steps"][key].get("status"), run["steps"][key].get("wall_s") or 0)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            derive(run)
            store.save()
    shutil.rmtree(stubs, ignore_errors=True)
    shutil.rmtree(kept, ignore_errors=True)
    print(store.path.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
