"""What a user waits for: a script's whole process, from its start to the first result, in one run.

    python -m benchmarks.startup --models resnet50,vit --out $OUT     # GPU: two models per device call
    python -m benchmarks.startup --models lm_train,mlp --out $OUT
    python -m benchmarks.startup --quick                              # CPU: the small model only
    python -m benchmarks.headline                                     # README's table from the run

Per model it sweeps once with a signing key, then runs each scenario as a fresh process with
fresh Inductor and Triton caches. The child is written in the user's order: the model's
libraries imported at the top (``torchvision``, ``transformers``), the set-up call, the model
built, ``--busy-seconds`` of pure-Python CPU work (a data pipeline or a tokenizer being built:
it holds the interpreter, unlike a sleep), then ``torch.compile`` and the first call (a training
model's whole first step: forward, backward, optimizer). Scenarios, by their set-up call:

- ``floor-save`` (not timed): Dynamo's ``caching_precompile`` on, a default compile, its
  Mega-cache saved: the floor's blob;
- ``floor``: ``caching_precompile`` on and ``torch.compiler.load_cache_artifacts`` of that blob,
  then a default compile (the ratios' reference);
- ``default``: nothing, a plain default-mode compile;
- ``warm-start``: ``autotune.warm_start()``, then a max-autotune compile served by the sweep;
- ``baseline`` (with ``--baseline DIR``): ``warm-start`` run from another version's code, made
  by ``bash benchmarks/baseline_code.sh COMMIT`` (a commit that has this file).

Each timed scenario runs in ``--processes N`` processes (default 3), the scenarios taking turns.
Each records the whole process (spawned to first result: the judged figure) and the first call
(the compile call to its result); a cell keeps every process's figures and their median, min and
max, and each scenario's medians against the floor's. With PREFETCH_PROFILE_DIR set, each child
also writes its first call's cProfile there; with PREFETCH_SAMPLE_DIR, its threads' stacks up to
its first result (benchmarks/thread_samples.py).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import importlib
import importlib.util
import json
import logging
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import threading
import time
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks import harness, thread_samples
from benchmarks.harness import fmt, ratio

log = logging.getLogger("startup")


@dataclass(frozen=True)
class Model:
    path: str
    libraries: tuple[str, ...] = ()  # imported at the script's top, as the user's script does
    title: str = ""


MODELS: dict[str, Model] = {
    "resnet50": Model("examples/resnet50.py", ("torchvision",), "ResNet-50 (torchvision), bf16, batch 8"),
    "vit": Model("examples/vit_hf.py", ("transformers",), "ViT-B/16 (transformers), bf16, batch 8"),
    "lm_train": Model("examples/lm_train.py", (), "LM training step, 4 blocks, AdamW"),
    "mlp": Model("examples/mlp.py", (), "small MLP"),
    "resnet": Model("examples/resnet.py", ("torchvision",), "ResNet-18 (torchvision), bf16, batch 16"),
    "gpt": Model("examples/gpt.py", (), "4 transformer blocks"),
    "experts": Model("examples/experts.py", (), "Linear layers and bmm, freezing on (CPU only)"),
}
DEFAULT_MODELS = ("resnet50", "vit", "lm_train", "mlp")  # a conv net, a transformer, a training step, a small model
QUICK_MODELS = ("mlp",)
TIMED = ("floor", "default", "warm-start")
BASELINE = "baseline"  # --baseline DIR: the warm-start scenario with another version's code
BASELINE_COMMIT = "BASELINE_COMMIT"  # the file in DIR naming its commit (benchmarks/baseline_code.sh)
SPAWNED_ENV = "STARTUP_BENCH_SPAWNED_AT"  # the parent's wall clock when it started the child
PROFILE_ENV = "PREFETCH_PROFILE_DIR"  # set: each child writes its first call's cProfile here
SAMPLE_ENV = "PREFETCH_SAMPLE_DIR"  # set: each child writes its threads' stacks up to its first result here
PHASES_KEPT = 12  # each first call's longest compile phases kept in the results
TIMINGS = ("whole_process_s", "first_call_s")  # per process; a cell's are their median, min and max
PROCESS_DETAILS = ("imports_s", "setup_s", "model_build_s", "busy_s", "benchmarks", "hook", "modules")


# --------------------------------------------------------------------------- the child


def child(args: argparse.Namespace) -> int:
    """One scenario in this fresh process; one result line."""
    result: dict[str, Any] = {"scenario": args.scenario, "busy_seconds": args.busy_seconds, "status": "error"}
    return harness.child_result(result, lambda: _child_run(args, result))


def _child_run(args: argparse.Namespace, result: dict[str, Any]) -> None:
    spawned = float(os.environ.get(SPAWNED_ENV) or time.time())
    began = time.perf_counter()
    sampler = thread_samples.Sampler(began) if os.environ.get(SAMPLE_ENV) else None
    import torch  # the script's top: torch and the model's libraries

    for library in args.library or ():
        importlib.import_module(library)
    mark = time.perf_counter()
    result["imports_s"] = mark - began
    at_top = set(sys.modules)
    handle = _set_up(args)  # the set-up call
    now = time.perf_counter()
    result["setup_s"], mark = now - mark, now
    after_setup = set(sys.modules)
    from benchmarks import compile_time

    cuda = torch.cuda.is_available()
    prepared = compile_time._prepare(args.model, None, "cuda" if cuda else "cpu", None)
    if cuda:
        torch.ones(1, device="cuda").sum().item()  # the CUDA context is part of building the model
    now = time.perf_counter()
    result["model_build_s"], mark = now - mark, now
    result["busy_work"] = busy(args.busy_seconds)
    result["busy_s"] = time.perf_counter() - mark
    result["threads_at_first_call"] = sorted(t.name for t in threading.enumerate())  # what still runs beside it
    mode = "max-autotune" if handle is not None else "default"
    _first_call(args, prepared, mode, result)
    result["whole_process_s"] = time.time() - spawned
    # Which modules each scenario imports after the script's top: the set-up call's, and the rest
    # (the model's build and the first call). The names stay in the child's log.
    result["module_names"] = {"set_up": sorted(after_setup - at_top), "after_set_up": sorted(set(sys.modules) - after_setup)}
    result["modules"] = {phase: len(names) for phase, names in result["module_names"].items()}
    if sampler is not None:
        sampler.stop(Path(os.environ[SAMPLE_ENV]) / f"{_stem(args)}-{os.getpid()}.json")
    result["first_call_phases"] = _longest_phases()
    result.update(device="cuda" if cuda else "cpu", mode=mode, train=prepared.train_step is not None)
    _after(args, result, handle)


def _first_call(args: argparse.Namespace, prepared: Any, mode: str, result: dict[str, Any]) -> None:
    """torch.compile and the first call (a training model's first step), timed to its result."""
    import torch

    from benchmarks import compile_time

    cuda = torch.cuda.is_available()
    options = Namespace(dynamic=None, optimizer_step="compiled")
    profiler = cProfile.Profile() if os.environ.get(PROFILE_ENV) else None
    with torch.no_grad() if prepared.train_step is None else torch.enable_grad():
        start = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        work = compile_time._compile_workload(prepared, mode, options)
        if cuda and mode == "max-autotune":  # it replays CUDA graphs: the step is a new one (a training step's
            torch.compiler.cudagraph_mark_step_begin()  # outputs would be overwritten within it otherwise)
        work(prepared.inputs)
        if cuda:
            torch.cuda.synchronize()
        result["first_call_s"] = time.perf_counter() - start
    if profiler is not None:
        profiler.disable()
        _write_profile(profiler, Path(os.environ[PROFILE_ENV]) / f"{_stem(args)}.txt")


def busy(seconds: float) -> int:
    """``seconds`` of pure-Python CPU work, as a tokenizer's build does: count the character pairs
    of a word list, pass after pass. It holds the interpreter as real work does (a sleep does not)."""
    if seconds <= 0:
        return 0
    words = [f"token{i % 997}piece{i % 13}" for i in range(4000)]
    pairs: dict[str, int] = {}
    end, passes = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        for word in words:
            for left, right in zip(word, word[1:]):
                pairs[left + right] = pairs.get(left + right, 0) + 1
        passes += 1
    return passes


def _stem(args: argparse.Namespace) -> str:
    return f"{Path(args.model).stem}-{args.scenario}-{os.getpid()}"


def _longest_phases() -> dict[str, float]:
    """The first call's longest phases as torch times them (nothing compiles before it)."""
    from autotune.sweep.end_to_end import compile_phase_totals, longest_phases

    return longest_phases({}, compile_phase_totals(), top=PHASES_KEPT)


def _write_profile(profiler: cProfile.Profile, path: Path) -> None:
    """The first call's profile (its thread only), by cumulative and by own time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for order, top in (("cumulative", 80), ("tottime", 40)):
            pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(top)


def _set_up(args: argparse.Namespace) -> Any:
    """The set-up call: the floor's Mega-cache load, or the warm start. Returns the hook's handle."""
    if args.scenario == "warm-start":
        import autotune

        return autotune.warm_start(args.cache)
    import torch

    if args.scenario in ("floor", "floor-save"):
        torch._dynamo.config.caching_precompile = True
    if args.scenario == "floor":
        torch.compiler.load_cache_artifacts(Path(args.megacache).read_bytes())
    return None


def _after(args: argparse.Namespace, result: dict[str, Any], handle: Any) -> None:
    """Outside the timings: the benchmarks run, the hook's stats, the floor's save."""
    from autotune.inductor_glue.inductor import benchmarks_run

    result["benchmarks"] = benchmarks_run()
    if handle is not None:
        stats = handle.stats.as_dict()
        result["hook"] = {k: stats[k] for k in ("hits", "misses", "artifacts_loaded", "artifacts_rejected",
                                                 "prefetched_rows", "prefetched_artifacts", "prefetch_waits",
                                                 "prefetch_wait_s", "install_s") if k in stats}
    if args.scenario == "floor-save":
        import torch

        saved = torch.compiler.save_cache_artifacts()
        data = saved[0] if saved is not None else b""
        Path(args.megacache).write_bytes(data)
        result["megacache_bytes"] = len(data)


# -------------------------------------------------------------------------- the parent


@dataclass
class Cell:
    """Where one model's processes run: its folder, cache, key and options."""

    name: str
    tmp: Path
    cache_url: str
    key: str | None
    args: argparse.Namespace

    @property
    def model(self) -> Model:
        return MODELS[self.name]

    def run(self, scenario: str, repeat: int) -> dict[str, Any]:
        """One process of ``scenario``, with caches of its own."""
        code, runs_as = _code_for(scenario, self.args.baseline)
        cmd = [sys.executable, "-m", "benchmarks.startup", "_child", "--model", self.model.path,
               "--scenario", runs_as, "--busy-seconds", str(self.args.busy_seconds), "--cache", self.cache_url,
               "--megacache", str(self.tmp / "floor.megacache")]
        cmd += [arg for library in self.model.libraries for arg in ("--library", library)]
        env = harness.child_env(self.tmp / f"{scenario}-{repeat}", self.cache_url, code)
        if runs_as == "warm-start" and self.key:
            env["AUTOTUNE_TRUSTED_KEYS"] = self.key + ".pub"
        log_dir = Path(self.args.log_dir) if self.args.log_dir else None
        log_path = log_dir / f"{self.name}-{scenario}-{repeat}.log" if log_dir else None
        env[SPAWNED_ENV] = repr(time.time())
        done = harness.run(cmd, env, self.args.timeout, log_path, cwd=code)
        payload = harness.marker_payload(done.stdout) or {"status": "error", "error": f"no result line (rc {done.rc})"}
        payload["scenario"] = scenario  # a baseline process ran the warm-start scenario
        if done.rc is None:
            payload.update(status="timeout", error=f"timed out after {self.args.timeout:.0f} s")
        if payload.get("status") != "ok":
            payload["stderr_tail"] = harness.tail(done.stderr)
        return {**payload, "process_wall_s": done.wall_s}


def _code_for(scenario: str, baseline: Path | None) -> tuple[Path, str]:
    """Where a scenario's process runs (its working folder, first on its path) and the child's
    scenario. A baseline process runs in the baseline's folder, whose ``autotune`` and
    ``benchmarks`` shadow this checkout's, and finds the model files under the same relative
    paths (a link to this checkout's examples): a compiled graph's keys name its source file."""
    if scenario != BASELINE:
        return harness.REPO, scenario
    if baseline is None:
        raise ValueError("the baseline scenario needs --baseline DIR")
    examples = baseline / "examples"
    if not examples.exists():
        examples.symlink_to(harness.REPO / "examples", target_is_directory=True)
    return baseline, "warm-start"


def baseline_folder(path: str) -> Path:
    """``--baseline``'s folder, checked: one line naming the problem and the fix otherwise."""
    folder = Path(path).resolve()
    if not (folder / "autotune" / "__init__.py").is_file() or not (folder / "benchmarks" / "startup.py").is_file():
        raise SystemExit(f"--baseline {path}: no autotune package and benchmarks/startup.py there; make one with "
                         f"`bash benchmarks/baseline_code.sh COMMIT {path}` (a commit that has startup.py)")
    return folder


def baseline_name(folder: Path) -> str:
    named = folder / BASELINE_COMMIT
    return named.read_text().strip() if named.is_file() else folder.name


def missing_library(name: str) -> str | None:
    """Why ``name`` cannot run here (a library it imports is not installed), or None."""
    absent = [lib for lib in MODELS[name].libraries if importlib.util.find_spec(lib) is None]
    return f"{name}: skipped, {', '.join(absent)} is not installed" if absent else None


def measure_model(name: str, args: argparse.Namespace,
                  save: Callable[[dict[str, Any]], None] = lambda entry: None) -> dict[str, Any]:
    """Sweep ``name``, then time its cells; ``save`` gets the entry after every process, so a
    command cut short keeps the processes it finished."""
    from benchmarks import compile_time

    model = MODELS[name]
    tmp = Path(tempfile.mkdtemp(prefix=f"startup_{name}_"))
    cache_url = f"sqlite:///{tmp / 'cache.db'}"
    model_run = compile_time.ModelRun(name, model.path, [compile_time.ARTIFACTS], tmp, cache_url,
                                      train=compile_time.is_training_file(harness.REPO / model.path))
    log_dir = Path(args.log_dir) if args.log_dir else None
    entry: dict[str, Any] = {"path": model.path, "title": model.title, "libraries": list(model.libraries),
                             "busy_seconds": args.busy_seconds, "scenarios": {}}
    try:
        if args.prepared:
            entry.update(use_prepared(Path(args.prepared) / name, tmp))
            model_run.signing_key = str(tmp / "key")
        else:
            sweep_args = Namespace(timeout=args.sweep_timeout, batch_size=None, sweep_arg=None)
            entry["sweep"] = compile_time.run_sweep(model_run, sweep_args, log_dir / f"{name}-sweep.log"
                                                    if log_dir else None)
        if (entry.get("sweep") or {}).get("status") != "ok":
            return entry
        cell = Cell(name, tmp, cache_url, model_run.signing_key, args)
        if not args.prepared:
            entry["floor_save"] = saved = cell.run("floor-save", 0)
            log.info("%s: floor-save %s %s", name, saved.get("status"), saved.get("error") or "")
        if args.prepare_only:
            save_prepared(entry, tmp, model_run.signing_key, Path(args.prepare_only) / name)
            return entry
        timed = (*TIMED, *((BASELINE,) if args.baseline else ()))
        processes: dict[str, list[dict[str, Any]]] = {}
        for repeat in range(args.processes):  # taking turns: a drift of the machine's speed falls on all alike
            for scenario in timed:
                result = cell.run(scenario, repeat)
                processes.setdefault(scenario, []).append(result)
                log.info("%s: %s, process %d: %s %s", name, scenario, repeat + 1, result.get("status"),
                         result.get("error") or fmt(result.get("whole_process_s")))
                _summarise_cells(entry, processes)
                save(entry)
    finally:
        if not args.keep_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return entry


PREPARED_FILES = ("cache.db", "key.pub", "floor.megacache", "prepared.json")


def save_prepared(entry: dict[str, Any], tmp: Path, key: str | None, folder: Path) -> None:
    """``--prepare-only``: what a later ``--prepared`` call needs (the swept cache, the public key
    its artifacts are signed with, the floor's blob, the sweep's and floor-save's results), so a
    model whose sweep and timing do not fit one device call is split over two."""
    folder.mkdir(parents=True, exist_ok=True)
    harness.copy_sqlite(tmp / "cache.db", folder / "cache.db")
    if key:
        shutil.copyfile(key + ".pub", folder / "key.pub")
    shutil.copyfile(tmp / "floor.megacache", folder / "floor.megacache")
    kept = {k: entry[k] for k in ("sweep", "floor_save") if k in entry}
    (folder / "prepared.json").write_text(json.dumps(kept, indent=1))


def use_prepared(folder: Path, tmp: Path) -> dict[str, Any]:
    """``--prepared``: a ``--prepare-only`` call's files copied into ``tmp``; its sweep's results."""
    absent = [name for name in PREPARED_FILES if not (folder / name).is_file()]
    if absent:
        raise SystemExit(f"--prepared: {folder} lacks {', '.join(absent)}; make it with --prepare-only")
    harness.copy_sqlite(folder / "cache.db", tmp / "cache.db")  # the timed processes may write back: a copy
    shutil.copyfile(folder / "key.pub", tmp / "key.pub")
    shutil.copyfile(folder / "floor.megacache", tmp / "floor.megacache")
    kept = json.loads((folder / "prepared.json").read_text())
    return {**kept, "prepared": str(folder)}


def _summarise_cells(entry: dict[str, Any], processes: dict[str, list[dict[str, Any]]]) -> None:
    entry["scenarios"] = {scenario: summarise(results) for scenario, results in processes.items()}
    entry["vs_floor"] = vs_floor(entry["scenarios"])


def from_logs(name: str, log_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A model's entry and the machine it ran on, rebuilt from a run's children's logs
    (``--log-dir``): for a command cut short before it saved, every process it finished."""
    model = MODELS[name]
    entry: dict[str, Any] = {"path": model.path, "title": model.title, "libraries": list(model.libraries),
                             "scenarios": {}, "rebuilt_from_logs": True}
    sweep = _log_payload(log_dir / f"{name}-sweep.log", json_stdout=True)
    env = (sweep or {}).get("environment") or {}
    machine = {"gpu": env.get("device_name"), "torch": env.get("torch_version"), "triton": env.get("triton_version"),
               "cuda": env.get("cuda_version")}
    processes: dict[str, list[dict[str, Any]]] = {}
    for scenario in (*TIMED, BASELINE):
        logs = [p for p in log_dir.glob(f"{name}-{scenario}-*.log") if p.stem.rsplit("-", 1)[1].isdigit()
                and p.stem.rsplit("-", 1)[0] == f"{name}-{scenario}"]
        for log_path in sorted(logs, key=lambda p: int(p.stem.rsplit("-", 1)[1])):
            result = _log_payload(log_path) or {"status": "error", "error": f"no result line in {log_path.name}"}
            processes.setdefault(scenario, []).append({**result, "scenario": scenario})
    busy = {r.get("busy_seconds") for results in processes.values() for r in results} - {None}
    entry["busy_seconds"] = busy.pop() if len(busy) == 1 else None
    _summarise_cells(entry, processes)
    return entry, machine


def _log_payload(path: Path, json_stdout: bool = False) -> dict[str, Any] | None:
    """A child's result line (or, for the sweep, its JSON stdout) from its log file."""
    if not path.exists():
        return None
    text = path.read_text(errors="replace")
    stdout = text.split("--- stdout", 1)[-1].split("--- stderr", 1)[0]
    if not json_stdout:
        return harness.marker_payload(stdout)
    try:
        found = json.loads(stdout)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell: its good processes' median, min and max of each timing, every process's figures,
    the most benchmarks any process ran, and the first error."""
    good = [r for r in results if r.get("status") == "ok"]
    cell: dict[str, Any] = {"status": "ok" if good else results[0].get("status", "error"), "samples": len(good),
                            "failed": len(results) - len(good),
                            "benchmarks": max((r.get("benchmarks") or 0 for r in good), default=None),
                            "processes": [{k: r[k] for k in (*TIMINGS, *PROCESS_DETAILS, "status", "error")
                                           if k in r} for r in results]}
    for key in TIMINGS:
        values = [float(r[key]) for r in good]
        if values:
            cell[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    bad = next((r for r in results if r.get("status") != "ok"), None)
    if bad is not None:
        cell["error"] = bad.get("error")
        cell["stderr_tail"] = bad.get("stderr_tail")
    if good:
        cell["first_call_phases"] = good[0].get("first_call_phases")
        cell["mode"] = good[0].get("mode")
    return cell


def median_of(scenarios: dict[str, Any], scenario: str, key: str) -> float | None:
    found = (scenarios.get(scenario) or {}).get(key)
    return found.get("median") if isinstance(found, dict) else None


def vs_floor(scenarios: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Each scenario's medians against the floor's, from this run's processes."""
    return {scenario: {key: ratio(median_of(scenarios, scenario, key), median_of(scenarios, "floor", key))
                       for key in TIMINGS} for scenario in scenarios if scenario != "floor"}


def spread(cell: dict[str, Any], key: str) -> str:
    """``median (min-max)`` of a cell's timing, in seconds."""
    found = cell.get(key)
    if not isinstance(found, dict):
        return cell.get("status") or "-"
    return f"{found['median']:.1f} ({found['min']:.1f}-{found['max']:.1f})"


# Each child's timed phases, in the script's order; the rest of a whole process is the
# interpreter's start and exit.
PHASES = {"imports_s": "imports", "setup_s": "set-up call", "model_build_s": "model build",
          "busy_s": "CPU work", "first_call_s": "compile + first call"}


def phase_rows(scenarios: dict[str, Any]) -> list[list[str]]:
    """Per scenario, the median of each phase over its processes that finished."""
    rows = []
    for scenario, cell in scenarios.items():
        done = [p for p in cell.get("processes") or () if p.get("status") == "ok"]
        medians = [statistics.median(p[key] for p in done) if done and all(key in p for p in done) else None
                   for key in PHASES]
        counts = [p["modules"] for p in done if isinstance(p.get("modules"), dict)]
        imported = (f"{statistics.median(c['set_up'] for c in counts):.0f} / "
                    f"{statistics.median(c['after_set_up'] for c in counts):.0f}") if counts else "-"
        rows.append([scenario, *(fmt(value, ".2f") for value in medians), imported])
    return rows


def render(run: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for name, entry in (run.get("models") or {}).items():
        scenarios = entry.get("scenarios") or {}
        ratios = entry.get("vs_floor") or {}
        rows = [[scenario, cell.get("samples", 0), spread(cell, "whole_process_s"), spread(cell, "first_call_s"),
                 fmt((ratios.get(scenario) or {}).get("whole_process_s"), ".2f"),
                 fmt((ratios.get(scenario) or {}).get("first_call_s"), ".2f"), cell.get("benchmarks", "-")]
                for scenario, cell in scenarios.items()]
        lines += [f"### {name}: {entry.get('title') or ''} (`{entry.get('path')}`)", ""]
        if entry.get("skipped"):
            lines += [f"- {entry['skipped']}", ""]
            continue
        lines += harness.table(["scenario", "processes", "whole process s, median (min-max)",
                                "first call s, median (min-max)", "whole vs floor", "first call vs floor",
                                "benchmarks"], rows)
        lines += ["", "Where the whole process goes (median seconds of each phase, in the script's order):", "",
                  *harness.table(["scenario", *PHASES.values(), "modules imported: set-up / after"],
                                 phase_rows(scenarios))]
        lines += ["", f"- {entry.get('busy_seconds', 0):g} s of Python CPU work after the model's build; "
                  f"libraries imported at the top: {', '.join(entry.get('libraries') or ()) or 'none'}"]
        sweep = entry.get("sweep") or {}
        if sweep.get("status") == "ok":
            lines.append(f"- sweep {fmt(sweep.get('wall_s'))} s: {sweep.get('tuned')} tuned, "
                         f"{sweep.get('found')} found" + ("; swept, and the floor's blob saved, by an earlier "
                                                         "call (--prepare-only)" if entry.get("prepared") else ""))
        elif sweep:
            lines.append(f"- sweep failed: {(sweep.get('error') or '')[:200]}")
        for scenario, cell in scenarios.items():
            if cell.get("error"):
                lines.append(f"- {scenario}: {cell.get('failed')} process(es) failed: {str(cell['error'])[:200]}")
        lines.append("")
    return lines


def results(out: Path) -> harness.Results:
    return harness.Results(out, "startup", "Startup: what a user waits for, floor, default and warm start", render)


def benchmark(args: argparse.Namespace) -> int:
    chosen = args.models or ",".join(QUICK_MODELS if args.quick else DEFAULT_MODELS)
    names = [name.strip() for name in chosen.split(",") if name.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    harness.warm_bytecode()
    if args.prepare_only:
        return prepare_only(names, args)
    info = harness.machine(min(args.timeout, 300))
    gpu = harness.slug(info.get("gpu") or "cpu")
    store = results(Path(args.out))
    command = "python -m benchmarks.startup " + " ".join(args.argv)
    run = store.run(args.label or f"{gpu}: {','.join(names)}", info, command)
    run.update(processes=args.processes, busy_seconds=args.busy_seconds, models={})
    if args.note:
        run["note"] = args.note
    for name in names:
        reason = missing_library(name)
        if reason:
            print(reason, file=sys.stderr)
            run["models"][name] = {"path": MODELS[name].path, "title": MODELS[name].title, "skipped": reason}
        else:
            run["models"][name] = measure_model(name, args, functools.partial(_save_model, store, run, name))
        store.save()
    print(store.path.with_suffix(".md").read_text())
    cells = [c for entry in run["models"].values() for c in (entry.get("scenarios") or {}).values()]
    return 0 if cells and all(c.get("failed") == 0 for c in cells) else 1


def prepare_only(names: list[str], args: argparse.Namespace) -> int:
    """``--prepare-only``: each model swept and its floor's blob saved, nothing timed or recorded."""
    ready = 0
    for name in names:
        entry = measure_model(name, args)
        sweep, saved = entry.get("sweep") or {}, entry.get("floor_save") or {}
        ok = sweep.get("status") == "ok" and saved.get("status") == "ok"
        ready += ok
        print(f"{name}: {'prepared in ' + str(Path(args.prepare_only) / name) if ok else 'not prepared'}; "
              f"sweep {sweep.get('status')} {fmt(sweep.get('wall_s'))} s, floor-save {saved.get('status')}")
    return 0 if ready == len(names) else 1


def _save_model(store: harness.Results, run: dict[str, Any], name: str, entry: dict[str, Any]) -> None:
    run["models"][name] = entry
    store.save()  # after every process: a cut command loses nothing it finished


def rebuild(args: argparse.Namespace) -> int:
    """``--from-logs DIR``: the run of a command cut short, from its children's logs, measured
    on the code this tree holds (run it at the commit the device ran)."""
    names = [name.strip() for name in (args.models or "").split(",") if name.strip()]
    unknown = [n for n in names if n not in MODELS]
    if not names or unknown:
        raise SystemExit(f"--from-logs needs --models, of {', '.join(MODELS)}")
    store = results(Path(args.out))
    models, machines = {}, []
    for name in names:
        models[name], found = from_logs(name, Path(args.from_logs))
        machines.append(found)
    if any(m != machines[0] for m in machines):
        raise SystemExit("--from-logs: the models' logs name different machines")
    label = args.label or f"{harness.slug(machines[0].get('gpu') or 'cpu')}: {','.join(names)}"
    run = store.run(label, machines[0], "python -m benchmarks.startup " + " ".join(args.argv))
    _date_and_code_of_the_logs(store, run, Path(args.from_logs))
    samples = {cell.get("samples") for entry in models.values() for cell in entry["scenarios"].values()}
    run.update(processes=max(samples - {None}, default=0), busy_seconds=args.busy_seconds, models=models,
               note=args.note or "rebuilt from the children's logs of a command cut short (--from-logs)")
    store.save()
    print(store.path.with_suffix(".md").read_text())
    return 0


def _date_and_code_of_the_logs(store: harness.Results, run: dict[str, Any], log_dir: Path) -> None:
    """The run's date is its newest log's; its code is the stamp the device's copy carried
    (``benchmarks/code_stamp.json``, written by ``harness stamp`` before the copy), not this tree's."""
    newest = max(p.stat().st_mtime for p in log_dir.glob("*.log"))
    run["date"] = datetime.fromtimestamp(newest, timezone.utc).isoformat(timespec="seconds")
    if harness.STAMP.exists():
        run["commit"] = json.loads(harness.STAMP.read_text())["commit"]
        store.codes = [(r, c) for r, c in store.codes if r is not run]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=None, help=f"comma-separated, of {', '.join(MODELS)} "
                        f"(default {','.join(DEFAULT_MODELS)}; with --quick {','.join(QUICK_MODELS)})")
    parser.add_argument("--quick", action="store_true", help="the small model only (the CPU smoke run)")
    parser.add_argument("--busy-seconds", type=float, default=5.0,
                        help="seconds of Python CPU work between the model's build and the compile (default 5)")
    harness.output_options(parser, "startup", "device and models", timeout=600.0)
    parser.add_argument("--sweep-timeout", type=float, default=420.0, metavar="S",
                        help="seconds for each model's sweep, which its scenarios need (default %(default)s)")
    parser.add_argument("--processes", type=int, default=3, metavar="N",
                        help="processes per timed scenario, taking turns (default 3)")
    parser.add_argument("--log-dir", default=None, help="write each child's output here")
    parser.add_argument("--baseline", default=None, metavar="DIR",
                        help="another version's code (bash benchmarks/baseline_code.sh COMMIT DIR): its warm-start "
                             "scenario takes turns with this code's, labelled baseline")
    parser.add_argument("--note", default=None, help="a line the results print under the run's heading")
    parser.add_argument("--keep-tmp", action="store_true", help="keep each model's caches")
    parser.add_argument("--prepare-only", default=None, metavar="DIR",
                        help="sweep and save the floor's blob, time nothing: each model's files go to DIR/MODEL "
                             "for a later --prepared (a model whose sweep and timing do not fit one call)")
    parser.add_argument("--prepared", default=None, metavar="DIR",
                        help="time each model from DIR/MODEL, made by --prepare-only: no sweep, no floor-save")
    parser.add_argument("--from-logs", default=None, metavar="DIR",
                        help="run nothing: rebuild a cut command's run of --models from its --log-dir")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def _child_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="startup _child")
    parser.add_argument("--model", required=True)
    parser.add_argument("--scenario", required=True, choices=("floor-save", *TIMED))
    parser.add_argument("--library", action="append", default=[])
    parser.add_argument("--busy-seconds", type=float, default=0.0)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--megacache", required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_child"]:
        return child(_child_parser().parse_args(argv[1:]))
    args = build_parser().parse_args(argv)
    args.argv = argv
    harness.log_to_stderr(args.verbose)
    if args.busy_seconds < 0 or args.timeout <= 0 or args.sweep_timeout <= 0 or args.processes < 1:
        raise SystemExit("--busy-seconds must be 0 or more, --timeout, --sweep-timeout and --processes positive")
    if args.from_logs:
        return rebuild(args)
    if args.prepare_only and args.prepared:
        raise SystemExit("--prepare-only and --prepared: one call prepares, a later one times; give one of them")
    if args.baseline:  # checked once, before any sweep: a wrong folder fails at once
        args.baseline = baseline_folder(args.baseline)
    return benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
