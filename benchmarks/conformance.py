"""Model-zoo conformance: is every autotune request of a model captured, reproduced, tuned
and then hit, and does the warm start run as fast as cold max-autotune?

For each zoo model (``benchmarks/zoo.py``) and mode (``infer``; ``train``: one training step)
each step runs in fresh processes with fresh compile caches (``compile_time``'s children):
``sweep`` (at B, and 2B when ``auto`` is selected; then ``--dynamic`` at B when ``dynamic``
is: requests found, tuned, failed, ``key_mismatch``); per dynamic mode (``static``, ``auto``:
torch's default, recompiled at 2B, ``dynamic``: dynamic=True) ``warm`` (the hook's hits,
misses and benchmarks), and with ``--baselines`` ``default`` and ``cold`` max-autotune (the
ratios warm/default first call and warm/cold latency: summed GPU kernel time on CUDA, the
fastest call on a CPU). Each
of these compiles also reports its output's deviation from eager (max |compiled - eager| /
max |eager|; a training step's loss), ``benchmarks/deviation.py``.

The run goes to ``<out>/conformance.json`` (one run per GPU or ``cpu``) after every step; a
re-run with the same ``--out`` skips what is there, so several 10-minute device calls build one
table, and ``--budget`` starts no step that cannot finish. The parent never imports torch;
exit 0 when every selected step is done, 1 when some are left for a re-run, 2 for bad input.

    python -m benchmarks.conformance --models resnet50,vit_b_16 --out $OUT
    python -m benchmarks.conformance --subset cpu --out /tmp/conformance      # what CI runs
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import compile_time as ct
from benchmarks import harness, zoo
from benchmarks.harness import fmt

log = logging.getLogger("conformance")

DYNAMICS: dict[str, str] = {"static": "static", "auto": "auto", "dynamic": "true"}  # -> compile_time --dynamic
SCENARIOS: dict[str, str] = {"warm": "warm-start", "default": "default", "cold": "max-autotune-cold"}
TIMED_AGAIN = ("warm", "cold")  # the steps --latency-processes times in more processes: the latency ratio's
BASELINES = ("all", "static", "none")
# Seconds a step is assumed to take before this results file has timed one like it.
ESTIMATE_S: dict[str, dict[str, float]] = {"cuda": {"sweep": 240, "cold": 200, "default": 60, "warm": 60},
                                           "cpu": {"sweep": 120, "cold": 40, "default": 30, "warm": 30}}
LIBRARIES = ("torch", "torchvision", "transformers", "timm", "triton")
# The hook serves nothing after a lookup past AUTOTUNE_LOOKUP_TIMEOUT (2 s); a cold SQLite open on
# a loaded CI machine can take that long, which would measure the machine, not conformance.
LOOKUP_TIMEOUT_S = "30"
# One thread per child on a CPU: on a shared 2-core machine a parallel region waits for a
# descheduled thread, and the median latency swung between 0.3 and 136 ms from process to process.
CPU_THREADS = "1"
LATENCY_GOAL = 1.0 + ct.LATENCY_TOLERANCE
EXIT_INCOMPLETE, EXIT_BAD_INPUT = 1, 2
KEEP_KERNELS = 10


class BadInput(Exception):
    """One line for the user; exit status 2."""


@dataclass(frozen=True)
class Step:
    model: str
    mode: str
    kind: str  # sweep, warm, default or cold
    dynamic: str | None = None  # None for the sweep

    @property
    def key(self) -> str:
        return self.kind if self.dynamic is None else f"{self.kind}/{self.dynamic}"

    @property
    def name(self) -> str:
        return f"{self.model} {self.mode} {self.key}"


def plan(models: list[str], modes: list[str], dynamics: list[str], baselines: str) -> list[Step]:
    """Every step, in run order: per model and mode the sweep, then per dynamic mode the
    warm start and its baselines (a row is complete as early as possible)."""
    baseline_dynamics = {"all": dynamics, "static": ["static"], "none": []}[baselines]
    steps: list[Step] = []
    for model in models:
        for mode in (m for m in modes if m in zoo.ZOO[model].modes):
            steps.append(Step(model, mode, "sweep"))
            for dynamic in dict.fromkeys(dynamics + baseline_dynamics):
                if dynamic in dynamics:
                    steps.append(Step(model, mode, "warm", dynamic))
                if dynamic in baseline_dynamics:
                    steps += [Step(model, mode, "default", dynamic), Step(model, mode, "cold", dynamic)]
    return steps


@dataclass
class Run:
    """One invocation: its options, the results file and the budget clock."""

    args: argparse.Namespace
    device: str
    label: str  # "cpu" or the GPU's slug
    out: Path
    report: dict[str, Any]
    started: float
    steps_run: int = 0
    incomplete: int = 0

    @property
    def json_path(self) -> Path:
        return self.out / "conformance.json"

    @property
    def md_path(self) -> Path:
        return self.out / "conformance.md"

    @property
    def work(self) -> Path:
        """The per-model cache databases, kept so that a re-run can resume."""
        return self.out / f"conformance_{self.label}_work"

    def left_s(self) -> float:
        return self.args.budget - (time.monotonic() - self.started)

    def group(self, model: str, mode: str) -> dict[str, Any]:
        entry = self.report["models"].setdefault(model, {})
        return entry.setdefault("modes", {}).setdefault(mode, {"steps": {}})

    def cache_path(self, model: str, mode: str) -> Path:
        return self.work / f"{model}-{mode}.db"

    def save(self) -> None:
        """This run into ``<out>/conformance.json`` (beside other machines' runs) and its Markdown."""
        store = results(self.out)
        self.report["label"] = self.label
        store.data["runs"] = [r for r in store.data["runs"] if r.get("label") != self.label] + [self.report]
        store.save()


def _complete(result: dict[str, Any] | None) -> bool:
    return (result or {}).get("status") not in ("skipped", None)


def _done(run: Run, result: dict[str, Any] | None) -> bool:
    """Complete, and not a failure that --retry-errors asks to run again."""
    return _complete(result) and not (run.args.retry_errors and (result or {}).get("status") in ("error", "timeout"))


def _needs_run(run: Run, step: Step, planned: list[Step]) -> bool:
    steps = run.group(step.model, step.mode)["steps"]
    if step.kind != "sweep":
        return not _done(run, steps.get(step.key))
    if not _done(run, steps.get("sweep")):
        return True
    # Warm starts still to run need the sweep again without its database, or where it did not
    # capture what their dynamic modes need (2B for auto, --dynamic for dynamic).
    waiting = any(s.kind == "warm" and (s.model, s.mode) == (step.model, step.mode) and not _done(run, steps.get(s.key))
                  for s in planned)
    captured = steps["sweep"].get("batch_sizes") or []
    stale = not set(sweep_sizes(run, step.model)) <= set(captured) or (
        "dynamic" in run.args.dynamics and not steps["sweep"].get("dynamic"))
    return waiting and (stale or not run.cache_path(step.model, step.mode).exists())


def sweep_sizes(run: Run, model: str) -> list[int]:
    """B, and 2B when automatic dynamic is selected (its recompile runs at 2B)."""
    batch = zoo.ZOO[model].batch(run.device)
    return [batch, 2 * batch] if "auto" in run.args.dynamics else [batch]


def sweep_passes(run: Run, model: str) -> list[list[str]]:
    """The sweeps' arguments: the static graphs (and auto's recompile), then the graphs
    ``dynamic=True`` compiles at B, which only ``--dynamic`` captures."""
    passes = []
    if set(run.args.dynamics) & {"static", "auto"}:
        passes.append(["--batch-sizes", ",".join(map(str, sweep_sizes(run, model)))])
    if "dynamic" in run.args.dynamics:
        passes.append(["--dynamic", "--batch-sizes", str(zoo.ZOO[model].batch(run.device))])
    return passes


_SUMMED = ("found", "cached", "tuned", "failed", "wall_s", "process_wall_s", "sweep_wall_s", "capture_s",
           "startup_s", "tuning_s")


def merge_sweeps(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One sweep step from its passes: counts and seconds summed, the first pass not ok decides."""
    merged = dict(results[0])
    for result in results[1:]:
        for key in _SUMMED:
            if isinstance(result.get(key), (int, float)):
                merged[key] = (merged.get(key) or 0) + result[key]
        statuses = dict(merged.get("statuses") or {})
        for status, count in (result.get("statuses") or {}).items():
            statuses[status] = statuses.get(status, 0) + count
        merged["statuses"] = statuses
        merged["command"] = f"{merged.get('command', '')} && {result.get('command', '')}"
        if merged.get("status") == "ok" and result.get("status") != "ok":
            merged.update({k: v for k, v in result.items() if k not in _SUMMED and k not in ("statuses", "command")})
    return merged


def estimate_s(report: dict[str, Any], step: Step, device: str) -> float:
    """The longest like step of this model so far, else the median of other models', else a guess."""
    mine: list[float] = []
    others: list[float] = []
    for model, entry in report.get("models", {}).items():
        for group in entry.get("modes", {}).values():
            for key, result in group.get("steps", {}).items():
                seconds = result.get("process_wall_s")
                if key.split("/")[0] == step.kind and _complete(result) and isinstance(seconds, (int, float)):
                    (mine if model == step.model else others).append(float(seconds))
    if mine:
        return max(mine)
    return statistics.median(others) if others else float(ESTIMATE_S[device][step.kind])


def run_steps(run: Run, steps: list[Step]) -> None:
    for step in steps:
        entry = zoo.ZOO[step.model]
        model = run.report["models"].setdefault(step.model, {})
        model.update(library=entry.library, what=entry.what)
        if not entry.available():
            model.update(status="unavailable", reason=f"{entry.library} is not installed")
            continue
        model.update(status="available", reason=None)
        if not _needs_run(run, step, steps):
            continue
        _run_or_skip(run, step)
        run.save()  # after every step: a killed command loses nothing
    if not run.args.keep_caches:
        _drop_finished_caches(run, steps)
    run.save()


def _drop_finished_caches(run: Run, planned: list[Step]) -> None:
    """A sweep's database stays while warm starts of its group are to run (or run again), and
    when the sweep was cut at its deadline: --retry-errors goes on from what it tuned."""
    for model, mode in {(s.model, s.mode) for s in planned}:
        steps = run.group(model, mode)["steps"]
        if _sweep_was_cut(steps):
            continue
        if all(_done(run, steps.get(s.key)) for s in planned if s.kind == "warm" and (s.model, s.mode) == (model, mode)):
            for path in _cache_files(run.cache_path(model, mode)):
                path.unlink(missing_ok=True)


def _sweep_was_cut(steps: dict[str, Any]) -> bool:
    return (steps.get("sweep") or {}).get("status") == "timeout"


def _cache_files(cache: Path) -> tuple[Path, ...]:
    return cache, Path(f"{cache}-wal"), Path(f"{cache}-shm")


def _run_or_skip(run: Run, step: Step) -> None:
    group = run.group(step.model, step.mode)
    group["batch"] = zoo.ZOO[step.model].batch(run.device)
    sweep = group["steps"].get("sweep")
    if step.kind == "warm" and not _complete(sweep):
        _skip(run, step, "waits for the sweep")
        return
    if step.kind == "warm" and "found" not in sweep:  # nothing was tuned: a warm start would measure nothing
        group["steps"][step.key] = {"status": "error", "error": f"not run: the sweep failed ({one_line(sweep)})",
                                    "date": harness.now()}
        return
    repeats = run.args.latency_processes if step.kind in TIMED_AGAIN else 1
    left, need = run.left_s(), estimate_s(run.report, step, run.device) * repeats
    if run.steps_run and need > left:  # the first step of an invocation always starts
        _skip(run, step, f"budget: ~{need:.0f} s needed, {max(left, 0):.0f} s left")
        return
    timeout = max(1.0, min(run.args.timeout, left))
    log.info("%s (~%.0f s, %.0f s of budget left) ...", step.name, need, left)
    result = execute(run, step, timeout)
    run.steps_run += 1
    if result.get("status") == "timeout" and timeout < run.args.timeout and run.steps_run > 1:
        _skip(run, step, f"budget ran out {timeout:.0f} s into the step")
        return
    result["date"] = harness.now()
    group["steps"][step.key] = result
    log.info("%s: %s%s", step.name, result.get("status"), f" ({one_line(result)})" if one_line(result) else "")


def _skip(run: Run, step: Step, reason: str) -> None:
    log.info("%s: skipped, %s", step.name, reason)
    run.incomplete += 1
    steps = run.group(step.model, step.mode)["steps"]
    if not _done(run, steps.get(step.key)):  # a result kept is one a retry would not run again
        steps[step.key] = {"status": "skipped", "reason": reason, "date": harness.now()}


def execute(run: Run, step: Step, timeout: float) -> dict[str, Any]:
    """One step in fresh processes with fresh compile caches, through compile_time's children."""
    batch = zoo.ZOO[step.model].batch(run.device)
    cache = run.cache_path(step.model, step.mode)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"conformance_{step.model}_{step.mode}_"))
    stub = zoo.write_stub(step.model, step.mode, tmp)  # not in --out: the device tool brings back 8 files
    model_run = ct.ModelRun(step.model, str(stub), [step.kind], tmp, f"sqlite:///{cache}", train=step.mode == "train")
    options = argparse.Namespace(timeout=timeout, runs=run.args.runs, warmup=run.args.warmup, optimizer_step="compiled",
                                 batch_size=batch, kernel_profile=run.device == "cuda", deviation=True,
                                 dynamic=DYNAMICS.get(step.dynamic or ""), sweep_arg=None,
                                 latency_processes=run.args.latency_processes)
    log_path = (Path(run.args.log_dir) / f"{run.label}-{step.model}-{step.mode}-{step.key.replace('/', '-')}.log"
                if run.args.log_dir else None)
    try:
        if step.kind == "sweep":
            options.batch_size = None
            result = _sweep_step(run, step, model_run, options, log_path)
        else:
            result = ct.run_model_scenario(SCENARIOS[step.kind], model_run, options, log_path)
            if step.kind in TIMED_AGAIN:
                ct.more_processes(SCENARIOS[step.kind], model_run, options, result, log_path)
    except Exception as exc:  # noqa: BLE001 - a step that cannot even start is a result too
        log.exception("%s failed to run", step.name)
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _trim(result)


def _sweep_step(run: Run, step: Step, model_run: Any, options: argparse.Namespace,
                log_path: Path | None) -> dict[str, Any]:
    """The sweep's passes, each saved as it ends: a command killed in the second pass resumes there."""
    group = run.group(step.model, step.mode)
    cache = run.cache_path(step.model, step.mode)
    planned = sweep_passes(run, step.model)
    done: dict[str, Any] = group.setdefault("sweep_passes", {})
    if not cache.exists() or not set(done) <= {_pass_key(arg) for arg in planned}:
        done.clear()  # nothing to resume from: the passes start again on a fresh database
    # A sweep cut at its deadline kept what it tuned, its pass's kernel configs too: go on from it.
    resumed = cache.exists() and _sweep_was_cut(group["steps"])
    if not done and not resumed:
        for path in _cache_files(cache):
            path.unlink(missing_ok=True)  # a fresh database: every request tuned by this sweep
    passes, step_timeout, began = [], options.timeout, time.monotonic()
    for number, sweep_arg in enumerate(planned, 1):
        key = _pass_key(sweep_arg)
        if done.get(key, {}).get("status") == "ok":
            log.info("%s: pass %s already done", step.name, key)
            passes.append(done[key])
            continue
        # The step's time is the passes' together.
        options.sweep_arg, options.timeout = sweep_arg, max(1.0, step_timeout - (time.monotonic() - began))
        passes.append(_trim(_sweep_result(ct.run_sweep(model_run, options, _pass_log(log_path, number, planned)))))
        if passes[-1].get("status") != "ok":
            break  # a sweep that cannot run: the next would fail the same way
        done[key] = passes[-1]
        run.save()
    if len(passes) == len(planned) and all(p.get("status") == "ok" for p in passes):
        group.pop("sweep_passes", None)  # merged into the step's result below
    result = merge_sweeps(passes)
    if resumed:
        result["resumed"] = "went on from the database of a sweep cut at its deadline"
    result["batch_sizes"] = sweep_sizes(run, step.model)
    result["dynamic"] = "dynamic" in run.args.dynamics and len(passes) == len(planned)
    return result


def _pass_key(sweep_arg: list[str]) -> str:
    return " ".join(sweep_arg)


def _pass_log(log_path: Path | None, number: int, planned: list[list[str]]) -> Path | None:
    """Each pass of a sweep of several its own log (``...-sweep-2.log``)."""
    if log_path is None or len(planned) < 2:
        return log_path
    return log_path.with_name(f"{log_path.stem}-{number}{log_path.suffix}")


def _sweep_result(result: dict[str, Any]) -> dict[str, Any]:
    """A sweep that reported and exited 1 has failed requests: data (failed, key_mismatch), not a failed step."""
    if result.get("status") == "error" and result.get("rc") == 1 and "found" in result:
        result.update(status="ok", note=f"{result.pop('error')}: {result.get('failed')} requests failed")
    return result


def _trim(result: dict[str, Any]) -> dict[str, Any]:
    """What the table and a reader of the JSON need."""
    for key in ("compile_phases", "benchmarker_methods", "stdout_tail", "caching_precompile_traceback"):
        result.pop(key, None)
    if isinstance(result.get("kernels"), list):
        result["kernels"] = result["kernels"][:KEEP_KERNELS]
    if isinstance(result.get("stderr_tail"), str):
        result["stderr_tail"] = result["stderr_tail"][-1500:]
    return result


def one_line(result: dict[str, Any] | None) -> str:
    """A step's failure in one line: the CLI's ``Error:`` line or the exception, not "exited N"."""
    if not result or result.get("status") in ("ok", None):
        return ""
    if result.get("status") == "skipped":
        return f"skipped: {result.get('reason')}"
    lines = [ln.strip() for ln in str(result.get("stderr_tail") or "").splitlines() if ln.strip()]
    error = str(result.get("error") or result.get("status"))
    generic = error.startswith(("child exited", "sweep exited"))
    specific = [ln for ln in lines if ln.startswith("Error:")] or (
        [ln for ln in lines if "Error" in ln.split(":")[0]] if generic else [])
    text = f"{error}: {specific[-1]}" if specific else error
    return " ".join(text.split())[:300]


def _models(report: dict[str, Any]) -> list[str]:
    """The models in the results, in the zoo's order."""
    order = {name: i for i, name in enumerate(zoo.ZOO)}
    return sorted(report.get("models", {}), key=lambda m: (order.get(m, len(order)), m))


def _steps(report: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for model in _models(report):
        for mode, group in report["models"][model].get("modes", {}).items():
            yield model, mode, group


def rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per model x mode x dynamic mode in the results (an unavailable model: one row)."""
    out: list[dict[str, Any]] = []
    for model in _models(report):
        entry = report["models"][model]
        if entry.get("status") == "unavailable":
            out.append({"model": model, "library": entry.get("library"), "mode": "-", "dynamic": "-",
                        "status": "unavailable", "error": entry.get("reason")})
            continue
        for mode, group in entry.get("modes", {}).items():
            dynamics = [d for d in DYNAMICS if any(k.endswith("/" + d) and not k.startswith("sweep/")
                                                   for k in group["steps"])]
            out += [_row(entry, model, mode, dynamic, group) for dynamic in dynamics]
    return out


def _baseline(steps: dict[str, Any], kind: str, dynamic: str) -> tuple[dict[str, Any] | None, str]:
    """The baseline of ``kind`` in the same dynamic mode, else the static one (marked)."""
    own = steps.get(f"{kind}/{dynamic}")
    if own is not None or dynamic == "static":
        return own, dynamic
    return steps.get(f"{kind}/static"), "static"


def _ok(result: dict[str, Any] | None) -> dict[str, Any] | None:
    return result if result and result.get("status") == "ok" else None


def _row(entry: dict[str, Any], model: str, mode: str, dynamic: str, group: dict[str, Any]) -> dict[str, Any]:
    steps = group["steps"]
    # A merged results file may hold a sweep of this dynamic mode alone (see _merge_steps).
    sweep_key = f"sweep/{dynamic}" if f"sweep/{dynamic}" in steps else "sweep"
    sweep, warm = steps.get(sweep_key), steps.get(f"warm/{dynamic}")
    report = sweep if sweep and "found" in sweep else {}  # the sweep's JSON report, if it got that far
    default, default_basis = _baseline(steps, "default", dynamic)
    cold, cold_basis = _baseline(steps, "cold", dynamic)
    hook = (warm or {}).get("hook") or {}
    recompile = (warm or {}).get("recompile") or {}
    latency, latency_basis = ct.latency_ratio(_ok(warm), _ok(cold))
    parts = [r for r in (sweep, warm, default, cold) if r is not None]
    return {
        "model": model, "library": entry.get("library"), "mode": mode, "dynamic": dynamic, "batch": group.get("batch"),
        "sweep_key": sweep_key,
        "status": _row_status(sweep, warm, parts), "error": next((one_line(r) for r in parts if one_line(r)), ""),
        # Hits and benchmarks are judged when the sweep and the warm start ran, whatever the baselines did.
        "warm_ok": _row_status(sweep, warm, [r for r in (sweep, warm) if r is not None]) == "ok",
        "found": report.get("found"), "tuned": report.get("tuned"), "failed": report.get("failed"),
        "resumed": bool(report.get("resumed")), "cached": report.get("cached"),
        "pass_beside_capture": report.get("resumed_pass_s") is not None,
        "key_mismatch": (report.get("statuses") or {}).get("key_mismatch", 0) if report else None,
        "hits": hook.get("hits"), "misses": hook.get("misses"), "hook_errors": hook.get("errors"),
        # A hook without this stat predates the pass's fusion verdicts: its latency is the isolated winners'.
        "predates_verdicts": bool(_ok(warm)) and bool(hook) and "fusion_verdicts_served" not in hook,
        "missed": [m.get("request") for m in hook.get("missed") or []],
        "benchmarks": _warm_benchmarks(_ok(warm)),
        "first_ratio": harness.ratio((_ok(warm) or {}).get("first_call_s"), (_ok(default) or {}).get("first_call_s")),
        "latency_ratio": latency, "latency_basis": latency_basis if latency is not None else None,
        "default_basis": default_basis, "cold_basis": cold_basis, "recompile": recompile or None,
        "deviation": {kind: _deviation(r) for kind, r in (("default", default), ("cold", cold), ("warm", warm))},
        "deviation_random": any(((r or {}).get("deviation") or {}).get("random") for r in parts),
    }


def _deviation(result: dict[str, Any] | None) -> float | None:
    """A compile's output deviation from eager (benchmarks/deviation.py), None where not measured."""
    value = ((_ok(result) or {}).get("deviation") or {}).get("relative")
    return value if isinstance(value, (int, float)) else None


def _row_status(sweep: dict[str, Any] | None, warm: dict[str, Any] | None, parts: list[dict[str, Any]]) -> str:
    if sweep is None or warm is None or not all(_complete(r) for r in parts):
        return "incomplete"
    return "ok" if all(r.get("status") == "ok" for r in parts) else "error"


def _warm_benchmarks(warm: dict[str, Any] | None) -> dict[str, int] | None:
    """Every benchmark of the warm start's compiles: the first call's and auto's recompile's."""
    if not warm or not warm.get("bench"):
        return None
    total = dict(warm["bench"])
    for kind, count in ((warm.get("recompile") or {}).get("bench") or {}).items():
        total[kind] = total.get(kind, 0) + count
    return total


def goals(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """0 key_mismatch over every sweep; per dynamic mode 100% hits, 0 benchmarks and latency
    within 3% of cold max-autotune in the same dynamic mode."""
    measured = [r for r in table if r["status"] != "unavailable"]
    groups = {(r["model"], r["mode"]) for r in measured}
    sweeps = {(r["model"], r["mode"], r.get("sweep_key")): r for r in measured if r["key_mismatch"] is not None}
    mismatched = [f"{m} {mode}" for (m, mode, _), r in sweeps.items() if r["key_mismatch"]]
    total = sum(r["key_mismatch"] for r in sweeps.values())
    unswept = groups - {(m, mode) for m, mode, _ in sweeps}
    out = [_goal("0 key_mismatch", "every sweep", total,
                 f"{total} of {sum(r['found'] or 0 for r in sweeps.values())} requests in {len(sweeps)} sweeps",
                 [not r["key_mismatch"] for r in sweeps.values()], mismatched, len(unswept))]
    for dynamic in DYNAMICS:
        mine = [r for r in measured if r["dynamic"] == dynamic]
        if not mine:
            continue
        out.append(_row_goal("100% of requests hit at warm start", dynamic, mine, _hits_met))
        out.append(_row_goal("0 benchmarks at warm start", dynamic, mine, _bench_met))
        out.append(_row_goal(f"latency within {ct.LATENCY_TOLERANCE:.0%} of cold max-autotune", dynamic, mine,
                             _latency_met))
    return out


def _hits_met(r: dict[str, Any]) -> bool | None:
    if not r.get("warm_ok") or r["hits"] is None:
        return None
    return None if r["hits"] + r["misses"] == 0 else r["misses"] == 0 and not r["hook_errors"]


def _bench_met(r: dict[str, Any]) -> bool | None:
    return None if not r.get("warm_ok") or r["benchmarks"] is None else ct.benchmark_total(r["benchmarks"]) == 0


def _latency_met(r: dict[str, Any]) -> bool | None:
    if r["status"] != "ok" or r["latency_ratio"] is None or r["cold_basis"] != r["dynamic"]:
        return None  # against another dynamic mode's cold compile: shown, not judged
    return r["latency_ratio"] <= LATENCY_GOAL


def _row_goal(name: str, dynamic: str, table: list[dict[str, Any]], judge: Any) -> dict[str, Any]:
    verdicts = [(r, judge(r)) for r in table]
    judged = [met for _, met in verdicts if met is not None]
    failing = [f"{r['model']} {r['mode']}" for r, met in verdicts if met is False]
    return _goal(name, dynamic, len(failing), f"{judged.count(True)} of {len(judged)} rows met", judged, failing,
                 len(verdicts) - len(judged))


def _goal(name: str, scope: str, value: int, text: str, judged: list[bool], failing: list[str],
          not_judged: int) -> dict[str, Any]:
    met = None if not judged else all(judged)
    if not_judged:
        text += f"; {not_judged} not judged"
    return {"goal": name, "scope": scope, "value": value, "text": text, "met": met, "failing": failing}


def _notes(r: dict[str, Any]) -> str:
    notes = [r["error"]] if r["status"] != "ok" and r.get("error") else []
    if r.get("resumed"):
        notes.append(f"resumed from a cut sweep ({r['cached']} of {r['found']} requests stored by then)")
    if r.get("pass_beside_capture"):
        notes.append("its cut end-to-end pass went on beside capture")
    if r.get("predates_verdicts"):  # see _row
        notes.append("warm start from before fusion verdicts were served")
    recompile = r.get("recompile")
    if recompile:
        hook = recompile.get("hook") or {}
        notes.append(f"recompile at 2B: {fmt(recompile.get('seconds'))} s, hits/misses {hook.get('hits', '-')}/"
                     f"{hook.get('misses', '-')}, bench {ct.bench_cell(recompile.get('bench'))}")
    if r.get("missed"):  # the warm start's own list (hook_stats.missed_entry), with size expressions in the JSON
        shown = sorted(set(r["missed"]))
        notes.append("missed: " + ", ".join(shown[:3]) + (f" and {len(shown) - 3} more" if len(shown) > 3 else ""))
    return "; ".join(notes)


def _ratio_cell(value: float | None, basis: str | None, dynamic: str) -> str:
    return fmt(value, ".2f") + (" (vs static)" if value is not None and basis and basis != dynamic else "")


def _percent(value: float | None, random: bool) -> str:
    return "-" if value is None else f"{value:.2%}" + (" *" if random else "")


def _row_cells(r: dict[str, Any]) -> list[Any]:
    if r["status"] == "unavailable":
        return [r["model"], r.get("library"), "-", "-", "unavailable"] + ["-"] * 9 + [r.get("error")]
    hits = "-" if r["hits"] is None else f"{r['hits']}/{r['misses']}"
    return [r["model"], r["library"], r["mode"], r["dynamic"], r["status"], f"{fmt(r['tuned'], 'd')}/{fmt(r['found'], 'd')}",
            fmt(r["key_mismatch"], "d"), hits, ct.bench_cell(r["benchmarks"]),
            _ratio_cell(r["first_ratio"], r["default_basis"], r["dynamic"]),
            _ratio_cell(r["latency_ratio"], r["cold_basis"], r["dynamic"]),
            *(_percent(r["deviation"][kind], r["deviation_random"]) for kind in ("default", "cold", "warm")),
            _notes(r)]


def render(report: dict[str, Any]) -> list[str]:
    """One machine's table: the goals, a row per model x mode x dynamic mode, and what did not run."""
    libraries = ", ".join(f"{name} {version or '-'}" for name, version in report.get("libraries", {}).items())
    verdicts = {True: "met", False: "NOT met", None: "n/a"}
    table = rows(report)
    lines = [f"Libraries: {libraries}. A ratio against another dynamic mode's baseline is marked and not judged. "
             "Deviation: max |compiled - eager| / max |eager| of the first call's output (of a training step, its "
             "loss); * a training step that draws random numbers (dropout), which compiled code draws otherwise.",
             ""]
    lines += harness.table(["goal", "mode", "value", "verdict", "failing rows"],
                           [[g["goal"], g["scope"], g["text"], verdicts[g["met"]], ", ".join(g["failing"]) or "-"]
                            for g in goals(table)])
    lines += [""] + harness.table(["model", "lib", "mode", "dynamic", "status", "tuned/found", "key_mismatch",
                                   "hits/misses", "bench gemm/pw/cd", "warm/default 1st call", "warm/cold latency",
                                   "dev default", "dev cold", "dev warm", "notes"], [_row_cells(r) for r in table])
    skipped = [f"- {model} {mode} {key}: {result.get('reason')}" for model, mode, group in _steps(report)
               for key, result in group["steps"].items() if result.get("status") == "skipped"]
    return lines + ([""] + skipped if skipped else [])


def results(out: Path) -> harness.Results:
    return harness.Results(out, "conformance", "Model-zoo conformance", render)


def _names(raw: str, known: tuple[str, ...] | dict[str, Any], option: str) -> list[str]:
    names = [part.strip() for part in raw.split(",") if part.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise BadInput(f"{option}: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


def _library_versions() -> dict[str, str | None]:
    """From package metadata: nothing is imported (the parent stays without torch)."""
    return {name: importlib.metadata.version(name) if importlib.util.find_spec(name) else None for name in LIBRARIES}


def _load_report(path: Path, fresh: bool, info: dict[str, Any], seed: Path | None = None) -> dict[str, Any]:
    """This machine's run (its GPU and torch) in the results at ``path``; where there are none yet,
    in ``seed`` (the committed table), so only the steps it lacks run."""
    fix = "use another --out, or --no-resume to start afresh"
    if not fresh and not path.exists() and seed is not None:
        if not seed.is_file():
            raise BadInput(f"--seed {seed}: no such results file (pass benchmarks/results/conformance.json)")
        path, fix = seed, "pass --seed the table of this machine's GPU and torch"
    if fresh or not path.exists():
        return {"models": {}}
    try:
        runs = harness.load(path)["runs"]
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path} is unreadable ({exc}): move it away or pass --no-resume") from exc
    same = [r for r in runs if all((r.get("machine") or {}).get(k) == info.get(k) for k in ("gpu", "torch"))]
    if not same:
        old = (runs[-1].get("machine") or {}) if runs else {}
        key = "gpu" if old.get("gpu") != info.get("gpu") else "torch"
        raise BadInput(f"{path} was taken with {key} {old.get(key)!r}, this machine has {info.get(key)!r}: {fix}")
    log.info("resuming from %s (--no-resume starts afresh)", path)
    return same[-1]


def start(args: argparse.Namespace) -> Run:
    """Check the input, pick the device, load what earlier runs left."""
    started = time.monotonic()
    args.models_list = list(zoo.CPU_SUBSET) if args.subset == "cpu" else \
        _names(args.models or ",".join(zoo.ZOO), zoo.ZOO, "--models")
    args.modes = _names(args.modes_raw, zoo.MODES, "--modes")
    args.dynamics = _names(args.dynamics_raw, tuple(DYNAMICS), "--dynamics")
    device = args.device or ("cpu" if args.subset == "cpu" else None)
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the children (sweep, compiles) must not see a GPU
        os.environ.setdefault("OMP_NUM_THREADS", CPU_THREADS)
    os.environ.setdefault("AUTOTUNE_LOOKUP_TIMEOUT", LOOKUP_TIMEOUT_S)
    harness.warm_bytecode()
    info = harness.machine(min(args.timeout, 300))
    if device is None and not info.get("gpu"):
        device = "cpu"
        os.environ.setdefault("OMP_NUM_THREADS", CPU_THREADS)
    device = device or "cuda"
    if device == "cuda" and not info.get("gpu"):
        raise BadInput("--device cuda: no CUDA GPU is visible here (use --device cpu)")
    args.runs = args.runs or (50 if device == "cuda" else 20)
    args.warmup = args.warmup if args.warmup is not None else (5 if device == "cuda" else 3)
    label = "cpu" if device == "cpu" else harness.slug(info["gpu"])
    out = Path(args.out)
    report = _load_report(out / "conformance.json", args.no_resume, info, Path(args.seed) if args.seed else None)
    report.setdefault("invocations", []).append({"date": harness.now(), "argv": args.argv_text})
    report.update(machine=info, device=device, libraries=_library_versions(), date=harness.now(),
                  commit=harness.commit(), command=f"python -m benchmarks.conformance {args.argv_text}",
                  settings={"runs": args.runs, "warmup": args.warmup, "timeout_s": args.timeout,
                            "budget_s": args.budget, "baselines": args.baselines,
                            "lookup_timeout_s": os.environ.get("AUTOTUNE_LOOKUP_TIMEOUT"),
                            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")})
    report.setdefault("models", {})
    return Run(args, device, label, out, report, started)


def merge_files(paths: list[Path]) -> list[dict[str, Any]]:
    """Results files of several queues (one per GPU of a host, say) as one run per machine: a later
    file's steps replace an earlier's (see _merge_steps); each invocation is listed once."""
    merged: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            runs = harness.load(path)["runs"]
        except (OSError, ValueError) as exc:
            raise BadInput(f"{path} is unreadable ({exc}): pass conformance results files to --merge") from exc
        for report in runs:
            machine = report.get("machine") or {}
            label = report.get("label") or (harness.slug(machine["gpu"]) if machine.get("gpu") else "cpu")
            into = merged.setdefault(label, {"models": {}, "invocations": []})
            if into.get("machine") and into["machine"].get("torch") != machine.get("torch"):
                raise BadInput(f"{path} was taken with torch {machine.get('torch')!r}, an earlier file with "
                               f"{into['machine'].get('torch')!r}: merge only results of one torch per machine")
            _note_host(into, machine, report.get("other_hosts", []))
            into.update({k: v for k, v in report.items() if k not in _KEPT_APART}, label=label)
            into["invocations"] += [i for i in report.get("invocations", []) if i not in into["invocations"]]
            for model, entry in report.get("models", {}).items():
                target = into["models"].setdefault(model, {})
                target.update({k: v for k, v in entry.items() if k != "modes"})
                for mode, group in entry.get("modes", {}).items():
                    steps = target.setdefault("modes", {}).setdefault(mode, {"steps": {}})
                    steps.update({k: v for k, v in group.items() if k != "steps"})
                    _merge_steps(steps["steps"], group.get("steps", {}))
    for report in merged.values():
        report["invocations"].sort(key=lambda invocation: invocation.get("date", ""))
    return list(merged.values())


# What a later file does not overwrite: its rows and invocations are joined in, and its host is
# listed beside the run's first (the run's header names the machine of the table it was merged into).
_KEPT_APART = ("models", "invocations", "machine", "other_hosts")


def _note_host(into: dict[str, Any], machine: dict[str, Any], others: list[str]) -> None:
    """Keep the run's first machine; list every other host its files ran on (more cores, another
    host kind) once, so the header does not name the last file's host as every step's."""
    into.setdefault("machine", machine)
    listed = into.setdefault("other_hosts", [])
    first = harness.machine_line(into["machine"])
    for host in [harness.machine_line(machine), *others]:
        if host != first and host not in listed:
            listed.append(host)
    if not listed:
        del into["other_hosts"]


def _merge_steps(into: dict[str, Any], later: dict[str, Any]) -> None:
    """A later step replaces an earlier one, except that one not ok (skipped, cut) keeps an earlier
    ok result, and a sweep that captured less than the earlier one (``--dynamics dynamic`` alone)
    is filed as ``sweep/<dynamic>`` for the warm starts it served: other rows keep theirs."""
    served = [key.split("/")[1] for key in later if key.startswith("warm/")]
    for key, result in later.items():
        earlier = _ok(into.get(key))
        if earlier and not _ok(result):
            continue
        if key == "sweep" and earlier and not _captured(result) >= _captured(earlier) and served:
            into.update({f"sweep/{dynamic}": result for dynamic in served})
            continue
        into[key] = result


def _captured(sweep: dict[str, Any]) -> set[str]:
    """What a sweep step's passes captured (``static 16``, ``dynamic 16``), read from their commands."""
    out = set()
    for command in str(sweep.get("command") or "").split("&&"):
        words = command.split()
        kind = "dynamic" if "--dynamic" in words else "static"
        sizes = words[words.index("--batch-sizes") + 1].split(",") if "--batch-sizes" in words[:-1] else ["?"]
        out |= {f"{kind} {size}" for size in sizes}
    return out


def _merge(args: argparse.Namespace) -> int:
    try:
        merged = merge_files([Path(p) for p in args.merge])
    except BadInput as error:
        print(f"conformance: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    store = results(Path(args.out))
    store.data["runs"] = merged
    store.save()
    print(f"wrote {store.path} ({len(merged)} runs) and its .md from {len(args.merge)} files")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.conformance", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0], epilog=f"models: {', '.join(zoo.ZOO)}\nCPU subset: "
        f"{', '.join(zoo.CPU_SUBSET)}\n\n{__doc__.split(chr(10) * 2)[-1]}")
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--models", default=None, help="comma-separated zoo models (default: all)")
    chosen.add_argument("--subset", choices=("cpu",), default=None, help="the CPU subset CI runs (implies --device cpu)")
    parser.add_argument("--modes", dest="modes_raw", metavar="MODES", default="infer,train", help="infer,train")
    parser.add_argument("--dynamics", dest="dynamics_raw", metavar="DYNAMICS", default=",".join(DYNAMICS),
                        help="static,auto,dynamic")
    parser.add_argument("--baselines", choices=BASELINES, default="all",
                        help="default and cold max-autotune in every dynamic mode, in static only (the dynamic rows' "
                        "ratios are then shown, not judged), or none")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when a GPU is visible")
    harness.output_options(parser, "conformance", None, timeout=600.0, per="step at most",
                           out_help="folder of conformance.json/.md and the work folder")
    parser.add_argument("--budget", type=float, default=560.0, help="seconds: start no step that would not end by then")
    parser.add_argument("--runs", type=int, default=None, help="timed calls per compile, at least; timing lasts at least 1 s "
                        "(default: 50 CUDA, 20 CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls before them (default: 5 CUDA, 3 CPU)")
    parser.add_argument("--latency-processes", type=int, default=1, metavar="N",
                        help="time the warm start's and cold max-autotune's code in N fresh processes each; without a "
                             "kernel profile (CPU) the latency ratio is then of their median fastest calls (default 1)")
    parser.add_argument("--no-resume", action="store_true", help="start a fresh run")
    parser.add_argument("--seed", metavar="FILE", default=None,
                        help="with no results in --out yet, start from this machine's run in FILE (the committed table)")
    parser.add_argument("--retry-errors", action="store_true", help="also run again the steps that failed")
    parser.add_argument("--log-dir", default=None, help="write each child's output here")
    parser.add_argument("--keep-caches", action="store_true", help="keep each sweep's database after its warm starts")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--merge", nargs="+", metavar="FILE", default=None,
                        help="run nothing: merge these results files (one queue per GPU, say) into --out's, by machine")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    harness.log_to_stderr(args.verbose)
    if args.merge:
        return _merge(args)
    try:
        if args.budget <= 0 or args.timeout <= 0 or (args.runs is not None and args.runs < 1) or \
                args.latency_processes < 1:
            raise BadInput("--budget, --timeout, --runs and --latency-processes must be positive")
        run = start(args)
    except BadInput as error:
        print(f"conformance: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    run_steps(run, plan(args.models_list, args.modes, args.dynamics, args.baselines))
    print("\n".join(render(run.report)))
    left = f"; {run.incomplete} steps left for a re-run with the same --out" if run.incomplete else ""
    print(f"\nwrote {run.md_path} and {run.json_path}{left}")
    return EXIT_INCOMPLETE if run.incomplete else 0


if __name__ == "__main__":
    sys.exit(main())
