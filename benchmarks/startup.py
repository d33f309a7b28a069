"""The prefetching warm start against the floor and today's warm start, in one run.

    python -m benchmarks.prefetch                      # GPU: resnet, gpt, lm_train, mlp
    python -m benchmarks.prefetch --models resnet      # one model (each under ~3 minutes on an H100)
    python -m benchmarks.prefetch --quick              # CPU: the small model only

Per model it sweeps once with a signing key, then runs each scenario in a fresh process with
fresh Inductor and Triton caches:

- ``default``: a plain default-mode compile (the ratios' reference);
- ``floor-save``: a default compile with Dynamo's ``caching_precompile`` on that saves its
  Mega-cache (not timed against the others: it makes the floor's file);
- ``floor``: ``caching_precompile`` on and ``torch.compiler.load_cache_artifacts`` at the
  script's top, then a default compile;
- ``warm-start``: ``autotune.warm_start()`` at the top with ``AUTOTUNE_PREFETCH=0`` (today's);
- ``prefetch``: the same with the prefetch on;
- ``baseline`` (with ``--baseline DIR``): ``prefetch`` run from another version's code, made by
  ``bash benchmarks/baseline_code.sh COMMIT``, so that a change is timed against the code
  before it in one run.

The last three run with 0 s and with 5 s (``--build-seconds``) of model building between the
set-up call and the compile: the model is built, then the process sleeps for the rest. Each
records the first call (the compile call to the first result; a training model's whole first
step: forward, backward, optimizer) and the whole process (its start to the first result).
With ``--processes N`` each of them runs in N fresh processes, taking turns, and its figures are
the medians. With PREFETCH_PROFILE_DIR set, each child also writes its first call's cProfile there;
with PREFETCH_SAMPLE_DIR, its threads' stacks up to its first result (benchmarks/thread_samples.py).
"""

from __future__ import annotations

import argparse
import cProfile
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
from pathlib import Path
from typing import Any

from benchmarks import harness, thread_samples
from benchmarks.harness import fmt, ratio

log = logging.getLogger("prefetch")

MODELS: dict[str, str] = {"resnet": "examples/resnet.py", "gpt": "examples/gpt.py",
                          "lm_train": "examples/lm_train.py", "mlp": "examples/mlp.py",
                          "experts": "examples/experts.py"}  # Linear layers and bmm, freezing on: CPU only
DEFAULT_MODELS = ("resnet", "gpt", "lm_train", "mlp")  # a conv net, a transformer, a training step, a small model
QUICK_MODELS = ("mlp",)
TIMED = ("floor", "warm-start", "prefetch")
BASELINE = "baseline"  # --baseline DIR: the prefetch scenario with another version's code
BASELINE_COMMIT = "BASELINE_COMMIT"  # the file in DIR naming its commit (benchmarks/baseline_code.sh)
SPAWNED_ENV = "PREFETCH_BENCH_SPAWNED_AT"  # the parent's wall clock when it started the child
PROFILE_ENV = "PREFETCH_PROFILE_DIR"  # set: each child writes its first call's cProfile here
SAMPLE_ENV = "PREFETCH_SAMPLE_DIR"  # set: each child writes its threads' stacks up to its first result here
FIRST_CALL_GOAL = 0.5  # with model building: the prefetch's first call <= 0.5x the floor's
WHOLE_GOAL = 0.8  # and its whole process <= 0.8x the floor's
DEFAULT_GOAL = 0.2  # conv net and transformer: first call <= 0.2x default mode's
PHASES_KEPT = 12  # each first call's longest compile phases kept in the results
PHASES_SHOWN = ("floor +5s", "warm-start +5s", "prefetch +5s")  # whose phases the Markdown lists
TIMINGS = ("first_call_s", "whole_process_s")  # per process; with --processes N, the medians of N
PROCESS_DETAILS = ("setup_s", "model_build_s", "hook")  # kept for each process too: where its time went


# --------------------------------------------------------------------------- the child


def child(args: argparse.Namespace) -> int:
    """One scenario in this fresh process; one result line."""
    result: dict[str, Any] = {"scenario": args.scenario, "build_s": args.build_seconds, "status": "error"}
    try:
        _child_run(args, result)
        result["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 - the parent gets the error, whatever it is
        result["error"] = f"{type(exc).__name__}: {exc}"
    harness.emit(result)
    return 0 if result["status"] == "ok" else 1


def _child_run(args: argparse.Namespace, result: dict[str, Any]) -> None:
    spawned = float(os.environ.get(SPAWNED_ENV) or time.time())
    began = time.perf_counter()
    sampler = thread_samples.Sampler(began) if os.environ.get(SAMPLE_ENV) else None
    handle = _set_up(args)
    import torch

    from benchmarks import compile_time

    result["setup_s"] = time.perf_counter() - began
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    building = time.perf_counter()
    prepared = compile_time._prepare(args.model, None, "cuda" if cuda else "cpu", None)
    if cuda:
        torch.ones(1, device="cuda").sum().item()  # the CUDA context is part of building the model
    result["model_build_s"] = time.perf_counter() - building
    time.sleep(max(0.0, args.build_seconds - result["model_build_s"]))
    mode = "max-autotune" if handle is not None else "default"
    options = Namespace(dynamic=None, optimizer_step="compiled")
    result["threads_at_first_call"] = sorted(t.name for t in threading.enumerate())  # what still runs beside it
    profiler = cProfile.Profile() if os.environ.get(PROFILE_ENV) else None
    with torch.no_grad() if prepared.train_step is None else torch.enable_grad():
        start = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        work = compile_time._compile_workload(prepared, mode, options)
        if cuda and mode == "max-autotune":  # it replays CUDA graphs: the step is a new one (a training step's
            torch.compiler.cudagraph_mark_step_begin()  # outputs would be overwritten within it otherwise)
        work(prepared.inputs)
        sync()
        result["first_call_s"] = time.perf_counter() - start
    if profiler is not None:
        profiler.disable()
        _write_profile(profiler, Path(os.environ[PROFILE_ENV]) / f"{Path(args.model).stem}-{args.scenario}-"
                       f"{args.build_seconds:g}.txt")
    result["whole_process_s"] = time.time() - spawned
    if sampler is not None:
        sampler.stop(Path(os.environ[SAMPLE_ENV]) / f"{Path(args.model).stem}-{args.scenario}-"
                     f"{args.build_seconds:g}-{os.getpid()}.json")
    result["first_call_phases"] = _longest_phases()
    result.update(device="cuda" if cuda else "cpu", mode=mode, train=prepared.train_step is not None)
    _after(args, result, handle)


def _longest_phases() -> dict[str, float]:
    """The first call's longest phases as torch times them (nothing compiles before it): where a
    warm first call goes, at no cost to its timing, unlike a profile."""
    from autotune.pointwise import compile_phase_totals, longest_phases

    return longest_phases({}, compile_phase_totals(), top=PHASES_KEPT)


def _write_profile(profiler: cProfile.Profile, path: Path) -> None:
    """The first call's profile (its thread only), by cumulative and by own time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for order, top in (("cumulative", 80), ("tottime", 40)):
            pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(top)


def _set_up(args: argparse.Namespace) -> Any:
    """The script's top: the floor's Mega-cache load, or the warm start. Returns the hook's handle."""
    if args.scenario in ("warm-start", "prefetch"):
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
                                                 "prefetched_rows", "prefetched_artifacts", "prefetch_s",
                                                 "prefetch_waits", "prefetch_wait_s", "store_wait_s",
                                                 "install_s", "prewarm_s", "passes_prewarmed",
                                                 "install_wait_s", "import_wait_s")}
    if args.scenario == "floor-save":
        import torch

        saved = torch.compiler.save_cache_artifacts()
        data = saved[0] if saved is not None else b""
        Path(args.megacache).write_bytes(data)
        result["megacache_bytes"] = len(data)


# -------------------------------------------------------------------------- the parent


def run_child(scenario: str, build_s: float, model: str, tmp: Path, cache_url: str, key: str | None,
              timeout: float, log_dir: Path | None, repeat: int = 0, baseline: Path | None = None) -> dict[str, Any]:
    """One scenario in a fresh process; ``repeat`` > 0: another process of it, with caches of its own."""
    megacache = tmp / "floor.megacache"
    code, runs_as = _code_for(scenario, baseline)
    cmd = [sys.executable, "-m", "benchmarks.prefetch", "_child", "--model", model, "--scenario", runs_as,
           "--build-seconds", str(build_s), "--cache", cache_url, "--megacache", str(megacache)]
    suffix = f"-repeat{repeat}" if repeat else ""
    env = harness.child_env(tmp / f"{scenario}-{build_s:g}{suffix}", cache_url, code)
    if runs_as in ("warm-start", "prefetch"):
        env["AUTOTUNE_PREFETCH"] = "1" if runs_as == "prefetch" else "0"
        if key:
            env["AUTOTUNE_TRUSTED_KEYS"] = key + ".pub"
    env[SPAWNED_ENV] = repr(time.time())
    log_path = log_dir / f"{Path(model).stem}-{scenario}-{build_s:g}{suffix}.log" if log_dir else None
    done = harness.run(cmd, env, timeout, log_path, cwd=code)
    payload = harness.marker_payload(done.stdout) or {"status": "error", "error": f"no result line (rc {done.rc})"}
    payload["scenario"] = scenario  # a baseline process ran the prefetch scenario
    if done.rc is None:
        payload.update(status="timeout", error=f"timed out after {timeout:.0f} s")
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
    return baseline, "prefetch"


def baseline_folder(path: str) -> Path:
    """``--baseline``'s folder, checked: one line naming the problem and the fix otherwise."""
    folder = Path(path).resolve()
    if not (folder / "autotune" / "__init__.py").is_file() or not (folder / "benchmarks" / "prefetch.py").is_file():
        raise SystemExit(f"--baseline {path}: no autotune package and benchmarks there; make one with "
                         f"`bash benchmarks/baseline_code.sh COMMIT {path}`")
    return folder


def baseline_name(folder: Path) -> str:
    named = folder / BASELINE_COMMIT
    return named.read_text().strip() if named.is_file() else folder.name


def measure_model(name: str, path: str, args: argparse.Namespace, builds: list[float]) -> dict[str, Any]:
    from benchmarks import compile_time

    tmp = Path(tempfile.mkdtemp(prefix=f"prefetch_{name}_"))
    cache_url = f"sqlite:///{tmp / 'cache.db'}"
    model_run = compile_time.ModelRun(name, path, [compile_time.ARTIFACTS], tmp, cache_url,
                                      train=compile_time.is_training_file(harness.REPO / path))
    log_dir = Path(args.log_dir) if args.log_dir else None
    entry: dict[str, Any] = {"path": path, "scenarios": {}}
    try:
        sweep_args = Namespace(timeout=args.timeout, batch_size=None, sweep_arg=None)
        entry["sweep"] = sweep = compile_time.run_sweep(model_run, sweep_args, log_dir / f"{name}-sweep.log"
                                                        if log_dir else None)
        if sweep.get("status") != "ok":
            return entry
        baseline: Path | None = args.baseline
        timed = [(s, b) for b in builds for s in (*TIMED, *((BASELINE,) if baseline else ()))]
        # The timed scenarios' processes take turns: a drift of the machine's speed falls on all alike.
        plan = [("default", 0.0, 0), ("floor-save", 0.0, 0)] + [
            (s, b, repeat) for repeat in range(args.processes) for s, b in timed]
        processes: dict[str, list[dict[str, Any]]] = {}
        for scenario, build_s, repeat in plan:
            log.info("%s: %s, %g s of model building, process %d ...", name, scenario, build_s, repeat + 1)
            result = run_child(scenario, build_s, path, tmp, cache_url, model_run.signing_key, args.timeout,
                               log_dir, repeat, baseline)
            processes.setdefault(label(scenario, build_s), []).append(result)
            log.info("%s: %s %s %s", name, scenario, result.get("status"), result.get("error") or "")
        entry["scenarios"] = {key: medians(results) for key, results in processes.items()}
        entry["goals"] = goals(entry["scenarios"], name, builds, baseline_name(baseline) if baseline else None)
    finally:
        if not args.keep_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return entry


def medians(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One scenario's processes as one result: the first good process's details, its two timings
    the medians of every good process's, its benchmarks the most any process ran, and each
    process's timings and set-up figures listed. One process is returned as it is."""
    good = [r for r in results if r.get("status") == "ok"]
    if len(results) == 1 or not good:
        return results[0]
    merged = {**good[0], "benchmarks": max(r.get("benchmarks") or 0 for r in good)}
    for key in TIMINGS:
        merged[key] = statistics.median(float(r[key]) for r in good)
    merged["processes"] = [{k: r[k] for k in (*TIMINGS, *PROCESS_DETAILS, "status", "error") if k in r} for r in results]
    return merged


def label(scenario: str, build_s: float) -> str:
    return scenario if scenario in ("default", "floor-save") else f"{scenario} +{build_s:g}s"


def _value(scenarios: dict[str, Any], name: str, key: str) -> Any:
    found = scenarios.get(name) or {}
    return found.get(key) if found.get("status") == "ok" else None


def goals(scenarios: dict[str, Any], model: str, builds: list[float], baseline: str | None = None) -> list[dict[str, Any]]:
    """Issue 53's goals, each with its value and whether it is met (None: not measured); with a
    baseline, this code's prefetch against the baseline code's, reported."""
    out: list[dict[str, Any]] = []

    def goal(text: str, value: float | None, limit: float | None) -> None:  # limit None: reported, not a goal
        out.append({"goal": text, "value": value, "met": None if value is None or limit is None else value <= limit})

    built = max(builds)
    if built > 0:
        goal(f"first call at +{built:g}s <= {FIRST_CALL_GOAL}x the floor's",
             ratio(_value(scenarios, label("prefetch", built), "first_call_s"),
                   _value(scenarios, label("floor", built), "first_call_s")), FIRST_CALL_GOAL)
        goal(f"whole process at +{built:g}s <= {WHOLE_GOAL}x the floor's",
             ratio(_value(scenarios, label("prefetch", built), "whole_process_s"),
                   _value(scenarios, label("floor", built), "whole_process_s")), WHOLE_GOAL)
    if 0.0 in builds:
        # With the install on a thread (AUTOTUNE_BACKGROUND_INSTALL=1) a compile called at once
        # waits for it inside the first call: the set-up moved there from before it, so the time
        # to the first result, the whole process, is what must not be slower than today's.
        goal("whole process at +0s <= today's warm start",
             ratio(_value(scenarios, label("prefetch", 0.0), "whole_process_s"),
                   _value(scenarios, label("warm-start", 0.0), "whole_process_s")), 1.0)
        goal("first call at +0s vs today's warm start (holds the install on a thread)",
             ratio(_value(scenarios, label("prefetch", 0.0), "first_call_s"),
                   _value(scenarios, label("warm-start", 0.0), "first_call_s")), None)
    for build in builds if baseline else ():
        goal(f"whole process at +{build:g}s vs the baseline code's ({baseline})",
             ratio(_value(scenarios, label("prefetch", build), "whole_process_s"),
                   _value(scenarios, label(BASELINE, build), "whole_process_s")), None)
    if model in ("resnet", "gpt"):
        goal(f"first call at +{built:g}s <= {DEFAULT_GOAL}x default mode's",
             ratio(_value(scenarios, label("prefetch", built), "first_call_s"),
                   _value(scenarios, "default", "first_call_s")), DEFAULT_GOAL)
    return out


def render(run: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for name, entry in (run.get("models") or {}).items():
        scenarios = entry.get("scenarios") or {}
        default = _value(scenarios, "default", "first_call_s")
        rows = []
        for key, r in scenarios.items():
            floor_key = (key.replace(r.get("scenario", ""), "floor", 1)
                         if key.startswith(("warm", "prefetch", BASELINE)) else key)
            floor = scenarios.get(floor_key) if floor_key != key else None
            hook = r.get("hook") or {}
            ok = r.get("status") == "ok"
            rows.append([key, fmt(r.get("first_call_s")) if ok else r.get("status"), fmt(r.get("whole_process_s")),
                         fmt(ratio(r.get("first_call_s"), (floor or {}).get("first_call_s")), ".2f"),
                         fmt(ratio(r.get("whole_process_s"), (floor or {}).get("whole_process_s")), ".2f"),
                         fmt(ratio(r.get("first_call_s"), default), ".2f"), r.get("benchmarks", "-"),
                         f"{hook.get('prefetched_rows', '-')}/{hook.get('prefetched_artifacts', '-')}",
                         f"{hook.get('prefetch_waits', '-')} ({fmt(hook.get('prefetch_wait_s'), '.2f')} s)"
                         if hook else "-"])
        lines += [f"### {name} (`{entry.get('path')}`)", ""]
        lines += harness.table(["scenario", "first call s", "whole process s", "first call vs floor",
                                "whole vs floor", "first call vs default", "benchmarks",
                                "prefetched rows/artifacts", "compile waited"], rows)
        lines.append("")
        for key in PHASES_SHOWN:
            phases = (scenarios.get(key) or {}).get("first_call_phases")
            if phases:
                shown = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in list(phases.items())[:6])
                lines.append(f"- {key}, the first call's longest phases (nested): {shown}")
        repeated = {key: r["processes"] for key, r in scenarios.items() if r.get("processes")}
        if repeated:
            spans = "; ".join(f"{key} {_span(runs, 'first_call_s')} / {_span(runs, 'whole_process_s')}"
                              for key, runs in repeated.items())
            lines.append(f"- medians of {max(map(len, repeated.values()))} fresh processes per timed scenario, each "
                         f"process's first call / whole process (fastest-slowest, s): {spans}")
        for other, whose in (("warm-start", "today's"), (BASELINE, "the baseline code's")):
            paired = paired_rounds(scenarios, label("prefetch", 0.0), label(other, 0.0), "whole_process_s")
            if paired is not None:
                lines.append(f"- whole process at +0s, the prefetch's process less {whose} in each round: slower in "
                             f"{paired['slower']} of {paired['rounds']} rounds, a mean difference of "
                             f"{paired['mean_s']:+.2f} s (95% interval {paired['low_s']:+.2f} to "
                             f"{paired['high_s']:+.2f} s)")
        for g in entry.get("goals") or ():
            verdict = {True: "met", False: "NOT met", None: "not measured" if g["value"] is None else "reported"}[g["met"]]
            lines.append(f"- {g['goal']}: {fmt(g['value'], '.2f')} ({verdict})")
        if (entry.get("sweep") or {}).get("status") not in (None, "ok"):
            lines.append(f"- sweep failed: {(entry['sweep'].get('error') or '')[:200]}")
        lines.append("")
    return lines


# Student's t at 97.5% by degrees of freedom (a 95% interval of a mean of few rounds); 1.96 past 30.
_T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18,
         15: 2.13, 20: 2.09, 30: 2.04}


def paired_rounds(scenarios: dict[str, Any], one: str, other: str, key: str) -> dict[str, Any] | None:
    """``one``'s timing less ``other``'s, round by round (their processes took turns, so each
    round shares the machine's state of the moment): how many rounds ``one`` was slower, the mean
    difference and its 95% interval. None with fewer than two rounds where both ran."""
    rounds = [(float(a[key]) - float(b[key])) for a, b in zip((scenarios.get(one) or {}).get("processes") or (),
                                                              (scenarios.get(other) or {}).get("processes") or ())
              if a.get("status") == "ok" and b.get("status") == "ok"]
    if len(rounds) < 2:
        return None
    mean = statistics.fmean(rounds)
    df = len(rounds) - 1
    t = next((value for limit, value in sorted(_T975.items()) if df <= limit), 1.96)
    half = t * statistics.stdev(rounds) / len(rounds) ** 0.5
    return {"rounds": len(rounds), "slower": sum(d > 0 for d in rounds), "mean_s": mean,
            "low_s": mean - half, "high_s": mean + half}


def _span(processes: list[dict[str, Any]], key: str) -> str:
    values = sorted(float(p[key]) for p in processes if p.get("status") == "ok")
    return f"{values[0]:.1f}-{values[-1]:.1f}" if values else "-"


def results(out: Path) -> harness.Results:
    return harness.Results(out, "prefetch", "Prefetch: the warm start against the floor, with model building", render)


def benchmark(args: argparse.Namespace) -> int:
    chosen = args.models or ",".join(QUICK_MODELS if args.quick else DEFAULT_MODELS)
    names = [name.strip() for name in chosen.split(",") if name.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    builds = [0.0, args.build_seconds]
    harness.warm_bytecode()
    info = harness.machine(min(args.timeout, 300))
    gpu = harness.slug(info.get("gpu") or "cpu")
    store = results(Path(args.out))
    command = "python -m benchmarks.prefetch " + " ".join(args.argv)
    run = store.run(args.label or f"{gpu}: {','.join(names)}", info, command)
    run["models"] = {}
    if args.note:
        run["note"] = args.note
    for name in names:
        run["models"][name] = measure_model(name, MODELS[name], args, builds)
        store.save()  # after every model: a cut command loses nothing
    print(store.path.with_suffix(".md").read_text())
    ran = [r for entry in run["models"].values() for r in entry["scenarios"].values()]
    return 0 if ran and all(r.get("status") == "ok" for r in ran) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prefetch", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=None, help=f"comma-separated, of {', '.join(MODELS)} "
                        f"(default {','.join(DEFAULT_MODELS)}; with --quick {','.join(QUICK_MODELS)})")
    parser.add_argument("--quick", action="store_true", help="the small model only (the CPU smoke run)")
    parser.add_argument("--build-seconds", type=float, default=5.0, help="model building, besides 0 (default 5)")
    harness.output_options(parser, "prefetch", "device and models", timeout=600.0)
    parser.add_argument("--processes", type=int, default=1, metavar="N",
                        help="fresh processes per timed scenario, taking turns; its figures are their medians "
                             "(default 1)")
    parser.add_argument("--log-dir", default=None, help="write each child's output here")
    parser.add_argument("--baseline", default=None, metavar="DIR",
                        help="another version's code (bash benchmarks/baseline_code.sh COMMIT DIR): its prefetch "
                             "scenario takes turns with this code's, labelled baseline")
    parser.add_argument("--note", default=None, help="a line the results print under the run's heading")
    parser.add_argument("--keep-tmp", action="store_true", help="keep each model's caches")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def _child_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prefetch _child")
    parser.add_argument("--model", required=True)
    parser.add_argument("--scenario", required=True, choices=("default", "floor-save", *TIMED))
    parser.add_argument("--build-seconds", type=float, default=0.0)
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
    if args.build_seconds <= 0 or args.timeout <= 0 or args.processes < 1:
        raise SystemExit("--build-seconds, --timeout and --processes must be positive")
    if args.baseline:  # checked once, before any sweep: a wrong folder fails at once
        args.baseline = baseline_folder(args.baseline)
    return benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
