"""The exhaustive search against the default one: what each gives a job's kernels, and its cost.

For each model, on one GPU, each step in fresh processes with fresh Inductor and Triton caches
(benchmarks/compile_time.py's harness). First the two sweeps:

- ``sweep-default``: ``autotune sweep MODEL --json`` into a new SQLite cache.
- ``sweep-exhaustive``: ``autotune sweep MODEL --search exhaustive --budget-s S --json`` into a
  copy of that cache (its stored capture is replayed; its default rows are searched again).

Then ``--samples`` rounds (default 2) of the three compiles, taking turns, one process each:

- ``max-autotune-cold``: a plain max-autotune compile, no cache.
- ``warm-default``: ``autotune.warm_start(<the default cache>)`` then max-autotune.
- ``warm-exhaustive``: the warm start from the exhaustive cache.

Each compile step records the summed GPU kernel time per call (``--kernel-profile``), the median
latency, the first call, the hook's hits and misses, and the benchmarks Inductor ran; each sweep
its wall time and its cost (the workers' busy time, in GPU-minutes, from the sweep's report).

    python -m benchmarks.exhaustive --models mlp,gpt --budget-s 20 --out $OUT
    python -m benchmarks.exhaustive --models /tmp/stubs/dlrm_infer.py   # a zoo row (python -m benchmarks.zoo stub)
    python -m benchmarks.exhaustive --models mlp --dry-run      # the plan, nothing run
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import compile_time, harness
from benchmarks.harness import fmt, ratio

log = logging.getLogger("exhaustive")

DEFAULT_MODELS = ("mlp", "gpt")
SWEEPS = ("sweep-default", "sweep-exhaustive")
COMPILES = ("max-autotune-cold", "warm-default", "warm-exhaustive")
STEPS = SWEEPS + COMPILES
# Step -> the compile_time scenario it runs (the sweeps run here).
SCENARIO = {"max-autotune-cold": "max-autotune-cold", "warm-default": "warm-start", "warm-exhaustive": "warm-start"}


def _sweep_command(path: str, cache_url: str, args: argparse.Namespace, exhaustive: bool) -> list[str]:
    cmd = harness.AUTOTUNE + ["sweep", path, "--cache", cache_url, "--json"]
    cmd += ["--train"] if compile_time.is_training_file(harness.REPO / path) else []
    cmd += ["--search", "exhaustive", "--budget-s", str(args.budget_s)] if exhaustive else []
    return cmd


def run_sweep(path: str, cache_url: str, tmp: Path, args: argparse.Namespace, exhaustive: bool,
              log_path: Path | None) -> dict[str, Any]:
    """One sweep, whole command timed; its totals and its cost from the JSON report."""
    cmd = _sweep_command(path, cache_url, args, exhaustive)
    done = harness.run(cmd, harness.child_env(tmp / ("sweep-exhaustive" if exhaustive else "sweep"), cache_url),
                       args.timeout, log_path)
    report = harness.sweep_report(done.stdout)
    result: dict[str, Any] = {"command": "autotune " + " ".join(cmd[3:]), "wall_s": done.wall_s, "rc": done.rc}
    if report is not None:
        totals = report.get("totals", {})
        result.update({key: totals.get(key) for key in ("found", "cached", "tuned", "failed", "tuning_seconds")},
                      cost=report.get("cost"), refused=totals.get("candidates_refused"),
                      device_name=report.get("device_name"))
    result["status"] = "ok" if done.rc == 0 and report is not None else (
        "timeout" if done.rc is None else "error")
    if result["status"] != "ok":
        result.update(error=f"sweep exited {done.rc}", stderr_tail=harness.tail(done.stderr))
    return result


def run_compile(step: str, name: str, path: str, cache_url: str, tmp: Path, args: argparse.Namespace,
                log_path: Path | None) -> dict[str, Any]:
    scenario = SCENARIO[step]
    run = compile_time.ModelRun(name, path, [scenario], tmp / step, cache_url,
                                train=compile_time.is_training_file(harness.REPO / path))
    run.tmp.mkdir(parents=True, exist_ok=True)
    options = argparse.Namespace(runs=args.runs, warmup=args.warmup, optimizer_step="compiled",
                                 kernel_profile=args.kernel_profile, timeout=args.timeout, dynamic=None,
                                 batch_size=None)
    result = compile_time.run_model_scenario(scenario, run, options, log_path)
    result.pop("kernels", None)  # the per-kernel list: the sum per call is what this compares
    return result


def run_model(name: str, path: str, args: argparse.Namespace, gpu: str) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"exhaustive_{name}_"))
    caches = {"default": tmp / "default.db", "exhaustive": tmp / "exhaustive.db"}
    entry: dict[str, Any] = {"path": path, "steps": {}}
    samples: dict[str, list[dict[str, Any]]] = {step: [] for step in COMPILES}
    try:
        for step in SWEEPS:
            exhaustive = step == "sweep-exhaustive"
            if exhaustive and caches["default"].exists():
                harness.copy_sqlite(caches["default"], caches["exhaustive"])
            log.info("%s: %s ...", name, step)
            result = run_sweep(path, _cache_url(caches, step), tmp, args, exhaustive, _log_path(args, gpu, name, step))
            entry["steps"][step] = {**result, "date": harness.now()}
            log.info("%s: %s %s %s", name, step, result.get("status"), result.get("error") or "")
        for sample in range(args.samples):  # the compiles take turns: a drift of the GPU's clocks hits each alike
            for step in COMPILES:
                log.info("%s: %s, sample %d ...", name, step, sample + 1)
                result = run_compile(step, name, path, _cache_url(caches, step), tmp / str(sample), args,
                                     _log_path(args, gpu, name, f"{step}-{sample}"))
                samples[step].append({**result, "date": harness.now()})
                log.info("%s: %s %s %s", name, step, result.get("status"), result.get("error") or "")
    finally:
        if not args.keep_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    for step, results in samples.items():
        if results:
            entry["steps"][step] = merge_samples(results)
    kernel = {step: entry["steps"].get(step, {}).get("kernel_us_per_call") for step in COMPILES}
    entry["kernel_ratio_exhaustive_vs_default"] = ratio(kernel["warm-exhaustive"], kernel["warm-default"])
    entry["kernel_ratio_exhaustive_vs_cold"] = ratio(kernel["warm-exhaustive"], kernel["max-autotune-cold"])
    entry["kernel_ratio_default_vs_cold"] = ratio(kernel["warm-default"], kernel["max-autotune-cold"])
    return entry


def _cache_url(caches: dict[str, Path], step: str) -> str:
    """The cache a step sweeps into or serves from: the exhaustive one for ``*-exhaustive``."""
    return f"sqlite:///{caches['exhaustive' if step.endswith('exhaustive') else 'default']}"


def _log_path(args: argparse.Namespace, gpu: str, name: str, step: str) -> Path | None:
    return Path(args.log_dir) / f"{gpu}-{name}-{step}.log" if args.log_dir else None


def merge_samples(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One compile step's processes as one row: the first's details, the median of the figures
    compared, and every process's kernel time (its spread)."""
    ok = [r for r in results if r.get("status") == "ok"] or results
    merged = dict(ok[0])
    for key in ("kernel_us_per_call", "median_ms", "first_call_s"):
        values = [r[key] for r in ok if isinstance(r.get(key), (int, float))]
        merged[key] = statistics.median(values) if values else None
    merged["samples"] = len(results)
    merged["failed_samples"] = sum(r.get("status") != "ok" for r in results)
    merged["kernel_us_samples"] = [r.get("kernel_us_per_call") for r in results]
    return merged


def _row(step: str, r: dict[str, Any]) -> list[str]:
    kernel = r.get("kernel_us_per_call")
    hook = r.get("hook") or {}
    cost = r.get("cost") or {}
    note = "" if r.get("status") == "ok" else f"{r.get('status')}: {str(r.get('error', ''))[:120]}"
    if step.startswith("sweep") and r.get("status") == "ok":
        note = f"tuned {r.get('tuned')} of {r.get('found')}, {r.get('cached')} cached"
    elif r.get("failed_samples"):
        note = f"{r['failed_samples']} of {r.get('samples')} processes failed; " + note
    return [step, fmt(r.get("first_call_s") if not step.startswith("sweep") else r.get("wall_s")),
            _kernel_cell(kernel, r.get("kernel_us_samples")), fmt(r.get("median_ms"), ".3f"),
            f"{hook.get('hits')}/{hook.get('misses')}" if hook else "-", compile_time.bench_cell(r.get("bench")),
            fmt(cost.get("total"), ".2f"), note]


def _kernel_cell(median_us: Any, samples: Any) -> str:
    """Kernel ms per call: the median, and each process's in brackets (the spread)."""
    if not isinstance(median_us, (int, float)):
        return "-"
    each = [f"{v / 1e3:.3f}" for v in samples or () if isinstance(v, (int, float))]
    return f"{median_us / 1e3:.3f}" + (f" ({', '.join(each)})" if len(each) > 1 else "")


def render(run: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for model, entry in run.get("models", {}).items():
        lines += [f"### {model} (`{entry['path']}`), --budget-s {run.get('budget_s')}", ""]
        lines += harness.table(["step", "first call / sweep s", "kernels ms/call (each process)", "median ms",
                                "hits/misses", "bench @1st gemm/pw/cd", "sweep GPU-min", "note"],
                               [_row(step, r) for step, r in entry["steps"].items()])
        lines += ["", "summed kernel time per call, medians: exhaustive / cold max-autotune "
                      f"{fmt(entry.get('kernel_ratio_exhaustive_vs_cold'), '.3f')}; default sweep / cold "
                      f"{fmt(entry.get('kernel_ratio_default_vs_cold'), '.3f')}; exhaustive / default "
                      f"{fmt(entry.get('kernel_ratio_exhaustive_vs_default'), '.3f')}", ""]
    return lines


def results(out: Path) -> harness.Results:
    return harness.Results(out, "exhaustive", "Exhaustive search vs default: kernel time and sweep cost", render)


def _models(raw: str) -> list[tuple[str, str]]:
    found = []
    for name in (part.strip() for part in raw.split(",") if part.strip()):
        path = compile_time.MODELS.get(name, name)
        if not (harness.REPO / path).is_file():
            raise SystemExit(f"--models: {name!r} is neither one of {', '.join(compile_time.MODELS)} nor a file")
        found.append((Path(path).stem if name == path else name, path))
    return found


def plan(models: list[tuple[str, str]], args: argparse.Namespace) -> list[str]:
    """What a run does, step by step, without running it."""
    lines = []
    for name, path in models:
        for step in STEPS:
            if step.startswith("sweep"):
                cache = f"<tmp>/{'exhaustive' if step.endswith('exhaustive') else 'default'}.db"
                command = " ".join(_sweep_command(path, f"sqlite:///{cache}", args, step.endswith("exhaustive"))[3:])
                lines.append(f"{name}: {step}: autotune {command}")
            else:
                profile = " --kernel-profile" if args.kernel_profile else ""
                lines.append(f"{name}: {step}: compile_time scenario {SCENARIO[step]}{profile}, "
                             f"{args.samples} processes taking turns with the other compiles")
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.exhaustive", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"names ({', '.join(compile_time.MODELS)}) or files (default %(default)s)")
    parser.add_argument("--budget-s", type=float, default=20.0, help="the exhaustive sweep's --budget-s (default 20)")
    harness.output_options(parser, "exhaustive", "the GPU's name", timeout=300.0, per="step")
    parser.add_argument("--samples", type=int, default=2, help="processes per compile step, taking turns (default 2)")
    parser.add_argument("--runs", type=int, default=50, help="timed calls per compile step (default 50)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls before them (default 5)")
    parser.add_argument("--no-kernel-profile", dest="kernel_profile", action="store_false",
                        help="skip the GPU kernel profile (it is what this benchmark compares)")
    parser.add_argument("--log-dir", default=None, help="write each child's output here")
    parser.add_argument("--keep-tmp", action="store_true", help="keep each model's caches")
    parser.add_argument("--dry-run", action="store_true", help="print the steps and stop")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.budget_s <= 0 or args.runs < 1 or args.samples < 1 or args.warmup < 0 or args.timeout <= 0:
        raise SystemExit("--budget-s, --runs, --samples and --timeout must be positive and --warmup >= 0")
    models = _models(args.models)
    if args.dry_run:
        print("\n".join(plan(models, args)))
        return 0
    harness.log_to_stderr(args.verbose)
    harness.warm_bytecode()
    info = harness.machine(min(args.timeout, 300))
    gpu = harness.slug(info.get("gpu") or "cpu")
    store = results(Path(args.out))
    run = store.run(args.label or f"{gpu}: {','.join(name for name, _ in models)}", info,
                    "python -m benchmarks.exhaustive " + " ".join(argv))
    run.update(budget_s=args.budget_s, models={})
    for name, path in models:
        run["models"][name] = run_model(name, path, args, gpu)
        store.save()  # after every model: a cut command loses nothing
    print(store.path.with_suffix(".md").read_text())
    steps = [r for entry in run["models"].values() for r in entry["steps"].values()]
    return 0 if steps and all(r.get("status") == "ok" for r in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
