"""Compile time and latency: default vs max-autotune vs sweep + warm start, and the floor.

Each scenario of each model runs in a fresh process with fresh Inductor and Triton caches:
``default``; ``max-autotune-cold``; ``sweep`` (``autotune sweep MODEL --json``, the whole
command timed, signing its artifacts when ``warm-start-artifacts`` runs); ``warm-start``
(``autotune.warm_start(<that cache>)`` then max-autotune); ``warm-start-artifacts`` (the same,
trusting the sweep's key: compiled artifacts too); ``max-autotune-megacache`` (Mega-cache of
the cold compile loaded first); ``floor`` (default mode + Mega-cache + caching_precompile,
from ``default-precompile``'s save: what a compile costs when everything is cached).

A scenario records its first call (setup, compile and the first call or training step,
synchronized), the median latency, the summed GPU kernel time (``--kernel-profile``),
every benchmark Inductor ran at the first call, and with ``--deviation`` how far the first
call's output is from eager's (``benchmarks/deviation.py``). A model file that defines ``train_step`` is a
training step (``examples/lm_train.py``). The parent never imports torch.

    python -m benchmarks.compile_time --models resnet --kernel-profile --out $OUT
    python -m benchmarks.compile_time --models mlp --scenarios default,max-autotune-cold,warm-start-artifacts
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import logging
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks import deviation, harness
from benchmarks.harness import fmt, ratio

log = logging.getLogger("compile_time")

MODELS: dict[str, str] = {"resnet": "examples/resnet.py", "gpt": "examples/gpt.py", "gpt2_hf": "examples/gpt2_hf.py",
                          "lm_train": "examples/lm_train.py", "mlp": "examples/mlp.py"}  # mlp: the CPU example
DEFAULT_MODELS = ("resnet", "gpt", "gpt2_hf", "lm_train")
ARTIFACTS = "warm-start-artifacts"
# Scenario -> torch.compile mode, in run order.
MODES: dict[str, str] = {"default": "default", "max-autotune-cold": "max-autotune", "sweep": "",
                         "warm-start": "max-autotune", ARTIFACTS: "max-autotune",
                         "max-autotune-megacache": "max-autotune", "default-precompile": "default", "floor": "default"}
SCENARIOS = tuple(MODES)
WARM = ("warm-start", ARTIFACTS)  # they install the hook
# Mega-cache loaders: scenario -> (the scenario of the same run whose save it loads, caching_precompile on).
# The floor's save comes from a default compile of its own, so that ``default`` runs without the option.
MEGACACHE_LOADS: dict[str, tuple[str, bool]] = {"max-autotune-megacache": ("max-autotune-cold", False),
                                                "floor": ("default-precompile", True)}
LATENCY_TOLERANCE = 0.03  # a warm start's latency may be at most 3% above max-autotune-cold's
# Timed calls go on past --runs until this long has passed: a tiny CPU model's few calls last
# milliseconds, all inside whatever slow phase a shared machine is in; calls spread over a second
# meet its fast ones (docs/results.md, "CPU latency is the fastest call").
MIN_TIMED_S = 1.0
MAX_TIMED_CALLS = 100_000
ARTIFACT_FIRST_CALL_GOAL = 0.50  # warm-start-artifacts' first call <= 0.50x default's
BENCH_KINDS = ("gemm_autotune", "pointwise_autotune", "coordinate_descent", "benchmarker_calls")
BENCHMARKING_MODULE = "torch._inductor.runtime.benchmarking"
# --dynamic: torch.compile's ``dynamic``. "auto" keeps torch's default and calls the model again
# at twice the batch size, which recompiles with a dynamic batch, as a job's changing batch does.
DYNAMIC: dict[str, bool | None] = {"static": False, "auto": None, "true": True}
# CPU-side calls that start GPU work: one cudaGraphLaunch per call means CUDA graphs replay.
LAUNCH_CALLS = ("cudaGraphLaunch", "cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")


def benchmark_total(bench: dict[str, Any] | None) -> int | None:
    """Benchmarks of any kind; a zero test, not a count (one GEMM autotune is many Benchmarker calls)."""
    return sum(int(bench.get(kind) or 0) for kind in BENCH_KINDS) if bench else None


def is_training_file(path: str | Path) -> bool:
    """A training-step model file defines ``train_step`` at module level (read, not imported)."""
    try:
        tree = ast.parse(Path(path).read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return False
    return any(isinstance(node, ast.FunctionDef) and node.name == "train_step" for node in tree.body)


class BenchmarkCounter:
    """Every outermost call into Inductor's ``Benchmarker.benchmark*`` methods in this process:
    GEMM candidates, pointwise configs, coordinate descent, fusion and padding checks end there."""

    def __init__(self) -> None:
        self.calls = 0
        self._local = threading.local()

    def patch(self, module: ModuleType) -> None:
        base = getattr(module, "Benchmarker", None)
        for cls in [c for c in vars(module).values() if isinstance(base, type) and isinstance(c, type)
                    and issubclass(c, base)]:
            for name, fn in list(vars(cls).items()):
                if name.startswith("benchmark") and inspect.isfunction(fn):
                    setattr(cls, name, self._counting(fn))

    def _counting(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._local, "depth", 0)
            self.calls += depth == 0
            self._local.depth = depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._local.depth = depth

        return counted


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patch a module right after its first import: importing Inductor's benchmarking module
    up front would pull in Dynamo (~1.6 s on a CPU) before the clock starts."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real, patch = spec.loader.exec_module, self.patch

        def exec_module(module: ModuleType) -> None:
            real(module)
            patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this loader serves this module only
        return spec


def _counters(group: str) -> Any:
    from torch._dynamo.utils import counters

    return counters[group]


def _compile_metrics() -> tuple[dict[str, float], dict[str, int]]:
    """Dynamo's compile_times: seconds per timed function (summed) and how often each ran."""
    try:
        from torch._dynamo.utils import compile_times

        names, totals = compile_times(repr="csv", aggregate=True)
        _, each = compile_times(repr="csv", aggregate=False)
    except Exception:  # noqa: BLE001 - details only
        return {}, {}
    seconds = {str(n): float(str(v)) for n, v in zip(names, totals) if str(v).strip()}
    return seconds, {str(n): len([x for x in str(v).split(",") if x.strip()]) for n, v in zip(names, each)}


def _benchmarks(counter: BenchmarkCounter) -> dict[str, int]:
    """Pointwise autotunes and coordinate descents as Dynamo timed them (an early return is not
    timed), GEMM autotunes by Inductor's own counter, and every Benchmarker call."""
    _, counts = _compile_metrics()
    return {"gemm_autotune": int(_counters("inductor")["select_algorithm_autotune"]),
            "pointwise_autotune": counts.get("CachingAutotuner.benchmark_all_configs", 0),
            "coordinate_descent": counts.get("CachingAutotuner.coordinate_descent_tuning", 0),
            "benchmarker_calls": counter.calls}


def _minus(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in after}


def _kernel_profile(call: Callable[[], Any], sync: Callable[[], None], calls: int = 10) -> dict[str, Any]:
    """GPU time per kernel and call (the largest 40), their sum per call, and launch calls per call."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        sync()
    kernels, launches = [], {}
    for event in prof.key_averages():
        if event.key in LAUNCH_CALLS:
            launches[event.key] = event.count / calls
        # A CPU op carries its kernels' time too; a user annotation's GPU range (a record_function
        # such as "Optimizer.step#AdamW.step" or "DistributedDataParallel.forward") repeats the
        # time of the kernels inside it, and is left out as torch's own table leaves it out.
        elif str(getattr(event, "device_type", "")).endswith("CUDA") and not getattr(event, "is_user_annotation", False):
            us = float(getattr(event, "self_device_time_total", 0) or 0) / calls
            if us > 0:
                kernels.append({"kernel": event.key[:120], "us_per_call": us, "launches_per_call": event.count / calls})
    kernels.sort(key=lambda k: -k["us_per_call"])
    by_kind: dict[str, float] = {}
    for kernel in kernels:
        kind = kernel_kind(kernel["kernel"])
        by_kind[kind] = by_kind.get(kind, 0.0) + kernel["us_per_call"]
    return {"kernels": kernels[:40], "kernel_us_per_call": sum(k["us_per_call"] for k in kernels),
            "us_per_call_by_kind": by_kind, "launch_calls": launches}


# Substrings of library GEMM kernels' names (cuBLAS, cuBLASLt, CUTLASS) on the GPUs we measure.
_GEMM_NAMES = ("gemm", "nvjet", "cutlass", "cublas", "sm90_", "sm80_", "xmma", "_mma_")


def kernel_kind(name: str) -> str:
    """What a GPU kernel is, by its name: ``triton`` (Inductor's generated kernels and templates),
    ``gemm`` (a library kernel Inductor calls: cuBLAS's GEMMs, and cuDNN's fused attention, whose
    names carry the architecture, ``sm90_``), ``nccl`` (communication), ``optimizer`` (eager
    foreach kernels) or ``eager`` (ATen's other kernels: the copies and casts a wrapper or an
    eager op runs)."""
    lowered = name.lower()
    if lowered.startswith("triton"):
        return "triton"
    if "nccl" in lowered:
        return "nccl"
    if "multi_tensor_apply" in lowered or "foreach" in lowered:
        return "optimizer"
    if any(part in lowered for part in _GEMM_NAMES):
        return "gemm"
    return "eager"


@dataclass
class Prepared:
    """The model, its inputs and, for a training step, its optimizer: built before the clock."""
    module: Any
    inputs: tuple[Any, ...]
    train_step: Callable[..., Any] | None = None
    optimizer: Any = None
    second_inputs: tuple[Any, ...] | None = None  # --dynamic auto: the inputs at twice the batch size
    # The model and inputs built again, as the first call had them (--deviation's eager reference).
    rebuild: Callable[[], tuple[Any, tuple[Any, ...]]] | None = None


def _prepare(path: str, batch_size: int | None, device: str, dynamic: str | None) -> Prepared:
    import torch

    from autotune.inductor_glue.modelfile import module_name_for

    # The sweep's module name for the file (its stem): a Dynamo package finds classes by module and name.
    name = module_name_for(path)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"{path}: not a Python file"
    file_module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(file_module)  # may set torch._inductor.config, as the contract allows

    def example(batch: int | None) -> tuple[Any, tuple[Any, ...]]:
        module, inputs = file_module.example(batch) if batch is not None else file_module.example()
        return module, tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)

    def rebuild() -> tuple[Any, tuple[Any, ...]]:
        fresh, fresh_inputs = example(batch_size)
        return fresh.to(device), fresh_inputs

    module, inputs = example(batch_size)
    second = example(2 * batch_size)[1] if dynamic == "auto" and batch_size else None
    train_step = getattr(file_module, "train_step", None)
    if not callable(train_step):
        return Prepared(module.to(device).eval(), inputs, second_inputs=second, rebuild=rebuild)
    module = module.to(device).train()
    make = getattr(file_module, "make_optimizer", None)
    optimizer = make(module) if callable(make) else torch.optim.AdamW(module.parameters())
    return Prepared(module, inputs, train_step, optimizer, second, rebuild)


def _torch_compile(fn: Any, mode: str, dynamic: str | None = None) -> Any:
    import torch

    kwargs: dict[str, Any] = {} if mode == "default" else {"mode": mode}
    if dynamic is not None:
        kwargs["dynamic"] = DYNAMIC[dynamic]
    return torch.compile(fn, **kwargs)


def _compile_workload(prepared: Prepared, mode: str, args: argparse.Namespace) -> Callable[[tuple[Any, ...]], Any]:
    """One call, or one training step with the optimizer's step compiled in the same mode."""
    import torch

    compiled = _torch_compile(prepared.module, mode, args.dynamic)
    if prepared.train_step is None:
        return lambda inputs: compiled(*inputs)
    if args.optimizer_step == "compiled":
        # Kept out of caching_precompile: with the optimizer's deliberate graph breaks, torch 2.13 fails
        # to load the package in a fresh process ("Name '__resume_at_...' already exists in scope").
        has = hasattr(torch._dynamo.config, "caching_precompile")
        with torch._dynamo.config.patch({"caching_precompile": False} if has else {}):
            prepared.optimizer.step = _torch_compile(prepared.optimizer.step, mode)
    step, optimizer = prepared.train_step, prepared.optimizer
    return lambda inputs: step(compiled, optimizer, inputs)


def _setup(args: argparse.Namespace, result: dict[str, Any]) -> Any:
    """What runs inside the timed first call before torch.compile: the hook's install
    (``import autotune`` included) or the Mega-cache load. Returns the hook's handle."""
    import torch

    handle = None
    if args.scenario in WARM:
        start = time.perf_counter()
        import torch._inductor.select_algorithm  # noqa: F401  (any compile imports it: timed apart)

        result["setup_imports_s"] = time.perf_counter() - start
        import autotune

        handle = autotune.warm_start(args.cache)
    if args.precompile:  # before the load: the Dynamo packages it carries go to Dynamo's cache
        torch._dynamo.config.caching_precompile = True
    if args.load_artifacts:
        source = Path(args.load_artifacts)
        data = source.read_bytes() if source.is_file() else b""
        info = torch.compiler.load_cache_artifacts(data) if data else None
        result["megacache_loaded"] = {"bytes": len(data), "artifacts": _artifact_counts(info)}
    return handle


def _artifact_counts(info: Any) -> dict[str, int]:
    return {str(kind): len(keys) for kind, keys in dict(getattr(info, "artifacts", None) or {}).items()}


def _save_megacache(path: str) -> dict[str, Any]:
    """Save after the first call, outside its timing; an error is recorded, not raised."""
    import torch

    start = time.perf_counter()
    try:
        saved = torch.compiler.save_cache_artifacts()
    except Exception as exc:  # noqa: BLE001 - caching_precompile refuses classes defined in functions
        return {"error": f"{type(exc).__name__}: {exc}"}
    data, info = saved if saved is not None else (b"", None)
    Path(path).write_bytes(data)
    return {"bytes": len(data), "artifacts": _artifact_counts(info), "save_s": time.perf_counter() - start}


def _latency(call: Callable[[], Any], sync: Callable[[], None], cuda: bool, runs: int, warmup: int) -> dict[str, Any]:
    """Wall (and CUDA-event) milliseconds per call after warm-up: median, min, mean, over at least
    ``runs`` calls and at least ``MIN_TIMED_S``."""
    import torch

    for _ in range(warmup):
        call()
    sync()
    wall: list[float] = []
    gpu: list[float] = []
    until = time.perf_counter() + MIN_TIMED_S
    while len(wall) < runs or (time.perf_counter() < until and len(wall) < MAX_TIMED_CALLS):
        start = time.perf_counter()
        begin, end = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else (None, None)
        if begin is not None:
            begin.record()
        call()
        if end is not None:
            end.record()
        sync()
        wall.append((time.perf_counter() - start) * 1e3)
        if begin is not None and end is not None:
            gpu.append(begin.elapsed_time(end))
    return {"median_ms": statistics.median(wall), "min_ms": min(wall), "mean_ms": statistics.fmean(wall),
            "median_gpu_ms": statistics.median(gpu) if gpu else None, "timed_calls": len(wall)}


def child_scenario(args: argparse.Namespace) -> int:
    """Compile one model one way in this fresh process and print one result line."""
    result: dict[str, Any] = {"scenario": args.scenario, "model": args.model, "status": "error"}
    counter = BenchmarkCounter()
    if BENCHMARKING_MODULE in sys.modules:
        counter.patch(sys.modules[BENCHMARKING_MODULE])
    else:
        sys.meta_path.insert(0, _PatchOnImport(BENCHMARKING_MODULE, counter.patch))
    return harness.child_result(result, lambda: _run_scenario(args, result, counter))


def _run_scenario(args: argparse.Namespace, result: dict[str, Any], counter: BenchmarkCounter) -> None:
    import torch

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    prepared = _prepare(args.model, args.batch_size, "cuda" if cuda else "cpu", args.dynamic)
    if cuda:
        torch.ones(1, device="cuda").sum().item()  # the CUDA context up before the clock starts
    mark_step = getattr(torch.compiler, "cudagraph_mark_step_begin", None) if cuda else None
    result.update(device="cuda" if cuda else "cpu", mode=MODES[args.scenario], train=prepared.train_step is not None,
                  caching_precompile=args.precompile, dynamic=args.dynamic)
    with contextlib.nullcontext() if prepared.train_step else torch.no_grad():
        sync()
        start = time.perf_counter()
        handle = _setup(args, result)
        setup_s = time.perf_counter() - start
        work = _compile_workload(prepared, MODES[args.scenario], args)

        def call(inputs: tuple[Any, ...] = prepared.inputs) -> Any:
            if mark_step is not None:
                mark_step()  # max-autotune replays CUDA graphs: each call is a new step
            return work(inputs)

        output = call()
        sync()
        result.update(first_call_s=time.perf_counter() - start, setup_s=setup_s, bench=_benchmarks(counter),
                      compile_phases=_compile_metrics()[0])
        first_output = deviation.snapshot(output) if args.deviation else None
        del output
        first_bench = result["bench"]
        if prepared.second_inputs is not None:
            result["recompile"] = _second_call(call, prepared.second_inputs, sync, counter, handle)
            first_bench = _benchmarks(counter)
        if args.save_artifacts:
            result["megacache_saved"] = _save_megacache(args.save_artifacts)
        result.update(_latency(call, sync, cuda, args.runs, args.warmup))
        if args.kernel_profile and cuda:
            result.update(_kernel_profile(call, sync))
        if first_output is not None and prepared.rebuild is not None:
            result["deviation"] = deviation.against_eager(first_output, prepared.rebuild,
                                                          train=prepared.train_step is not None)
    result.update(status="ok", runs=args.runs, bench_after_first_call=_minus(_benchmarks(counter), first_bench),
                  cudagraph_skips=int(_counters("inductor")["cudagraph_skips"]))
    if handle is not None:
        result["hook"] = stats = handle.stats.as_dict()
        result.update({key: stats[key] for key in ("artifacts_loaded", "artifacts_rejected") if key in stats})
        handle.uninstall()


def _second_call(call: Callable[[tuple[Any, ...]], Any], inputs: tuple[Any, ...], sync: Callable[[], None],
                 counter: BenchmarkCounter, handle: Any) -> dict[str, Any]:
    """``--dynamic auto``: one call at twice the batch size, which recompiles with a dynamic batch;
    its seconds, graphs compiled, benchmarks, and the hook's lookups during it."""
    hook_before = handle.stats.as_dict() if handle is not None else None
    bench_before, graphs_before = _benchmarks(counter), int(_counters("stats")["unique_graphs"])
    start = time.perf_counter()
    call(inputs)
    sync()
    out: dict[str, Any] = {"seconds": time.perf_counter() - start, "batch_factor": 2,
                           "graphs": int(_counters("stats")["unique_graphs"]) - graphs_before,
                           "bench": _minus(_benchmarks(counter), bench_before)}
    if hook_before is not None:
        after = handle.stats.as_dict()
        out["hook"] = {key: after[key] - hook_before[key] for key in ("hits", "misses", "written", "errors")}
    return out


@dataclass
class ModelRun:
    """One model's scenarios in one run: its temporary folder, cache and signing key."""

    name: str
    path: str
    scenarios: list[str]
    tmp: Path
    cache_url: str
    train: bool
    signing_key: str | None = None  # the private key; warm-start-artifacts trusts PATH.pub
    key_error: str | None = None
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def saves(self, scenario: str) -> tuple[bool, bool]:
        """(save Mega-cache after the first call, with caching_precompile on)."""
        loaders = [flags for name, flags in MEGACACHE_LOADS.items() if name in self.scenarios and flags[0] == scenario]
        return bool(loaders), any(precompile for _, precompile in loaders)

    def megacache_path(self, source: str) -> Path:
        return self.tmp / f"{source}.megacache"


class Skipped(Exception):
    """A scenario whose prerequisite failed in this run; the message says why."""


def _scenario_flags(scenario: str, run: ModelRun, save: bool = True) -> tuple[list[str], dict[str, str]]:
    """The child's extra arguments and environment for ``scenario``; raises Skipped."""
    flags, env = (["--cache", run.cache_url] if scenario in WARM else []), {}
    saves, precompile = run.saves(scenario)
    if saves and save:
        flags += ["--save-artifacts", str(run.megacache_path(scenario))]
    if scenario in MEGACACHE_LOADS:
        source, precompile = MEGACACHE_LOADS[scenario]
        done = run.results.get(source) or {}
        if done.get("status") != "ok":
            raise Skipped(f"needs a successful {source} in the same run (it was {done.get('status', 'not run')})")
        if (done.get("megacache_saved") or {}).get("error"):
            raise Skipped(f"{source} could not save its Mega-cache: {done['megacache_saved']['error']}")
        flags += ["--load-artifacts", str(run.megacache_path(source))]
    flags += ["--precompile"] if precompile else []
    if scenario == ARTIFACTS:
        if not run.signing_key:
            raise Skipped(f"no signing key to trust: {run.key_error or 'none was made (run the sweep)'}")
        env["AUTOTUNE_TRUSTED_KEYS"] = run.signing_key + ".pub"
    return flags, env


def run_model_scenario(scenario: str, run: ModelRun, args: argparse.Namespace, log_path: Path | None,
                       env_overrides: dict[str, str] | None = None, repeat: int = 0) -> dict[str, Any]:
    """One scenario in a fresh process; ``env_overrides`` (its GPU, say) go into its environment.
    ``repeat`` > 0: another process of a scenario already run (--latency-processes), with
    caches of its own, saving no Mega-cache."""
    try:
        flags, extra_env = _scenario_flags(scenario, run, save=not repeat)
    except Skipped as skip:
        return {"scenario": scenario, "status": "error", "error": str(skip)}
    cmd = [sys.executable, "-m", "benchmarks.compile_time", "_scenario", "--model", run.path, "--scenario", scenario,
           "--runs", str(args.runs), "--warmup", str(args.warmup), "--optimizer-step", args.optimizer_step, *flags]
    for option in ("dynamic", "batch_size"):
        if getattr(args, option, None) is not None:
            cmd += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
    cmd += ["--kernel-profile"] if args.kernel_profile else []
    cmd += ["--deviation"] if getattr(args, "deviation", False) else []
    cache_root = run.tmp / (f"{scenario}-repeat{repeat}" if repeat else scenario)
    env = {**harness.child_env(cache_root, run.cache_url if scenario in WARM else None), **extra_env,
           **(env_overrides or {})}
    done = harness.run(cmd, env, args.timeout, log_path)
    payload = harness.marker_payload(done.stdout)
    if done.rc is None:
        result = {**{k: v for k, v in (payload or {}).items() if k != "error"}, "status": "timeout",
                  "error": f"timed out after {args.timeout:.0f} s"}
    elif payload is None:
        result = {"status": "error", "error": f"child exited {done.rc} without a result line"}
    else:
        result = payload
    if result.get("status") != "ok":
        result["stderr_tail"] = harness.tail(done.stderr)
    return {**result, "scenario": scenario, "process_wall_s": done.wall_s}


def run_file_scenario(scenario: str, path: str, tmp: Path, cache_url: str, timeout: float,
                      env_overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """One scenario of one model file in a fresh process, run as the other benchmarks run it
    (five timed calls after one warm-up, the optimizer step compiled, no kernel profile)."""
    run = ModelRun(Path(path).stem, path, [scenario], tmp, cache_url, train=is_training_file(path))
    options = argparse.Namespace(runs=5, warmup=1, optimizer_step="compiled", kernel_profile=False, timeout=timeout)
    return run_model_scenario(scenario, run, options, None, env_overrides)


def make_key_pair(directory: Path, timeout: float) -> tuple[str | None, str | None]:
    """``autotune keys new`` in the run's folder: (the private key's path, or why there is none)."""
    path = directory / "keys" / "signing"
    path.parent.mkdir(parents=True, exist_ok=True)
    done = harness.run(harness.AUTOTUNE + ["keys", "new", str(path)], harness.child_env(directory / "keys-env"),
                       min(timeout, 120))
    if done.rc == 0 and Path(f"{path}.pub").is_file():
        return str(path), None
    return None, f"`autotune keys new` exited {done.rc}: {(done.stderr or done.stdout).strip()[-300:]}"


def run_sweep(run: ModelRun, args: argparse.Namespace, log_path: Path | None) -> dict[str, Any]:
    if ARTIFACTS in run.scenarios and not run.signing_key:
        run.signing_key, run.key_error = make_key_pair(run.tmp, args.timeout)
    cmd = harness.AUTOTUNE + ["sweep", run.path, "--cache", run.cache_url, "--json"]
    cmd += ["--batch-sizes", str(args.batch_size)] if args.batch_size is not None else []
    extra = list(getattr(args, "sweep_arg", None) or ())
    cmd += (["--train"] if run.train and "--train" not in extra else []) + extra
    env = harness.child_env(run.tmp / "sweep", run.cache_url)
    if run.signing_key:  # publish the end-to-end compile's artifacts for warm-start-artifacts
        env["AUTOTUNE_SIGNING_KEY"] = run.signing_key
    done = harness.run(cmd, env, args.timeout, log_path)
    report = harness.sweep_report(done.stdout)
    result: dict[str, Any] = {"scenario": "sweep", "command": "autotune " + " ".join(cmd[3:]), "wall_s": done.wall_s,
                              "process_wall_s": done.wall_s, "rc": done.rc, "signed": bool(run.signing_key),
                              "key_error": run.key_error, **(_sweep_totals(report) if report else {})}
    if done.rc is None and report is not None:  # only its teardown was cut: the report is its last word
        result.update(status="ok", note=f"cut at {args.timeout:.0f} s after its report, in its teardown")
    elif done.rc is None:
        result.update(status="timeout", error=f"timed out after {args.timeout:.0f} s")
    elif done.rc != 0 or report is None:
        result.update(status="error", error=f"sweep exited {done.rc}" if done.rc else "no JSON report on stdout")
    else:
        result["status"] = "ok"
    if result["status"] != "ok":
        result.update(stderr_tail=harness.tail(done.stderr), stdout_tail=harness.tail(done.stdout))
    return result


def _sweep_totals(report: dict[str, Any]) -> dict[str, Any]:
    totals, statuses = report.get("totals", {}), {}  # type: dict[str, Any], dict[str, int]
    for request in report.get("requests") or ():  # per request: ok, cached, key_mismatch, compile_error...
        statuses[str(request.get("status"))] = statuses.get(str(request.get("status")), 0) + 1
    return {"statuses": statuses, "sweep_wall_s": totals.get("wall_seconds"), "capture_s": totals.get("capture_seconds"),
            "startup_s": totals.get("startup_seconds"), "tuning_s": totals.get("tuning_seconds"),
            **{key: totals.get(key) for key in ("found", "cached", "tuned", "failed")},
            "device_name": report.get("device_name"), "pointwise": report.get("pointwise"),
            # a cut sweep's end-to-end pass started again beside capture (None: it was not)
            "resumed_pass_s": (report.get("timeline") or {}).get("resumed_pass_go")}


def _ok(results: dict[str, Any], name: str) -> dict[str, Any]:
    r = results.get(name)
    return r if r and r.get("status") == "ok" else {}


def latency_ratio(r: dict[str, Any] | None, base: dict[str, Any] | None) -> tuple[float | None, str]:
    """Summed GPU kernel time per call when both have a kernel profile, else the fastest wall call.

    Not the wall median: on a shared CPU machine calls run in slow phases that come and go within
    one process, so a median measures when the phases fell, and cold's and the warm start's
    swapped places between runs (docs/results.md, "CPU latency is the fastest call"). The
    fastest call is the compiled code's own time."""
    r, base = r or {}, base or {}
    kernel = ratio(r.get("kernel_us_per_call"), base.get("kernel_us_per_call"))
    if kernel is not None:
        return kernel, "summed kernel time"
    mine, theirs = fastest_calls(r), fastest_calls(base)
    if len(mine) > 1 and len(theirs) > 1:  # --latency-processes: processes differ, so their median
        return (ratio(statistics.median(mine), statistics.median(theirs)),
                f"fastest wall call, median of {len(mine)} and {len(theirs)} processes")
    return ratio(r.get("min_ms"), base.get("min_ms")), "fastest wall call"


def fastest_calls(r: dict[str, Any]) -> list[float]:
    """The fastest call of each process that ran the scenario (the first, then --latency-processes')."""
    per_process = [p.get("min_ms") for p in r.get("latency_processes") or []]
    return [ms for ms in per_process if isinstance(ms, (int, float))] or \
        ([r["min_ms"]] if isinstance(r.get("min_ms"), (int, float)) else [])


def more_processes(scenario: str, run: ModelRun, args: argparse.Namespace, first: dict[str, Any],
                   log_path: Path | None) -> None:
    """With ``--latency-processes`` N > 1 and ``first`` ok, ``first["latency_processes"]`` gets each
    process's latency for ``scenario``: ``first``'s, then N - 1 more fresh processes'. On a CPU the
    same compiled code's fastest call differs from one process to the next, at times more than
    between scenarios (docs/results.md), so one process each cannot rank them."""
    if args.latency_processes < 2 or first.get("status") != "ok":
        return
    kept = ("min_ms", "median_ms", "kernel_us_per_call", "status", "error")
    processes = [{k: first.get(k) for k in kept}]
    for repeat in range(1, args.latency_processes):
        path = log_path.with_name(f"{log_path.stem}-repeat{repeat}.log") if log_path else None
        done = run_model_scenario(scenario, run, args, path, repeat=repeat)
        processes.append({k: done.get(k) for k in kept})
    first["latency_processes"] = processes


def _goal(name: str, goal: str, value: float | None, met: Callable[[float], bool] | None) -> dict[str, Any]:
    return {"name": name, "goal": goal, "value": value, "met": None if value is None or met is None else met(value)}


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One model's goals, each with its value and whether it is met (None: n/a, or only reported)."""
    default, cold, warm, art = (_ok(results, s) for s in ("default", "max-autotune-cold", "warm-start", ARTIFACTS))
    within = f"<= {1 + LATENCY_TOLERANCE:.2f} (within {LATENCY_TOLERANCE:.0%})"
    art_latency, basis = latency_ratio(art, cold)
    warm_latency, warm_basis = latency_ratio(warm, cold)
    out = [
        _goal("warm-start first call / default first call", "<= 1.00",
              ratio(warm.get("first_call_s"), default.get("first_call_s")), lambda v: v <= 1.0),
        _goal(f"warm-start latency / max-autotune-cold latency ({warm_basis})", within, warm_latency,
              lambda v: v <= 1 + LATENCY_TOLERANCE),
        _goal("sweep wall (whole command) / max-autotune-cold first call", "< 1.00",
              ratio(_ok(results, "sweep").get("wall_s"), cold.get("first_call_s")), lambda v: v < 1.0),
        _goal(f"{ARTIFACTS} first call / default first call", f"<= {ARTIFACT_FIRST_CALL_GOAL:.2f}",
              ratio(art.get("first_call_s"), default.get("first_call_s")), lambda v: v <= ARTIFACT_FIRST_CALL_GOAL),
        _goal(f"{ARTIFACTS} benchmarks of any kind at the first call", "= 0", benchmark_total(art.get("bench")),
              lambda v: v == 0),
        _goal(f"{ARTIFACTS} latency / max-autotune-cold latency ({basis})", within, art_latency,
              lambda v: v <= 1 + LATENCY_TOLERANCE),
    ]
    return out + [_goal(f"{ARTIFACTS} first call / {anchor} first call", "report",
                        ratio(art.get("first_call_s"), _ok(results, anchor).get("first_call_s")), None)
                  for anchor in MEGACACHE_LOADS]


def bench_cell(bench: dict[str, Any] | None) -> str:
    """GEMM autotunes / pointwise autotunes / coordinate descents (every Benchmarker call)."""
    if not bench:
        return "-"
    return "/".join(str(bench.get(kind, "-")) for kind in BENCH_KINDS[:3]) + f" ({bench.get('benchmarker_calls', '-')})"


def _row(name: str, r: dict[str, Any]) -> list[str]:
    hook = r.get("hook") or {}
    if name == "sweep":
        note = f"tuned {r.get('tuned', '-')} of {r.get('found', '-')}" + (", signed" if r.get("signed") else "")
        first = fmt(r.get("wall_s"))
    else:
        note, first = "", fmt(r.get("first_call_s"))
    if r.get("status") != "ok":
        note = f"{r.get('status')}: {str(r.get('error', ''))[:160]}"
    elif len(fastest_calls(r)) > 1:
        note = "fastest call per process (ms): " + ", ".join(fmt(ms, ".3f") for ms in fastest_calls(r))
    kernel = fmt(r["kernel_us_per_call"] / 1e3, ".3f") if isinstance(r.get("kernel_us_per_call"), (int, float)) else "-"
    hits = f"{hook.get('hits')}/{hook.get('misses')}" if hook else "-"
    return [name, first, fmt(r.get("median_ms"), ".3f"), kernel, bench_cell(r.get("bench")), hits, note]


def render(run: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for model, entry in run.get("models", {}).items():
        results = entry["scenarios"]
        names = [s for s in SCENARIOS if s in results] + [s for s in results if s not in SCENARIOS]
        lines += [f"### {model} (`{entry['path']}`)", ""]
        lines += harness.table(["scenario", "first call s", "median ms", "kernels ms/call", "bench @1st gemm/pw/cd",
                                "hits/misses", "note"], [_row(name, results[name]) for name in names])
        verdicts = {True: "met", False: "NOT met", None: "-"}
        lines += [""] + harness.table(["ratio", "goal", "value", "verdict"], [
            [g["name"], g["goal"], fmt(g["value"], "d" if isinstance(g["value"], int) else ".2f"), verdicts[g["met"]]]
            for g in goals(results) if g["value"] is not None]) + [""]
    return lines


def results(out: Path) -> harness.Results:
    return harness.Results(out, "compile_time", "Compile time: first call and latency by scenario", render)


def _model_list(raw: str) -> list[tuple[str, str]]:
    models = []
    for item in (part.strip() for part in raw.split(",") if part.strip()):
        path = Path(MODELS.get(item, item))
        path = harness.REPO / path if (harness.REPO / path).is_file() else path.resolve()
        if not path.is_file():
            raise SystemExit(f"--models: {item!r} is neither a known model ({', '.join(MODELS)}) nor a file")
        shown = str(path.relative_to(harness.REPO)) if path.is_relative_to(harness.REPO) else str(path)
        models.append((item if item in MODELS else path.stem, shown))
    return models


def scenario_list(raw: str, cache_given: bool) -> list[str]:
    """The scenarios asked for, plus those they need from the same run, in run order."""
    chosen = {s.strip() for s in raw.split(",") if s.strip()}
    if chosen - set(SCENARIOS):
        raise SystemExit(f"--scenarios: unknown {', '.join(sorted(chosen - set(SCENARIOS)))}; "
                         f"choose from {', '.join(SCENARIOS)}")
    if chosen & set(WARM) and not cache_given:
        chosen.add("sweep")  # a warm start needs a filled cache
    chosen |= {MEGACACHE_LOADS[s][0] for s in chosen & set(MEGACACHE_LOADS)}
    return [s for s in SCENARIOS if s in chosen]


def benchmark(args: argparse.Namespace) -> int:
    models, scenarios = _model_list(args.models), scenario_list(args.scenarios, bool(args.cache))
    harness.warm_bytecode()
    info = harness.machine(min(args.timeout, 300))
    gpu = harness.slug(info.get("gpu") or "cpu")
    store = results(Path(args.out))
    run = store.run(args.label or f"{gpu}: {','.join(name for name, _ in models)}", info,
                    "python -m benchmarks.compile_time " + " ".join(args.argv))
    run.update(settings={k: getattr(args, k) for k in ("runs", "warmup", "timeout", "batch_size", "dynamic")},
               models={})
    for name, path in models:
        entry: dict[str, Any] = {"path": path, "scenarios": {}}
        run["models"][name] = entry
        tmp = Path(tempfile.mkdtemp(prefix=f"compile_time_{name}_"))
        model_run = ModelRun(name, path, scenarios, tmp, args.cache or f"sqlite:///{tmp / 'cache.db'}",
                             train=is_training_file(harness.REPO / path))
        try:
            for scenario in scenarios:
                log.info("%s: %s ...", name, scenario)
                log_path = Path(args.log_dir) / f"{gpu}-{name}-{scenario}.log" if args.log_dir else None
                runner = run_sweep if scenario == "sweep" else functools.partial(run_model_scenario, scenario)
                result = {**runner(model_run, args, log_path), "date": harness.now()}
                if scenario != "sweep":
                    more_processes(scenario, model_run, args, result, log_path)
                model_run.results[scenario] = entry["scenarios"][scenario] = result
                log.info("%s: %s %s %s", name, scenario, result["status"], result.get("error") or "")
                entry["goals"] = goals(entry["scenarios"])
                store.save()  # after every scenario: a cut command loses nothing
        finally:
            if not args.keep_tmp:
                shutil.rmtree(tmp, ignore_errors=True)
    print(store.path.with_suffix(".md").read_text())
    ran = [r for entry in run["models"].values() for r in entry["scenarios"].values()]
    return 0 if any(r.get("status") == "ok" for r in ran) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile_time", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=f"scenarios: {', '.join(SCENARIOS)}")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"names ({', '.join(MODELS)}) or files")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="a subset (and what each needs)")
    harness.output_options(parser, "compile_time", "GPU and models", timeout=600.0, per="scenario")
    parser.add_argument("--runs", type=int, default=100,
                        help="timed calls per scenario, at least; timing lasts at least 1 s (default 100)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls before them (default 10)")
    parser.add_argument("--latency-processes", type=int, default=1, metavar="N",
                        help="time each scenario's compiled code in N fresh processes; a latency ratio without a "
                             "kernel profile is then the median of their fastest calls (default 1)")
    parser.add_argument("--batch-size", type=int, default=None, help="for example() and the sweep")
    parser.add_argument("--cache", metavar="URL", default=None, help="a filled cache for the warm starts")
    parser.add_argument("--optimizer-step", choices=("compiled", "eager"), default="compiled",
                        help="a training step's optimizer step")
    parser.add_argument("--sweep-arg", action="append", metavar="ARG", help="extra `autotune sweep` argument")
    parser.add_argument("--log-dir", default=None, help="write each child's output here")
    parser.add_argument("--keep-tmp", action="store_true", help="keep each model's caches")
    parser.add_argument("--kernel-profile", action="store_true", help="also the GPU time per kernel (10 calls)")
    parser.add_argument("--dynamic", choices=tuple(DYNAMIC), default=None,
                        help="torch.compile(dynamic=False|None|True); auto also calls at twice --batch-size")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def _child_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compile_time _scenario")
    parser.add_argument("--model", required=True)
    parser.add_argument("--scenario", required=True, choices=[s for s in SCENARIOS if s != "sweep"])
    for name, kind in (("--runs", int), ("--warmup", int), ("--batch-size", int), ("--cache", str),
                       ("--save-artifacts", str), ("--load-artifacts", str), ("--dynamic", str)):
        parser.add_argument(name, type=kind, default=None)
    parser.add_argument("--optimizer-step", default="compiled")
    parser.add_argument("--kernel-profile", action="store_true")
    parser.add_argument("--deviation", action="store_true", help="the first call's output against eager's")
    parser.add_argument("--precompile", action="store_true", help="torch._dynamo.config.caching_precompile")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_scenario"]:
        return child_scenario(_child_parser().parse_args(argv[1:]))
    args = build_parser().parse_args(argv)
    args.argv = argv
    harness.log_to_stderr(args.verbose)
    if args.runs < 1 or args.warmup < 0 or args.timeout <= 0 or args.latency_processes < 1:
        raise SystemExit("--runs and --latency-processes must be >= 1, --warmup >= 0 and --timeout > 0")
    if args.dynamic == "auto" and args.batch_size is None:
        raise SystemExit("--dynamic auto needs --batch-size: its second call runs at twice that")
    return benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
