"""Compile time and latency: default vs max-autotune vs sweep + warm-start.

For each model file, each scenario runs in its own fresh process with fresh
TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR, so no local cache carries over:

- ``default``: ``torch.compile(model)``;
- ``max-autotune-cold``: ``torch.compile(model, mode="max-autotune")``;
- ``sweep``: ``autotune sweep MODEL --cache sqlite:///<tmp>/cache.db --json``;
- ``warm-start``: ``autotune.warm_start(<same db>)``, then
  ``torch.compile(model, mode="max-autotune")``.

Each model scenario records the first call (compile + first run, synchronized),
the median latency over ``--runs`` calls after warm-up, how many autotune
benchmarks Inductor ran, and for warm-start the hook's hit/miss stats. Results
go to ``<out>/compile_time_<gpu>.json`` and ``.md``; scenarios already in the
JSON for other models/scenarios are kept (``--no-merge`` starts afresh).

    python benchmarks/compile_time.py
    python benchmarks/compile_time.py --models resnet --scenarios default,max-autotune-cold
    python benchmarks/compile_time.py --models examples/gpt.py --runs 200 --out /tmp/results

A scenario that fails or times out is recorded with its error. The parent
process never imports torch (children do), so ``--help`` works anywhere.
Internal entry points: ``_scenario`` and ``_info`` (one child each).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("compile_time")

REPO = Path(__file__).resolve().parents[1]
MARKER = "RESULT "
MODELS: dict[str, str] = {
    "resnet": "examples/resnet.py",
    "gpt": "examples/gpt.py",
    "gpt2_hf": "examples/gpt2_hf.py",
}
SCENARIOS: tuple[str, ...] = ("default", "max-autotune-cold", "sweep", "warm-start", "warm-start-unpinned",
                              "warm-start-nofusion")
# warm-start-unpinned: the hook without pinning and without pointwise configs (what
# it did before both existed); it shows what those two save. warm-start-nofusion:
# the hook with Inductor's epilogue-fusion benchmarks off. Not run unless named.
DEFAULT_SCENARIOS: tuple[str, ...] = SCENARIOS[:4]
MODES: dict[str, str] = {"default": "default", "max-autotune-cold": "max-autotune", "warm-start": "max-autotune",
                         "warm-start-unpinned": "max-autotune", "warm-start-nofusion": "max-autotune"}
WARM = ("warm-start", "warm-start-unpinned", "warm-start-nofusion")
SCENARIO_ENV: dict[str, dict[str, str]] = {
    "warm-start-unpinned": {"AUTOTUNE_PIN": "0", "AUTOTUNE_KERNEL_CONFIGS": "0"},
    "warm-start-nofusion": {"TORCHINDUCTOR_BENCHMARK_EPILOGUE_FUSION": "0"},
}
LATENCY_TOLERANCE = 0.03  # warm-start latency may be at most 3% above max-autotune-cold
TAIL_CHARS = 4000


# ============================================================== child processes


def _emit(payload: dict[str, Any]) -> None:
    """The child's one result line; everything else on stdout is ignored."""
    sys.stdout.write(MARKER + json.dumps(payload, default=str) + "\n")
    sys.stdout.flush()


def _load_example(path: str, batch_size: int | None) -> tuple[Any, tuple[Any, ...]]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("compile_time_model", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules["compile_time_model"] = module
    spec.loader.exec_module(module)  # may set torch._inductor.config, as the contract allows
    return module.example(batch_size) if batch_size is not None else module.example()


def _to(value: Any, device: str) -> Any:
    import torch

    return value.to(device) if isinstance(value, torch.Tensor) else value


def _inductor_counter(name: str) -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"][name])


def _compile_phases() -> str | None:
    """Dynamo's own time per compile phase (where the first call's time went)."""
    try:
        from torch._dynamo.utils import compile_times

        return str(compile_times(repr="str", aggregate=True))
    except Exception:  # noqa: BLE001 - diagnostics only
        return None


def _kernel_profile(call: Any, sync: Any, calls: int = 10, top: int = 40) -> list[dict[str, Any]]:
    """GPU time per kernel and call, the largest first (to see which kernels differ)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        sync()
    rows = []
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)
        if us > 0:
            rows.append({"kernel": event.key[:120], "us_per_call": us / calls, "launches_per_call": event.count / calls})
    return sorted(rows, key=lambda r: -r["us_per_call"])[:top]


def child_scenario(args: argparse.Namespace) -> int:
    """Compile one model one way in this (fresh) process and report one RESULT line."""
    result: dict[str, Any] = {"scenario": args.scenario, "model": args.model, "status": "error"}
    try:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        module, inputs = _load_example(args.model, args.batch_size)
        if isinstance(module, torch.nn.Module):
            module = module.to(device).eval()
        inputs = tuple(_to(x, device) for x in inputs)
        if device == "cuda":
            torch.ones(1, device=device).sum().item()  # CUDA context up before the clock starts
        mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

        def call() -> Any:
            if mark_step is not None and device == "cuda":
                mark_step()  # max-autotune uses CUDA graphs; each call is a new step
            return compiled(*inputs)

        handle = None
        with torch.no_grad():
            sync()
            start = time.perf_counter()
            if args.scenario in WARM:
                import autotune

                handle = autotune.warm_start(args.cache)
                result["hook_install_s"] = time.perf_counter() - start
            mode = MODES[args.scenario]
            compiled = torch.compile(module) if mode == "default" else torch.compile(module, mode=mode)
            call()
            sync()
            result["first_call_s"] = time.perf_counter() - start

            for _ in range(args.warmup):
                call()
            sync()
            wall_ms: list[float] = []
            gpu_ms: list[float] = []
            for _ in range(args.runs):
                if device == "cuda":
                    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    t0 = time.perf_counter()
                    begin.record()
                    call()
                    end.record()
                    sync()
                    wall_ms.append((time.perf_counter() - t0) * 1e3)
                    gpu_ms.append(begin.elapsed_time(end))
                else:
                    t0 = time.perf_counter()
                    call()
                    wall_ms.append((time.perf_counter() - t0) * 1e3)
            if args.kernel_profile and device == "cuda":
                result["kernels"] = _kernel_profile(call, sync)
        result.update(
            status="ok",
            device=device,
            mode=mode,
            runs=args.runs,
            median_ms=statistics.median(wall_ms) if wall_ms else None,
            min_ms=min(wall_ms) if wall_ms else None,
            mean_ms=statistics.fmean(wall_ms) if wall_ms else None,
            median_gpu_ms=statistics.median(gpu_ms) if gpu_ms else None,
            benchmarks=_inductor_counter("select_algorithm_autotune"),
            precompiles=_inductor_counter("select_algorithm_precompile"),
            compile_phases=_compile_phases(),
            cudagraph_skips=_inductor_counter("cudagraph_skips"),
        )
        if handle is not None:
            result["hook"] = handle.stats.as_dict()
            handle.uninstall()
    except BaseException as exc:  # noqa: BLE001 - the parent gets the error, whatever it is
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-TAIL_CHARS:]
        _emit(result)
        return 1
    _emit(result)
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def child_info(_args: argparse.Namespace) -> int:
    """Machine and versions, from a child so that the parent never holds the GPU."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import torch

        info.update(torch=torch.__version__, cuda=torch.version.cuda, gpu=None, gpu_count=0)
        if torch.cuda.is_available():
            info.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count())
            props = torch.cuda.get_device_properties(0)
            info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    except Exception as exc:  # noqa: BLE001
        info["torch_error"] = f"{type(exc).__name__}: {exc}"
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        info["triton"] = None
    try:
        import autotune

        info["autotune"] = autotune.__version__
    except Exception as exc:  # noqa: BLE001
        info["autotune"] = f"unavailable ({type(exc).__name__})"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            info["driver"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            pass
    _emit(info)
    return 0


# ============================================================== parent process


@dataclass
class Completed:
    rc: int | None  # None: timed out
    stdout: str
    stderr: str
    wall_s: float


def _child_env(cache_root: Path, cache_url: str | None) -> dict[str, str]:
    env = dict(os.environ)
    inductor, triton = cache_root / "inductor", cache_root / "triton"
    inductor.mkdir(parents=True, exist_ok=True)
    triton.mkdir(parents=True, exist_ok=True)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor)
    env["TRITON_CACHE_DIR"] = str(triton)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if cache_url:
        env["AUTOTUNE_CACHE"] = cache_url
    return env


def _run(cmd: list[str], env: dict[str, str], timeout: float, log_path: Path | None) -> Completed:
    """Run a child in its own process group; on timeout kill that group."""
    log.debug("running %s", " ".join(cmd))
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own group: it and its compile workers
        except ProcessLookupError:
            pass
        stdout, stderr = proc.communicate()
        rc = None
    wall = time.perf_counter() - start
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(f"$ {' '.join(cmd)}\n# rc={rc} wall={wall:.1f}s\n--- stdout\n{stdout}\n--- stderr\n{stderr}")
    return Completed(rc, stdout or "", stderr or "", wall)


def _marker_payload(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                payload = json.loads(line[len(MARKER):])
            except json.JSONDecodeError:
                continue
            if isinstance(payload, dict):
                return payload
    return None


def _sweep_payload(stdout: str) -> dict[str, Any] | None:
    """The sweep's --json report: the last JSON object in stdout that has "totals"."""
    decoder = json.JSONDecoder()
    found: dict[str, Any] | None = None
    for match in re.finditer(r"^\s*\{", stdout, flags=re.MULTILINE):
        try:
            obj, _ = decoder.raw_decode(stdout, match.end() - 1)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "totals" in obj:
            found = obj
    return found


def _tail(text: str) -> str:
    return text[-TAIL_CHARS:] if text else ""


def run_model_scenario(model: str, scenario: str, cache_url: str, tmp: Path, args: argparse.Namespace,
                       log_path: Path | None) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "_scenario", "--model", model, "--scenario", scenario,
           "--runs", str(args.runs), "--warmup", str(args.warmup)]
    warm = scenario in WARM
    if warm:
        cmd += ["--cache", cache_url]
    if args.batch_size is not None:
        cmd += ["--batch-size", str(args.batch_size)]
    if args.kernel_profile:
        cmd += ["--kernel-profile"]
    env = {**_child_env(tmp / scenario, cache_url if warm else None), **SCENARIO_ENV.get(scenario, {})}
    if args.kernel_profile:
        env["TORCH_LOGS"] = "perf_hints"  # why CUDA graphs were skipped, if they were
    done = _run(cmd, env, args.timeout, log_path)
    payload = _marker_payload(done.stdout)
    if done.rc is None:
        result = {"status": "timeout", "error": f"timed out after {args.timeout:.0f} s"}
        if payload:
            result.update({k: v for k, v in payload.items() if k not in ("status", "error")})
    elif payload is None:
        result = {"status": "error", "error": f"child exited {done.rc} without a result line"}
    else:
        result = payload
        if done.rc != 0 and result.get("status") == "ok":
            result.update(status="error", error=f"child exited {done.rc} after reporting")
    if result.get("status") != "ok":
        result["stderr_tail"] = _tail(done.stderr)
    result.update(scenario=scenario, process_wall_s=done.wall_s)
    return result


def run_sweep(model: str, cache_url: str, tmp: Path, args: argparse.Namespace,
              log_path: Path | None) -> dict[str, Any]:
    cmd = [sys.executable, "-c", "from cli import main; main(prog_name='autotune')",
           "sweep", model, "--cache", cache_url, "--json"]
    if args.batch_size is not None:
        cmd += ["--batch-sizes", str(args.batch_size)]
    cmd += list(args.sweep_arg or ())
    done = _run(cmd, _child_env(tmp / "sweep", cache_url), args.timeout, log_path)
    result: dict[str, Any] = {"scenario": "sweep", "command": "autotune " + " ".join(cmd[3:]),
                              "wall_s": done.wall_s, "process_wall_s": done.wall_s, "rc": done.rc}
    report = _sweep_payload(done.stdout)
    if report is not None:
        totals = report.get("totals", {})
        result.update(
            sweep_wall_s=totals.get("wall_seconds"),
            capture_s=totals.get("capture_seconds"),
            found=totals.get("found"),
            cached=totals.get("cached"),
            tuned=totals.get("tuned"),
            failed=totals.get("failed"),
            device_name=report.get("device_name"),
            startup_s=totals.get("startup_seconds"),
            tuning_s=totals.get("tuning_seconds"),
            pointwise=report.get("pointwise"),
        )
    if done.rc is None:
        result.update(status="timeout", error=f"timed out after {args.timeout:.0f} s")
    elif done.rc != 0:
        result.update(status="error", error=f"sweep exited {done.rc}")
    elif report is None:
        result.update(status="error", error="no JSON report with 'totals' on stdout")
    else:
        result["status"] = "ok"
    if result["status"] != "ok":
        result["stderr_tail"] = _tail(done.stderr)
        result["stdout_tail"] = _tail(done.stdout)
    return result


def machine_info(timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="compile_time_info_") as tmp:
        done = _run([sys.executable, str(Path(__file__).resolve()), "_info"],
                    _child_env(Path(tmp), None), timeout, None)
    info = _marker_payload(done.stdout)
    if info is None:
        log.warning("could not read machine info (rc=%s): %s", done.rc, _tail(done.stderr)[-500:])
        info = {"python": platform.python_version(), "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
                "error": f"info child exited {done.rc}"}
    return info


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


# ------------------------------------------------------------------ ratios


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None


def _ok(results: dict[str, Any], name: str) -> dict[str, Any] | None:
    r = results.get(name)
    return r if r and r.get("status") == "ok" else None


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The three goals for one model, each with its value and whether it is met (None: n/a)."""
    default, cold = _ok(results, "default"), _ok(results, "max-autotune-cold")
    sweep, warm = _ok(results, "sweep"), _ok(results, "warm-start")

    def get(r: dict[str, Any] | None, key: str) -> float | None:
        return r.get(key) if r else None

    first = _ratio(get(warm, "first_call_s"), get(default, "first_call_s"))
    latency = _ratio(get(warm, "median_ms"), get(cold, "median_ms"))
    sweep_ratio = _ratio(get(sweep, "wall_s"), get(cold, "first_call_s"))
    return [
        {"name": "warm-start first call / default first call", "goal": "<= 1.00", "value": first,
         "met": None if first is None else first <= 1.0},
        {"name": "warm-start median latency / max-autotune-cold median latency",
         "goal": f"<= {1 + LATENCY_TOLERANCE:.2f} (within {LATENCY_TOLERANCE:.0%})", "value": latency,
         "met": None if latency is None else latency <= 1.0 + LATENCY_TOLERANCE},
        {"name": "sweep wall (whole command) / max-autotune-cold first call", "goal": "< 1.00",
         "value": sweep_ratio, "met": None if sweep_ratio is None else sweep_ratio < 1.0},
    ]


# ------------------------------------------------------------------ output


def _fmt(value: Any, spec: str) -> str:
    return "-" if not isinstance(value, (int, float)) else format(value, spec)


def _hook_cell(r: dict[str, Any]) -> str:
    hook = r.get("hook")
    if hook:
        errors = f" ({hook.get('errors')} errors)" if hook.get("errors") else ""
        return f"{hook.get('hits')}/{hook.get('misses')}{errors}"
    return "-"


def _hook_notes(r: dict[str, Any]) -> str:
    hook = r.get("hook") or {}
    if not hook:
        return ""
    return (f"; {hook.get('configs_skipped', 0)} Triton configs not generated, "
            f"{hook.get('kernel_configs_loaded', 0)} pointwise configs served")


def _row(name: str, r: dict[str, Any] | None) -> list[str]:
    if r is None:
        return [name, "not run", "-", "-", "-", "-", ""]
    status = r.get("status", "?")
    if name == "sweep":
        first = _fmt(r.get("wall_s"), ".1f")
        notes = (f"found {r.get('found', '-')}, tuned {r.get('tuned', '-')}, failed {r.get('failed', '-')}, "
                 f"cached {r.get('cached', '-')}; sweep's own wall {_fmt(r.get('sweep_wall_s'), '.1f')} s "
                 f"(capture {_fmt(r.get('capture_s'), '.1f')} s, GEMM tuning {_fmt(r.get('tuning_s'), '.1f')} s")
        pointwise = r.get("pointwise") or {}
        if pointwise:
            notes += (f", pointwise pass {_fmt(pointwise.get('seconds'), '.1f')} s storing "
                      f"{pointwise.get('saved', 0)} configs")
        notes += ")"
        bench = _fmt(r.get("tuned"), "d")
    else:
        first = _fmt(r.get("first_call_s"), ".1f")
        notes = f"gpu {_fmt(r.get('median_gpu_ms'), '.3f')} ms" if r.get("median_gpu_ms") is not None else ""
        notes += _hook_notes(r)
        bench = _fmt(r.get("benchmarks"), "d")
    if status != "ok":
        error = str(r.get("error", "")).replace("|", "\\|").replace("\n", " ")[:200]
        notes = f"{status}: {error}" + (f"; {notes}" if notes else "")
    return [name, status, first, _fmt(r.get("median_ms"), ".3f"), bench, _hook_cell(r), notes]


def _met(value: bool | None) -> str:
    return "n/a" if value is None else ("met" if value else "NOT met")


def render_markdown(report: dict[str, Any]) -> str:
    info, lines = report["machine"], []
    lines += [f"# Compile time: {info.get('gpu') or 'no GPU'}", "",
              f"Generated {report['date']} by `python benchmarks/compile_time.py {report['argv']}`.", "",
              "## Machine", "",
              f"- GPU: {info.get('gpu') or '-'} x{info.get('gpu_count', 0)}"
              + (f", {info['gpu_memory_gib']} GiB" if info.get("gpu_memory_gib") else "")
              + (f", driver {info['driver']}" if info.get("driver") else ""),
              f"- CPU: {info.get('cpu') or '-'} ({info.get('cpu_count')} logical cores)",
              f"- python {info.get('python')}, torch {info.get('torch')}, triton {info.get('triton')}, "
              f"CUDA {info.get('cuda')}, autotune {info.get('autotune')}", "",
              "## Method", "",
              "Each scenario runs in its own fresh process with empty TORCHINDUCTOR_CACHE_DIR and "
              "TRITON_CACHE_DIR. *First call*: `torch.compile` + the first call, synchronized (for "
              "warm-start, `autotune.warm_start()` included). *Median*: wall time per call, synchronized "
              "after each, over the measured runs after warm-up (`gpu` in notes: the same calls timed "
              "with CUDA events). *Benchmarks*: Inductor's `select_algorithm_autotune` counter (for the "
              "sweep: requests tuned). *Hits/misses*: the warm-start hook's stats. The sweep's first-call "
              "column is the wall time of the whole `autotune sweep` command (Python and Ray start-up "
              "included); the warm-start reads the database that this sweep filled.", ""]
    for model, entry in report["models"].items():
        results = entry["scenarios"]
        lines += [f"## {model}", "", f"`{entry['path']}`", "",
                  "| scenario | status | first call s | median ms | benchmarks | hits/misses | notes |",
                  "| --- | --- | ---: | ---: | ---: | --- | --- |"]
        for name in SCENARIOS:
            if name in DEFAULT_SCENARIOS or name in results:
                lines.append("| " + " | ".join(_row(name, results.get(name))) + " |")
        lines += ["", "| ratio | goal | value | verdict |", "| --- | --- | ---: | --- |"]
        for goal in goals(results):
            lines.append(f"| {goal['name']} | {goal['goal']} | {_fmt(goal['value'], '.2f')} | {_met(goal['met'])} |")
        lines.append("")
    return "\n".join(lines)


def print_summary(report: dict[str, Any]) -> None:
    header = ["model", "scenario", "status", "first s", "median ms", "bench", "hit/miss"]
    rows = [header]
    for model, entry in report["models"].items():
        for name in SCENARIOS:
            r = entry["scenarios"].get(name)
            if r is not None:
                row = _row(name, r)
                rows.append([model, name, row[1], row[2], row[3], row[4], row[5]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    for model, entry in report["models"].items():
        for goal in goals(entry["scenarios"]):
            print(f"{model}: {goal['name']} = {_fmt(goal['value'], '.2f')} (goal {goal['goal']}): {_met(goal['met'])}")


# ------------------------------------------------------------------ driver


def _model_list(raw: str) -> list[tuple[str, str]]:
    models = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        path = MODELS.get(item, item)
        name = item if item in MODELS else Path(item).stem
        if not (REPO / path).is_file() and not Path(path).is_file():
            raise SystemExit(f"--models: {item!r} is neither a known model ({', '.join(MODELS)}) nor a file")
        resolved = (REPO / path) if (REPO / path).is_file() else Path(path).resolve()
        try:
            shown = str(resolved.relative_to(REPO))
        except ValueError:
            shown = str(resolved)
        models.append((name, shown))
    return models


def _scenario_list(raw: str) -> list[str]:
    chosen = [s.strip() for s in raw.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        raise SystemExit(f"--scenarios: unknown {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    return [s for s in SCENARIOS if s in chosen]


def benchmark(args: argparse.Namespace) -> int:
    models = _model_list(args.models)
    scenarios = _scenario_list(args.scenarios)
    if any(s in WARM for s in scenarios) and "sweep" not in scenarios and not args.cache:
        log.warning("warm-start needs a filled cache: adding the sweep scenario (or pass --cache URL)")
        scenarios = [s for s in SCENARIOS if s in scenarios or s == "sweep"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    info = machine_info(min(args.timeout, 300))
    gpu = slug(info.get("gpu") or "cpu")
    json_path, md_path = out / f"compile_time_{gpu}.json", out / f"compile_time_{gpu}.md"
    report: dict[str, Any] = {"models": {}}
    if json_path.exists() and not args.no_merge:
        try:
            report = json.loads(json_path.read_text())
            log.info("merging into %s (pass --no-merge to start afresh)", json_path)
        except (OSError, json.JSONDecodeError) as exc:
            log.warning("ignoring unreadable %s: %s", json_path, exc)
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    report.update(machine=info, date=now, argv=" ".join(sys.argv[1:]), scenarios=list(SCENARIOS),
                  settings={"runs": args.runs, "warmup": args.warmup, "timeout_s": args.timeout,
                            "batch_size": args.batch_size})
    report.setdefault("models", {})

    for name, path in models:
        entry = report["models"].setdefault(name, {"path": path, "scenarios": {}})
        entry["path"] = path
        tmp = Path(tempfile.mkdtemp(prefix=f"compile_time_{name}_"))
        cache_url = args.cache or f"sqlite:///{tmp / 'cache.db'}"
        try:
            for scenario in scenarios:
                log.info("%s: %s ...", name, scenario)
                log_path = Path(args.log_dir) / f"{gpu}-{name}-{scenario}.log" if args.log_dir else None
                try:
                    if scenario == "sweep":
                        result = run_sweep(path, cache_url, tmp, args, log_path)
                    else:
                        result = run_model_scenario(path, scenario, cache_url, tmp, args, log_path)
                except Exception as exc:  # noqa: BLE001 - record and go on
                    log.exception("%s %s failed to run", name, scenario)
                    result = {"scenario": scenario, "status": "error", "error": f"{type(exc).__name__}: {exc}"}
                result["date"] = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
                entry["scenarios"][scenario] = result
                log.info("%s: %s %s%s", name, scenario, result.get("status"),
                         f" ({result.get('error')})" if result.get("error") else "")
                entry["goals"] = goals(entry["scenarios"])
                _write(report, json_path, md_path)  # after every scenario: a crash loses nothing
        finally:
            if args.keep_tmp:
                log.info("kept %s", tmp)
            else:
                shutil.rmtree(tmp, ignore_errors=True)

    _write(report, json_path, md_path)
    print_summary(report)
    print(f"\nwrote {md_path} and {json_path}")
    ran = [report["models"][n]["scenarios"].get(s, {}) for n, _ in models for s in scenarios]
    return 0 if any(r.get("status") == "ok" for r in ran) else 1


def _write(report: dict[str, Any], json_path: Path, md_path: Path) -> None:
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md_path.write_text(render_markdown(report))


# ============================================================== command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compile_time.py",
        description="Compile time and latency of default, max-autotune (cold), the autotune sweep, and "
        "max-autotune with the warm-start hook; each scenario in a fresh process with fresh caches.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: python benchmarks/compile_time.py --models resnet,gpt --runs 100",
    )
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated model names ({', '.join(MODELS)}) or model file paths "
                        "(default: all three)")
    parser.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS),
                        help=f"comma-separated subset of {', '.join(SCENARIOS)} (default: the first four); "
                        "warm-start without sweep adds the sweep unless --cache is given")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"),
                        help="directory for compile_time_<gpu>.md/.json (default: benchmarks/results)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per scenario (default 600)")
    parser.add_argument("--runs", type=int, default=100, help="timed calls per scenario (default 100)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls before them (default 10)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="batch size passed to example() and to the sweep (default: the model's own)")
    parser.add_argument("--cache", metavar="URL", default=None,
                        help="use this cache database for sweep and warm-start instead of a fresh "
                        "SQLite file per model (its contents then count as cached)")
    parser.add_argument("--sweep-arg", action="append", metavar="ARG",
                        help="extra argument for `autotune sweep` (repeatable), e.g. --sweep-arg=--gpus=1")
    parser.add_argument("--no-merge", action="store_true",
                        help="overwrite the results files instead of merging into them")
    parser.add_argument("--log-dir", default=None, help="write each child's full stdout/stderr here")
    parser.add_argument("--keep-tmp", action="store_true", help="keep the per-model temporary caches")
    parser.add_argument("--kernel-profile", action="store_true",
                        help="also record GPU time per kernel (10 profiled calls after the timed ones)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def _child_parser(name: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"compile_time.py {name}")
    if name == "_scenario":
        parser.add_argument("--model", required=True)
        parser.add_argument("--scenario", required=True, choices=[s for s in SCENARIOS if s != "sweep"])
        parser.add_argument("--runs", type=int, default=100)
        parser.add_argument("--warmup", type=int, default=10)
        parser.add_argument("--batch-size", type=int, default=None)
        parser.add_argument("--cache", default=None)
        parser.add_argument("--kernel-profile", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    if argv and argv[0] in ("_scenario", "_info"):
        child_args = _child_parser(argv[0]).parse_args(argv[1:])
        return child_scenario(child_args) if argv[0] == "_scenario" else child_info(child_args)
    args = build_parser().parse_args(argv)
    if args.verbose:
        logging.getLogger().setLevel(logging.DEBUG)
    if args.runs < 1 or args.warmup < 0 or args.timeout <= 0:
        raise SystemExit("--runs must be >= 1, --warmup >= 0 and --timeout > 0")
    return benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
