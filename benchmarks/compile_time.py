"""Compile time and latency: default vs max-autotune vs sweep + warm-start, with anchors.

For each model file, each scenario runs in its own fresh process with fresh
TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR, so no local cache carries over:

- ``default``: ``torch.compile(model)``;
- ``max-autotune-cold``: ``torch.compile(model, mode="max-autotune")``;
- ``sweep``: ``autotune sweep MODEL --cache sqlite:///<tmp>/cache.db --json`` (``--train``
  for a training-step file), with ``AUTOTUNE_SIGNING_KEY`` set when
  ``warm-start-artifacts`` is run: the sweep then publishes signed artifacts;
- ``warm-start``: ``autotune.warm_start(<same db>)``, then ``mode="max-autotune"``;
- ``warm-start-artifacts``: the same with ``AUTOTUNE_TRUSTED_KEYS=<key>.pub``: the
  hook also loads the sweep's signed compiled artifacts;
- ``max-autotune-megacache``: ``torch.compiler.load_cache_artifacts()`` of what
  ``max-autotune-cold`` saved with ``torch.compiler.save_cache_artifacts()`` after
  its first call, then ``mode="max-autotune"``;
- ``max-autotune-megacache-precompile``: the same with
  ``torch._dynamo.config.caching_precompile`` on, at the save and at the load;
- ``floor``: default mode + Mega-cache + caching_precompile, from the ``default-precompile``
  scenario's own save: what a compile costs when everything is cached.

Each model scenario records the first call (compile + first run, synchronized;
for a training-step file, the first full training step), the median latency
over ``--runs`` calls after warm-up, every benchmark Inductor ran at the first
call (GEMM autotuning, pointwise autotuning, coordinate descent, and every call
into its Benchmarker), a phase breakdown of the first call, and for the hook
scenarios the hook's stats. Results go to ``<out>/compile_time_<gpu>.json`` and
``.md``; scenarios already in the JSON for other models/scenarios are kept
(``--no-merge`` starts afresh).

    python benchmarks/compile_time.py --models resnet
    python benchmarks/compile_time.py --models mlp --scenarios default,max-autotune-cold --runs 20
    python benchmarks/compile_time.py --models examples/gpt.py --runs 200 --out /tmp/results

A model file is a training step when it defines ``train_step(model, optimizer,
inputs)`` (see ``examples/lm_train.py``): the child compiles the module and the
optimizer's step, and times full steps.

A scenario that fails or times out is recorded with its error. The parent
process never imports torch (children do), so ``--help`` works anywhere.
Internal entry points: ``_scenario`` and ``_info`` (one child each).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime as dt
import functools
import importlib.abc
import importlib.machinery
import inspect
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
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

log = logging.getLogger("compile_time")

REPO = Path(__file__).resolve().parents[1]
PYCACHE = Path(tempfile.gettempdir()) / "autotune-bench-pycache"
# What the bytecode warm-up imports: every compile's stack, the hook and the cache.
WARM_IMPORTS = ("torch", "torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.select_algorithm",
                "autotune.hook", "autotune.artifacts", "autotune.cache.store", "sqlalchemy.dialects.sqlite.pysqlite",
                "sqlalchemy.dialects.postgresql.psycopg", "alembic.command", "alembic.script", "ray", "cli",
                "autotune.workers.child", "autotune.workers.tune")
MARKER = "RESULT "
MODELS: dict[str, str] = {
    "resnet": "examples/resnet.py",
    "gpt": "examples/gpt.py",
    "gpt2_hf": "examples/gpt2_hf.py",
    "lm_train": "examples/lm_train.py",
    "mlp": "examples/mlp.py",  # the CPU example (freezing on)
}
DEFAULT_MODELS: tuple[str, ...] = ("resnet", "gpt", "gpt2_hf", "lm_train")
ARTIFACTS = "warm-start-artifacts"
SCENARIOS: tuple[str, ...] = ("default", "max-autotune-cold", "sweep", "warm-start", ARTIFACTS,
                              "max-autotune-megacache", "max-autotune-megacache-precompile",
                              "default-precompile", "floor", "warm-start-unpinned", "warm-start-nofusion")
# warm-start-unpinned: the hook without pinning and without pointwise configs (what
# it did before both existed); it shows what those two save. warm-start-nofusion:
# the hook with Inductor's epilogue-fusion benchmarks off. Not run unless named.
DEFAULT_SCENARIOS: tuple[str, ...] = SCENARIOS[:9]
MODES: dict[str, str] = {"default": "default", "max-autotune-cold": "max-autotune", "warm-start": "max-autotune",
                         ARTIFACTS: "max-autotune", "max-autotune-megacache": "max-autotune",
                         "max-autotune-megacache-precompile": "max-autotune", "default-precompile": "default",
                         "floor": "default",
                         "warm-start-unpinned": "max-autotune", "warm-start-nofusion": "max-autotune"}
WARM = ("warm-start", ARTIFACTS, "warm-start-unpinned", "warm-start-nofusion")  # install the hook
# Mega-cache anchors: scenario -> (the scenario of the same run whose save it loads,
# caching_precompile on at both ends).
MEGACACHE_LOADS: dict[str, tuple[str, bool]] = {
    "max-autotune-megacache": ("max-autotune-cold", False),
    "max-autotune-megacache-precompile": ("max-autotune-cold", True),
    # The floor's save comes from a default-mode compile of its own, so that the
    # denominator of every goal (``default``) runs without caching_precompile.
    "floor": ("default-precompile", True),
}
SCENARIO_ENV: dict[str, dict[str, str]] = {
    "warm-start-unpinned": {"AUTOTUNE_PIN": "0", "AUTOTUNE_KERNEL_CONFIGS": "0"},
    "warm-start-nofusion": {"TORCHINDUCTOR_BENCHMARK_EPILOGUE_FUSION": "0"},
}
KEY_VARIABLES = ("AUTOTUNE_SIGNING_KEY", "AUTOTUNE_TRUSTED_KEYS")
LATENCY_TOLERANCE = 0.03  # warm-start latency may be at most 3% above max-autotune-cold
ARTIFACT_FIRST_CALL_GOAL = 0.50  # warm-start-artifacts first call <= 0.50x default's
TAIL_CHARS = 4000
# The first call's phases, in order (see derive_phases), and their short table labels.
PHASES: tuple[str, ...] = ("setup", "dynamo", "aot", "lowering", "tune", "codegen", "kernels", "run")
PHASE_LABELS: tuple[str, ...] = ("setup", "dyn", "aot", "low", "tune", "gen", "kern", "run")
BENCH_KINDS: tuple[str, ...] = ("gemm_autotune", "pointwise_autotune", "coordinate_descent", "benchmarker_calls")
BENCHMARKING_MODULE = "torch._inductor.runtime.benchmarking"
# --dynamic: torch.compile's ``dynamic`` argument. "auto" keeps torch's default (None) and
# calls the model a second time at twice the batch size, after the first call: that
# call recompiles with a dynamic batch (automatic dynamic shapes), as a job does whose
# batch size changes. Without --dynamic the child passes nothing (torch's default).
DYNAMIC: dict[str, bool | None] = {"static": False, "auto": None, "true": True}


# ============================================================== shared (no torch)


def derive_phases(seconds: dict[str, float], first_call_s: float, setup_s: float) -> dict[str, float]:
    """Split the first call into phases from Dynamo's ``compile_times`` (summed per name).

    The timed functions nest: ``_compile.compile_inner`` (a frame) holds
    ``OutputGraph.call_user_compiler`` (the backend), which holds AOTAutograd,
    which holds ``compile_fx_inner`` (Inductor, forward and backward). Inside it,
    lowering is the post-grad passes and ``GraphLowering.run``, codegen is
    ``GraphLowering.codegen``, and the rest is kernel compile and load (the module
    load and async compile wait, or an FX-graph-cache lookup and load, which on a
    CPU compiles the C++ kernels again). A lazily compiled backward is
    ``backward._backward_impl``, outside any frame; an AOTAutograd cache hit loads
    its graphs in ``AOTAutogradCache.inductor_load``. GEMM autotuning
    (``<op>_template_autotuning``) and candidate compilation
    (``<op>_template_precompiling``) run inside lowering, or inside codegen when
    Inductor defers the choice to the scheduler: they are taken out of whichever
    can hold them. Pointwise autotuning and coordinate descent run at the first
    launch, inside the run. Names missing in a torch version count as 0, and each
    phase is clamped at 0: the phases are estimates that add up to the first call.
    """

    def get(*names: str) -> float:
        return sum(float(seconds.get(name, 0.0) or 0.0) for name in names)

    def suffixed(suffix: str) -> float:
        return sum(float(v or 0.0) for k, v in seconds.items() if k.endswith(suffix))

    frames, backend = get("_compile.compile_inner"), get("OutputGraph.call_user_compiler")
    lazy_bw, inductor = get("backward._backward_impl"), get("compile_fx_inner")
    lowering_raw = get("_recursive_post_grad_passes", "additional_fake_tensor_prop", "GraphLowering.run")
    codegen, aot_cache_load = get("GraphLowering.codegen"), get("AOTAutogradCache.inductor_load")
    gemm_tune, gemm_compile = suffixed("_template_autotuning"), suffixed("_template_precompiling")
    runtime_tune = get("CachingAutotuner.benchmark_all_configs", "CachingAutotuner.coordinate_descent_tuning")

    in_lowering = min(gemm_tune + gemm_compile, lowering_raw)
    in_codegen = min(gemm_tune + gemm_compile - in_lowering, codegen)
    phases = {
        "setup": setup_s,
        "dynamo": frames - backend,
        "aot": backend + lazy_bw - inductor - aot_cache_load,
        "lowering": lowering_raw - in_lowering,
        "tune": gemm_tune + runtime_tune,
        "codegen": codegen - in_codegen,
        "kernels": inductor - lowering_raw - codegen + aot_cache_load + gemm_compile,
        "run": first_call_s - setup_s - frames - lazy_bw - runtime_tune,
    }
    return {name: round(max(0.0, value), 4) for name, value in phases.items()}


def benchmark_total(bench: dict[str, Any] | None) -> int | None:
    """Benchmarks of any kind: 0 only when every kind is 0 (the kinds overlap: one GEMM
    autotune is many Benchmarker calls), so this is a zero test, not a count."""
    if not bench:
        return None
    return sum(int(bench.get(kind) or 0) for kind in BENCH_KINDS)


def is_training_file(path: str | Path) -> bool:
    """A training-step model file defines ``train_step`` at module level (read without
    importing it: the parent never imports torch)."""
    try:
        tree = ast.parse(Path(path).read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "train_step"
               for node in tree.body)


# ============================================================== child processes


def _emit(payload: dict[str, Any]) -> None:
    """The child's one result line; everything else on stdout is ignored."""
    sys.stdout.write(MARKER + json.dumps(payload, default=str) + "\n")
    sys.stdout.flush()


def _load_model_file(path: str) -> ModuleType:
    import importlib.util

    from autotune.inductor_glue.modelfile import module_name_for

    # The module name the sweep gives the file too (its stem, as a job's `import` names it):
    # a Dynamo package another process saved finds the model's classes by module and name.
    name = module_name_for(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)  # may set torch._inductor.config, as the contract allows
    return module


def _to(value: Any, device: str) -> Any:
    import torch

    return value.to(device) if isinstance(value, torch.Tensor) else value


def _inductor_counter(name: str) -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"][name])


class BenchmarkCounter:
    """Every call into Inductor's Benchmarker in this process.

    GEMM candidates, pointwise configs, coordinate-descent steps, epilogue-fusion
    and padding checks all time their callables through a ``Benchmarker.benchmark*``
    method; a nested call (``benchmark`` -> ``benchmark_cpu``) counts once.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.wrapped: list[str] = []
        self.kernels: dict[str, int] = {}  # Triton kernel -> its outermost benchmark calls (autotune, CD)
        self._local = threading.local()

    def patch(self, module: ModuleType) -> None:
        base = getattr(module, "Benchmarker", None)
        if not isinstance(base, type):
            return
        classes = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, base)]
        for cls in classes:
            for name, fn in list(vars(cls).items()):
                if name.startswith("benchmark") and inspect.isfunction(fn):
                    setattr(cls, name, self._counting(fn))
                    self.wrapped.append(f"{cls.__name__}.{name}")

    def _counting(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._local, "depth", 0)
            if depth == 0:
                self.calls += 1
                kernel = _tuned_kernel()
                if kernel is not None:
                    self.kernels[kernel] = self.kernels.get(kernel, 0) + 1
            self._local.depth = depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._local.depth = depth

        return counted


def _tuned_kernel() -> str | None:
    """The Triton kernel whose autotuner (pointwise autotuning, coordinate descent) is on the
    stack, if any: which kernels a warm start still tunes, by name."""
    frame = sys._getframe(2)
    while frame is not None:
        meta = getattr(frame.f_locals.get("self"), "inductor_meta", None)
        if isinstance(meta, dict) and meta.get("kernel_name"):
            return str(meta["kernel_name"])
        frame = frame.f_back
    return None


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patch a module right after its first import.

    Importing Inductor's benchmarking module up front would pull in Dynamo (~1.6 s
    on a CPU) before the clock starts, and take that out of every first call.
    """

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


def patch_on_import(name: str, patch: Callable[[ModuleType], None]) -> None:
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _PatchOnImport(name, patch))


def _compile_metrics() -> tuple[dict[str, float], dict[str, int]]:
    """Dynamo's compile_times: seconds per timed function (summed) and how often each ran."""
    try:
        from torch._dynamo.utils import compile_times

        names, totals = compile_times(repr="csv", aggregate=True)
        _, each = compile_times(repr="csv", aggregate=False)
    except Exception:  # noqa: BLE001 - diagnostics only
        return {}, {}
    seconds = {str(n): float(v) for n, v in zip(names, totals) if str(v).strip()}
    counts = {str(n): len([x for x in str(v).split(",") if x.strip()]) for n, v in zip(names, each)}
    return seconds, counts


def _benchmarks(counter: BenchmarkCounter) -> dict[str, int]:
    """Every kind of benchmark so far. Pointwise autotuning and coordinate descent are
    counted by Dynamo's timer around each real run of them (an early return is not
    timed), GEMM autotuning by Inductor's own counter."""
    _, counts = _compile_metrics()
    return {
        "gemm_autotune": _inductor_counter("select_algorithm_autotune"),
        "pointwise_autotune": counts.get("CachingAutotuner.benchmark_all_configs", 0),
        "coordinate_descent": counts.get("CachingAutotuner.coordinate_descent_tuning", 0),
        "benchmarker_calls": counter.calls,
    }


def _minus(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in after}


def _cache_counters() -> dict[str, int]:
    """Which compile caches hit: FX graph, AOTAutograd, Dynamo packages (caching_precompile)."""
    from torch._dynamo.utils import counters

    wanted = {"inductor": ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass",
                           # kernels a cached graph brought ready to launch, and those Triton loaded
                           "triton_bundler_load_static_autotuner", "triton_bundler_save_static_autotuner",
                           "async_compile_cache_hit", "async_compile_cache_miss"),
              "aot_autograd": ("autograd_cache_hit", "autograd_cache_miss", "autograd_cache_bypass"),
              "dynamo_cache": ("dynamo_cache_hit", "dynamo_cache_miss", "dynamo_cache_error")}
    found = {name: int(counters[group][name]) for group, names in wanted.items() for name in names}
    return {name: value for name, value in found.items() if value}


# CPU-side calls that start GPU work: one cudaGraphLaunch a call means CUDA graphs replay;
# a kernel launch per kernel means the call runs launch by launch.
_LAUNCH_CALLS = ("cudaGraphLaunch", "cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")


def _kernel_profile(call: Any, sync: Any, calls: int = 10,
                    top: int = 40) -> tuple[list[dict[str, Any]], float, dict[str, float]]:
    """GPU time per kernel and call, the largest first, the summed GPU time per call, and
    the launch calls per call (CUDA graph replays and single kernel launches)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        sync()
    rows, launches = [], {}
    for event in prof.key_averages():
        if event.key in _LAUNCH_CALLS:
            launches[event.key] = event.count / calls
            continue
        if not str(getattr(event, "device_type", "")).endswith("CUDA"):
            continue  # a CPU op carries its kernels' GPU time too: only the kernels are summed
        us = float(getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0) or 0)
        if us > 0:
            rows.append({"kernel": event.key[:120], "us_per_call": us / calls, "launches_per_call": event.count / calls})
    total = sum(r["us_per_call"] for r in rows)
    return sorted(rows, key=lambda r: -r["us_per_call"])[:top], total, launches


@dataclass
class Prepared:
    """The model, its inputs and (for a training step) its optimizer, built before the clock."""

    module: Any
    inputs: tuple[Any, ...]
    train_step: Callable[..., Any] | None = None
    optimizer: Any = None
    second_inputs: tuple[Any, ...] | None = None  # --dynamic auto: the inputs at twice the batch size

    @property
    def train(self) -> bool:
        return self.train_step is not None


def _prepare(path: str, batch_size: int | None, device: str, dynamic: str | None = None) -> Prepared:
    import torch

    file_module = _load_model_file(path)
    module, inputs = file_module.example(batch_size) if batch_size is not None else file_module.example()
    inputs = tuple(_to(x, device) for x in inputs)
    second = _second_inputs(file_module, batch_size, device) if dynamic == "auto" else None
    train_step = getattr(file_module, "train_step", None)
    if not callable(train_step):
        if isinstance(module, torch.nn.Module):
            module = module.to(device).eval()
        return Prepared(module, inputs, second_inputs=second)
    module = module.to(device).train()
    make = getattr(file_module, "make_optimizer", None)
    optimizer = make(module) if callable(make) else torch.optim.AdamW(module.parameters())
    return Prepared(module, inputs, train_step, optimizer, second_inputs=second)


def _second_inputs(file_module: ModuleType, batch_size: int | None, device: str) -> tuple[Any, ...]:
    """The inputs at twice the batch size, from ``example()`` itself (the contract knows
    where the batch is); the module built with them is dropped."""
    if batch_size is None:
        raise ValueError("--dynamic auto needs --batch-size (the second call runs at twice that)")
    _, inputs = file_module.example(2 * batch_size)
    return tuple(_to(x, device) for x in inputs)


def _torch_compile(fn: Any, mode: str, dynamic: str | None = None) -> Any:
    import torch

    kwargs: dict[str, Any] = {} if mode == "default" else {"mode": mode}
    if dynamic is not None:
        kwargs["dynamic"] = DYNAMIC[dynamic]
    return torch.compile(fn, **kwargs)


@dataclass
class OptimizerProbe:
    """The optimizer step's share of the first training step: its compile and run."""

    compiled: bool
    first_s: float | None = None
    benchmarks: dict[str, int] | None = None

    def install(self, optimizer: Any, step: Callable[..., Any], counter: BenchmarkCounter,
                sync: Callable[[], None]) -> None:
        def probed(*args: Any, **kwargs: Any) -> Any:
            if self.first_s is not None:
                return step(*args, **kwargs)
            before, start = _benchmarks(counter), time.perf_counter()
            try:
                return step(*args, **kwargs)
            finally:
                sync()
                self.first_s = time.perf_counter() - start
                self.benchmarks = _minus(_benchmarks(counter), before)

        optimizer.step = probed  # an instance attribute: train_step's optimizer.step() lands here

    def as_dict(self) -> dict[str, Any]:
        return {"compiled": self.compiled, "first_step_s": self.first_s, "benchmarks": self.benchmarks,
                "caching_precompile": False}


def _compile_workload(prepared: Prepared, mode: str, args: argparse.Namespace, counter: BenchmarkCounter,
                      sync: Callable[[], None]) -> tuple[Callable[[tuple[Any, ...]], Any], OptimizerProbe | None]:
    """torch.compile the model (and the optimizer step, whose shapes never change, so with
    torch's default ``dynamic``); return one call or one training step on given inputs."""
    import torch

    compiled = _torch_compile(prepared.module, mode, getattr(args, "dynamic", None))
    if not prepared.train:
        return (lambda inputs: compiled(*inputs)), None
    probe = OptimizerProbe(compiled=args.optimizer_step == "compiled")
    step = prepared.optimizer.step
    if probe.compiled:
        # Kept out of caching_precompile: with the optimizer's deliberate graph breaks
        # (Optimizer._use_grad), torch 2.13 fails to load the package in a fresh
        # process ("Name '__resume_at_...' already exists in scope"). Its graphs still
        # go through the FX graph and AOTAutograd caches (so through Mega-cache).
        no_precompile = {"caching_precompile": False} if hasattr(torch._dynamo.config, "caching_precompile") else {}
        with torch._dynamo.config.patch(**no_precompile):
            step = _torch_compile(step, mode)
    probe.install(prepared.optimizer, step, counter, sync)
    train_step, optimizer = prepared.train_step, prepared.optimizer
    assert train_step is not None
    return (lambda inputs: train_step(compiled, optimizer, inputs)), probe


def _setup(args: argparse.Namespace, result: dict[str, Any]) -> Any:
    """What runs before torch.compile inside the timed first call: the hook's install
    (``import autotune`` included) or the Mega-cache load. Returns the hook's handle."""
    handle = None
    if args.scenario in WARM:
        # Timed apart: the modules the hook needs are ones every compile imports anyway
        # (Dynamo, Inductor's lowering and select_algorithm); what is left is the hook's own.
        start = time.perf_counter()
        import torch._inductor.select_algorithm  # noqa: F401

        result["setup_imports_s"] = time.perf_counter() - start
        if os.environ.get("AUTOTUNE_BENCH_NO_PREWARM"):  # a diagnostic: the hook without its prewarm
            import autotune.inductor_glue.env

            autotune.inductor_glue.env.prewarm_triton_backend = lambda: None
            result["prewarm"] = False
        import autotune

        handle = autotune.warm_start(args.cache)
    if args.precompile:  # before the load: the Dynamo packages it carries go to Dynamo's cache
        import torch

        torch._dynamo.config.caching_precompile = True
    if args.load_artifacts:
        result["megacache_loaded"] = _load_megacache(args.load_artifacts)
    return handle


def _artifact_counts(info: Any) -> dict[str, int]:
    artifacts = getattr(info, "artifacts", None) or {}
    return {str(kind): len(keys) for kind, keys in dict(artifacts).items()}


def _load_megacache(path: str) -> dict[str, Any]:
    import torch

    source = Path(path)
    if not source.is_file():
        return {"loaded": False, "bytes": 0, "note": "the source scenario saved nothing"}
    data = source.read_bytes()
    info = torch.compiler.load_cache_artifacts(data)
    return {"loaded": info is not None, "bytes": len(data), "artifacts": _artifact_counts(info)}


def _save_megacache(path: str) -> dict[str, Any]:
    """Save after the first call, outside its timing; an error is recorded, not raised."""
    import torch

    start = time.perf_counter()
    try:
        saved = torch.compiler.save_cache_artifacts()
    except Exception as exc:  # noqa: BLE001 - e.g. caching_precompile refusing a model
        return {"error": f"{type(exc).__name__}: {exc}", "save_s": time.perf_counter() - start}
    seconds = time.perf_counter() - start
    if saved is None:
        return {"bytes": 0, "artifacts": {}, "save_s": seconds, "note": "save_cache_artifacts() returned None"}
    data, info = saved
    Path(path).write_bytes(data)
    return {"bytes": len(data), "artifacts": _artifact_counts(info), "save_s": seconds}


def _measure(call: Callable[[], Any], sync: Callable[[], None], device: str, runs: int,
             warmup: int) -> tuple[list[float], list[float]]:
    """Wall and CUDA-event milliseconds per call, after warm-up."""
    import torch

    for _ in range(warmup):
        call()
    sync()
    wall_ms: list[float] = []
    gpu_ms: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            call()
            end.record()
            sync()
            gpu_ms.append(begin.elapsed_time(end))
        else:
            call()
        wall_ms.append((time.perf_counter() - t0) * 1e3)
    return wall_ms, gpu_ms


def _latency(wall_ms: list[float], gpu_ms: list[float]) -> dict[str, Any]:
    return {"median_ms": statistics.median(wall_ms) if wall_ms else None,
            "min_ms": min(wall_ms) if wall_ms else None,
            "mean_ms": statistics.fmean(wall_ms) if wall_ms else None,
            "median_gpu_ms": statistics.median(gpu_ms) if gpu_ms else None}


class _FirstCallProfile:
    """cProfile of the timed first call, when ``AUTOTUNE_BENCH_CPROFILE=DIR`` is set: the
    top functions by cumulative and by own time go to DIR/<model>-<scenario>.txt, the whole
    profile to .prof beside it (pstats). A diagnostic: the profiler slows the call, so its
    first-call figure is not comparable; and on Python 3.12 cProfile also sees the other
    threads, so callers and cumulative times mix theirs in (py-spy: AUTOTUNE_BENCH_PYSPY)."""

    TOP = 60

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.profile: Any = None

    @classmethod
    def from_env(cls, args: argparse.Namespace) -> _FirstCallProfile:
        folder = os.environ.get("AUTOTUNE_BENCH_CPROFILE")
        if not folder:
            return cls(None)
        return cls(Path(folder) / f"{Path(args.model).stem}-{args.scenario}.txt")

    def start(self) -> None:
        if self.path is not None:
            import cProfile

            self.profile = cProfile.Profile()
            self.profile.enable()

    def stop(self) -> None:
        if self.profile is None or self.path is None:
            return
        import io
        import pstats

        self.profile.disable()
        text = io.StringIO()
        for order in ("cumulative", "tottime"):
            pstats.Stats(self.profile, stream=text).sort_stats(order).print_stats(self.TOP)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(text.getvalue())
        self.profile.dump_stats(str(self.path.with_suffix(".prof")))  # for callers/callees later
        self.profile = None


def child_scenario(args: argparse.Namespace) -> int:
    """Compile one model one way in this (fresh) process and report one RESULT line."""
    result: dict[str, Any] = {"scenario": args.scenario, "model": args.model, "status": "error"}
    every = os.environ.get("AUTOTUNE_BENCH_STACKS")
    if every:  # a diagnostic: where a slow or stuck scenario spends its time, in its log
        import faulthandler

        faulthandler.dump_traceback_later(float(every), repeat=True, file=sys.stderr)
    counter = BenchmarkCounter()
    patch_on_import(BENCHMARKING_MODULE, counter.patch)
    try:
        _run_scenario(args, result, counter)
    except BaseException as exc:  # noqa: BLE001 - the parent gets the error, whatever it is
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-TAIL_CHARS:]
        _emit(result)
        return 1
    _emit(result)
    return 0


def _run_scenario(args: argparse.Namespace, result: dict[str, Any], counter: BenchmarkCounter) -> None:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    prepared = _prepare(args.model, args.batch_size, device, args.dynamic)
    if device == "cuda":
        torch.ones(1, device=device).sum().item()  # CUDA context up before the clock starts
    mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    mode = MODES[args.scenario]
    result.update(device=device, mode=mode, train=prepared.train, caching_precompile=bool(args.precompile),
                  dynamic=args.dynamic)

    with contextlib.nullcontext() if prepared.train else torch.no_grad():
        profiler = _FirstCallProfile.from_env(args)
        sync()
        start = time.perf_counter()
        profiler.start()
        handle = _setup(args, result)
        setup_s = time.perf_counter() - start
        work, probe = _compile_workload(prepared, mode, args, counter, sync)

        def call(inputs: tuple[Any, ...] = prepared.inputs) -> Any:
            if mark_step is not None and device == "cuda":
                mark_step()  # max-autotune uses CUDA graphs; each call is a new step
            return work(inputs)

        call()
        sync()
        first_call_s = time.perf_counter() - start
        profiler.stop()
        first_bench = _benchmarks(counter)
        if counter.kernels:
            result["tuned_kernels"] = dict(counter.kernels)
        seconds, _ = _compile_metrics()
        result.update(first_call_s=first_call_s, setup_s=setup_s, bench=first_bench,
                      phases=derive_phases(seconds, first_call_s, setup_s), compile_phases=seconds,
                      caches=_cache_counters(), benchmarker_methods=counter.wrapped)
        if handle is not None:
            result["hook_install_s"] = setup_s
        if probe is not None:
            result["optimizer"] = probe.as_dict()
        if prepared.second_inputs is not None:
            result["recompile"] = _second_call(call, prepared.second_inputs, sync, counter, handle)
            first_bench = _benchmarks(counter)  # bench_after_first_call: after the recompile too
        if args.save_artifacts:
            result["megacache_saved"] = _save_megacache(args.save_artifacts)
        wall_ms, gpu_ms = _measure(call, sync, device, args.runs, args.warmup)
        if args.kernel_profile and device == "cuda":
            result["kernels"], result["kernel_us_per_call"], result["launch_calls"] = _kernel_profile(call, sync)
    result.update(status="ok", runs=args.runs, **_latency(wall_ms, gpu_ms),
                  benchmarks=_inductor_counter("select_algorithm_autotune"),
                  precompiles=_inductor_counter("select_algorithm_precompile"),
                  bench_after_first_call=_minus(_benchmarks(counter), first_bench),
                  cudagraph_skips=_inductor_counter("cudagraph_skips"))
    if handle is not None:
        _record_hook(result, handle)


def _second_call(call: Callable[[tuple[Any, ...]], Any], inputs: tuple[Any, ...], sync: Callable[[], None],
                 counter: BenchmarkCounter, handle: Any) -> dict[str, Any]:
    """``--dynamic auto``: one call at twice the batch size, right after the first call.
    Dynamo recompiles with a dynamic batch; this records what that costs: seconds, graphs
    compiled, benchmarks of every kind, and the hook's lookups during it."""
    from torch._dynamo.utils import counters

    hook_before = handle.stats.as_dict() if handle is not None else None
    bench_before, graphs_before = _benchmarks(counter), int(counters["stats"]["unique_graphs"])
    start = time.perf_counter()
    call(inputs)
    sync()
    out: dict[str, Any] = {"seconds": time.perf_counter() - start, "batch_factor": 2,
                           "graphs": int(counters["stats"]["unique_graphs"]) - graphs_before,
                           "bench": _minus(_benchmarks(counter), bench_before)}
    if hook_before is not None:
        after = handle.stats.as_dict()
        out["hook"] = {key: after[key] - hook_before[key] for key in ("hits", "misses", "written", "errors")}
    return out


def _record_hook(result: dict[str, Any], handle: Any) -> None:
    stats = handle.stats.as_dict()
    result["hook"] = stats
    for key in ("artifacts_loaded", "artifacts_rejected"):
        if key in stats:
            result[key] = stats[key]
    handle.uninstall()


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
    for name in KEY_VARIABLES:  # a key in the caller's shell would turn every warm-start into an artifact one
        env.pop(name, None)
    inductor, triton = cache_root / "inductor", cache_root / "triton"
    inductor.mkdir(parents=True, exist_ok=True)
    triton.mkdir(parents=True, exist_ok=True)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor)
    env["TRITON_CACHE_DIR"] = str(triton)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    # Compiled bytecode, as a normal install has it: where site-packages is read-only (the
    # device image) every process would otherwise recompile ~1,400 torch modules (~5 s).
    env.setdefault("PYTHONPYCACHEPREFIX", str(PYCACHE))
    if cache_url:
        env["AUTOTUNE_CACHE"] = cache_url
    return env


# A child cut at its timeout is told to stop first (SIGTERM), and killed this long after: a
# sweep's end-to-end pass stores the kernel configs it tuned (autotune/pointwise.py), so the
# next attempt goes on from them instead of from nothing.
STOP_GRACE_S = 30.0


def _run(cmd: list[str], env: dict[str, str], timeout: float, log_path: Path | None) -> Completed:
    """Run a child in its own process group; on timeout stop that group, then kill it."""
    log.debug("running %s", " ".join(cmd))
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGTERM)  # the child's own group: it, its pass, its compile workers
        try:
            stdout, stderr = proc.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        rc = None
    wall = time.perf_counter() - start
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(f"$ {' '.join(cmd)}\n# rc={rc} wall={wall:.1f}s\n--- stdout\n{stdout}\n--- stderr\n{stderr}")
    return Completed(rc, stdout or "", stderr or "", wall)


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass


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


def _autotune_cli() -> list[str]:
    return [sys.executable, "-c", "from autotune.cli import main; main(prog_name='autotune')"]


@dataclass
class ModelRun:
    """One model's scenarios in one run: its temporary directory, the cache, the
    signing key, and who saves Mega-cache for whom."""

    name: str
    path: str
    scenarios: list[str]
    tmp: Path
    cache_url: str
    train: bool
    signing_key: str | None = None  # private key; PATH.pub is trusted by warm-start-artifacts
    key_error: str | None = None
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def saves(self, scenario: str) -> tuple[bool, bool]:
        """(save Mega-cache after the first call, with caching_precompile on)."""
        loaders = [flags for name, flags in MEGACACHE_LOADS.items() if name in self.scenarios and flags[0] == scenario]
        return bool(loaders), any(precompile for _, precompile in loaders)

    def megacache_path(self, source: str) -> Path:
        return self.tmp / f"{source}.megacache"


class Skipped(Exception):
    """A scenario that cannot run in this run (a prerequisite failed); the message says why."""


def _scenario_flags(scenario: str, run: ModelRun) -> tuple[list[str], dict[str, str]]:
    """The child's extra arguments and environment for ``scenario``; raises Skipped."""
    flags: list[str] = []
    env = dict(SCENARIO_ENV.get(scenario, {}))
    if scenario in WARM:
        flags += ["--cache", run.cache_url]
    save, save_precompile = run.saves(scenario)
    if save:
        flags += ["--save-artifacts", str(run.megacache_path(scenario))]
    load_precompile = False
    if scenario in MEGACACHE_LOADS:
        source, load_precompile = MEGACACHE_LOADS[scenario]
        _check_source(source, load_precompile, run)
        flags += ["--load-artifacts", str(run.megacache_path(source))]
    if save_precompile or load_precompile:
        flags += ["--precompile"]
    if scenario == ARTIFACTS:
        if not run.signing_key:
            why = run.key_error or "none was made (run the sweep, or pass --signing-key)"
            raise Skipped(f"no signing key to trust: {why}")
        env["AUTOTUNE_TRUSTED_KEYS"] = run.signing_key + ".pub"
    return flags, env


def _check_source(source: str, precompile: bool, run: ModelRun) -> None:
    done = run.results.get(source) or {}
    if done.get("status") != "ok":
        raise Skipped(f"needs a successful {source} in the same run (it was {done.get('status', 'not run')})")
    saved = done.get("megacache_saved") or {}
    if saved.get("error"):
        raise Skipped(f"{source} could not save its Mega-cache: {saved['error']}")
    if precompile and done.get("caching_precompile_error"):
        raise Skipped(f"{source} failed with caching_precompile on: {done['caching_precompile_error']}")


def run_model_scenario(scenario: str, run: ModelRun, args: argparse.Namespace,
                       log_path: Path | None) -> dict[str, Any]:
    try:
        flags, extra_env = _scenario_flags(scenario, run)
    except Skipped as skip:
        return {"scenario": scenario, "status": "error", "error": str(skip)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "_scenario", "--model", run.path, "--scenario", scenario,
           "--runs", str(args.runs), "--warmup", str(args.warmup), "--optimizer-step", args.optimizer_step] + flags
    if getattr(args, "dynamic", None):
        cmd += ["--dynamic", args.dynamic]
    if args.batch_size is not None:
        cmd += ["--batch-size", str(args.batch_size)]
    if args.kernel_profile:
        cmd += ["--kernel-profile"]
    done = _run(_sampled(cmd, run.name, scenario), _scenario_env(scenario, run, extra_env, args, scenario),
                args.timeout, log_path)
    result = _scenario_result(done, args.timeout)
    result.update(scenario=scenario, process_wall_s=done.wall_s)
    if result["status"] == "error" and "--precompile" in cmd and scenario not in MEGACACHE_LOADS:
        result = _without_precompile(scenario, run, cmd, extra_env, result, args, log_path)
    return result


def _sampled(cmd: list[str], model: str, scenario: str) -> list[str]:
    """``AUTOTUNE_BENCH_PYSPY=DIR``: the child runs under py-spy, which samples every thread's
    stack by wall clock (waits included) into DIR/<model>-<scenario>.txt (collapsed stacks). A
    diagnostic, like AUTOTUNE_BENCH_CPROFILE: it shows what overlaps and what waits, which
    cProfile (the main thread, by CPU time) cannot."""
    folder = os.environ.get("AUTOTUNE_BENCH_PYSPY")
    if not folder or shutil.which("py-spy") is None:
        return cmd
    Path(folder).mkdir(parents=True, exist_ok=True)
    out = Path(folder) / f"{model}-{scenario}.txt"
    return ["py-spy", "record", "--idle", "--threads", "--nonblocking", "--rate", "200", "--format", "raw",
            "-o", str(out), "--"] + cmd


def _scenario_env(scenario: str, run: ModelRun, extra_env: dict[str, str], args: argparse.Namespace,
                  cache_dir: str) -> dict[str, str]:
    env = {**_child_env(run.tmp / cache_dir, run.cache_url if scenario in WARM else None), **extra_env}
    if args.kernel_profile:
        env["TORCH_LOGS"] = "perf_hints"  # why CUDA graphs were skipped, if they were
    return env


def _without_precompile(scenario: str, run: ModelRun, cmd: list[str], extra_env: dict[str, str],
                        failed: dict[str, Any], args: argparse.Namespace, log_path: Path | None) -> dict[str, Any]:
    """A saving scenario that failed under caching_precompile runs again without it: its own
    figures (default, max-autotune-cold) matter more than the anchors that need the option.
    Fresh cache directories: the failed attempt may have filled the FX graph cache."""
    log.warning("%s %s failed with caching_precompile on (%s): running it again without", run.name, scenario,
                failed.get("error"))
    retry_log = log_path.with_name(log_path.stem + "-retry.log") if log_path else None
    env = _scenario_env(scenario, run, extra_env, args, scenario + "-retry")
    done = _run([c for c in cmd if c != "--precompile"], env, args.timeout, retry_log)
    result = _scenario_result(done, args.timeout)
    result.update(scenario=scenario, process_wall_s=done.wall_s,
                  caching_precompile_error=failed.get("error"), caching_precompile_traceback=failed.get("traceback"))
    return result


def _scenario_result(done: Completed, timeout: float) -> dict[str, Any]:
    payload = _marker_payload(done.stdout)
    if done.rc is None:
        result = {"status": "timeout", "error": f"timed out after {timeout:.0f} s"}
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
    return result


def make_key_pair(directory: Path, timeout: float) -> tuple[str | None, str | None]:
    """``autotune keys new`` in the run's temporary directory: (private key path, error)."""
    path = directory / "keys" / "signing"
    path.parent.mkdir(parents=True, exist_ok=True)
    done = _run(_autotune_cli() + ["keys", "new", str(path)], _child_env(directory / "keys-env", None),
                min(timeout, 120), None)
    if done.rc == 0 and path.is_file() and Path(str(path) + ".pub").is_file():
        return str(path), None
    why = "timed out" if done.rc is None else f"exited {done.rc}"
    return None, f"`autotune keys new` {why}: {(done.stderr or done.stdout).strip()[-300:]}"


def run_sweep(run: ModelRun, args: argparse.Namespace, log_path: Path | None) -> dict[str, Any]:
    signing: dict[str, Any] = {}
    if ARTIFACTS in run.scenarios and not run.signing_key:
        run.signing_key, run.key_error = make_key_pair(run.tmp, args.timeout)
        signing = {"key": run.signing_key, "error": run.key_error}
    cmd = _autotune_cli() + ["sweep", run.path, "--cache", run.cache_url, "--json"]
    if args.batch_size is not None:
        cmd += ["--batch-sizes", str(args.batch_size)]
    extra = list(args.sweep_arg or ())
    if run.train and "--train" not in extra:
        cmd += ["--train"]  # the training step's backward graph too
    cmd += extra
    env = _child_env(run.tmp / "sweep", run.cache_url)
    if run.signing_key:
        # Publish the end-to-end compile's artifacts: for this run's warm-start-artifacts, or,
        # with --signing-key, for a later run reading the same --cache.
        env["AUTOTUNE_SIGNING_KEY"] = run.signing_key
    done = _run(cmd, env, args.timeout, log_path)
    result: dict[str, Any] = {"scenario": "sweep", "command": "autotune " + " ".join(cmd[3:]),
                              "wall_s": done.wall_s, "process_wall_s": done.wall_s, "rc": done.rc,
                              "signed": "AUTOTUNE_SIGNING_KEY" in env}
    if signing:
        result["signing"] = signing
    report = _sweep_payload(done.stdout)
    if report is not None:
        result.update(_sweep_totals(report))
    result.update(_sweep_status(done, report, args.timeout))
    if result["status"] != "ok":
        result["stderr_tail"] = _tail(done.stderr)
        result["stdout_tail"] = _tail(done.stdout)
    return result


def _sweep_totals(report: dict[str, Any]) -> dict[str, Any]:
    totals = report.get("totals", {})
    statuses: dict[str, int] = {}  # per request: ok, cached, key_mismatch, compile_error, ...
    for request in report.get("requests") or ():
        statuses[str(request.get("status"))] = statuses.get(str(request.get("status")), 0) + 1
    return {"statuses": statuses,
            "sweep_wall_s": totals.get("wall_seconds"), "capture_s": totals.get("capture_seconds"),
            "found": totals.get("found"), "cached": totals.get("cached"), "tuned": totals.get("tuned"),
            "failed": totals.get("failed"), "device_name": report.get("device_name"),
            "startup_s": totals.get("startup_seconds"), "tuning_s": totals.get("tuning_seconds"),
            "pointwise": report.get("pointwise"),
            # When a cut sweep's end-to-end pass was started again, beside capture (None: it was not).
            "resumed_pass_s": (report.get("timeline") or {}).get("resumed_pass_go")}


def _sweep_status(done: Completed, report: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
    if done.rc is None and report is not None:
        # The report is the sweep's last word, printed once everything was stored: only its
        # teardown (Ray's) was cut. An H100 zoo run lost a T5 sweep's 448 s so (run 114).
        return {"status": "ok", "note": f"cut at {timeout:.0f} s after its report, in its teardown"}
    if done.rc is None:
        return {"status": "timeout", "error": f"timed out after {timeout:.0f} s"}
    if done.rc != 0:
        return {"status": "error", "error": f"sweep exited {done.rc}"}
    if report is None:
        return {"status": "error", "error": "no JSON report with 'totals' on stdout"}
    return {"status": "ok"}


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


def _get(r: dict[str, Any] | None, key: str) -> Any:
    return r.get(key) if r else None


def _goal(name: str, goal: str, value: float | None, met: bool | None) -> dict[str, Any]:
    return {"name": name, "goal": goal, "value": value, "met": met}


def _latency_ratio(r: dict[str, Any] | None, base: dict[str, Any] | None) -> tuple[float | None, str]:
    """Summed GPU kernel time per call when both have a kernel profile, else the wall median."""
    kernel = _ratio(_get(r, "kernel_us_per_call"), _get(base, "kernel_us_per_call"))
    if kernel is not None:
        return kernel, "summed kernel time"
    return _ratio(_get(r, "median_ms"), _get(base, "median_ms")), "wall median"


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The goals for one model, each with its value and whether it is met (None: n/a or a
    ratio that is only reported)."""
    return _warm_start_goals(results) + _artifact_goals(results)


def _warm_start_goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    default, cold = _ok(results, "default"), _ok(results, "max-autotune-cold")
    sweep, warm = _ok(results, "sweep"), _ok(results, "warm-start")
    first = _ratio(_get(warm, "first_call_s"), _get(default, "first_call_s"))
    latency = _ratio(_get(warm, "median_ms"), _get(cold, "median_ms"))
    sweep_ratio = _ratio(_get(sweep, "wall_s"), _get(cold, "first_call_s"))
    return [
        _goal("warm-start first call / default first call", "<= 1.00", first, None if first is None else first <= 1.0),
        _goal("warm-start median latency / max-autotune-cold median latency",
              f"<= {1 + LATENCY_TOLERANCE:.2f} (within {LATENCY_TOLERANCE:.0%})", latency,
              None if latency is None else latency <= 1.0 + LATENCY_TOLERANCE),
        _goal("sweep wall (whole command) / max-autotune-cold first call", "< 1.00", sweep_ratio,
              None if sweep_ratio is None else sweep_ratio < 1.0),
    ]


def _artifact_goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    default, cold, art = _ok(results, "default"), _ok(results, "max-autotune-cold"), _ok(results, ARTIFACTS)
    first = _ratio(_get(art, "first_call_s"), _get(default, "first_call_s"))
    bench = benchmark_total(_get(art, "bench"))
    latency, basis = _latency_ratio(art, cold)
    out = [
        _goal(f"{ARTIFACTS} first call / default first call", f"<= {ARTIFACT_FIRST_CALL_GOAL:.2f}", first,
              None if first is None else first <= ARTIFACT_FIRST_CALL_GOAL),
        _goal(f"{ARTIFACTS} benchmarks of any kind at the first call", "= 0", bench,
              None if bench is None else bench == 0),
        _goal(f"{ARTIFACTS} latency / max-autotune-cold latency ({basis})",
              f"<= {1 + LATENCY_TOLERANCE:.2f} (within {LATENCY_TOLERANCE:.0%})", latency,
              None if latency is None else latency <= 1.0 + LATENCY_TOLERANCE),
    ]
    for anchor in MEGACACHE_LOADS:
        ratio = _ratio(_get(art, "first_call_s"), _get(_ok(results, anchor), "first_call_s"))
        out.append(_goal(f"{ARTIFACTS} first call / {anchor} first call", "report", ratio, None))
    return out


# ------------------------------------------------------------------ output


def _fmt(value: Any, spec: str) -> str:
    return "-" if not isinstance(value, (int, float)) or isinstance(value, bool) else format(value, spec)


def _hook_cell(r: dict[str, Any]) -> str:
    hook = r.get("hook")
    if hook:
        errors = f" ({hook.get('errors')} errors)" if hook.get("errors") else ""
        return f"{hook.get('hits')}/{hook.get('misses')}{errors}"
    return "-"


def _artifacts_cell(r: dict[str, Any]) -> str:
    if "artifacts_loaded" not in r and "artifacts_rejected" not in r:
        return "-"
    return f"{r.get('artifacts_loaded', '-')}/{r.get('artifacts_rejected', '-')}"


def _bench_cell(r: dict[str, Any]) -> str:
    """GEMM autotunes / pointwise autotunes / coordinate descents (Benchmarker calls), at the first call."""
    bench = r.get("bench")
    if not bench:
        return _fmt(r.get("benchmarks"), "d")  # a row from before the per-kind counts
    kinds = "/".join(str(bench.get(kind, "-")) for kind in BENCH_KINDS[:3])
    return f"{kinds} ({bench.get('benchmarker_calls', '-')})"


def _phases_cell(r: dict[str, Any]) -> str:
    phases = r.get("phases")
    if not isinstance(phases, dict):
        return "-"
    return "/".join(_fmt(phases.get(name), ".1f") for name in PHASES)


def _hook_notes(r: dict[str, Any]) -> str:
    hook = r.get("hook") or {}
    if not hook:
        return ""
    notes = ""
    if isinstance(r.get("setup_imports_s"), (int, float)) and isinstance(r.get("setup_s"), (int, float)):
        notes = (f"; setup {r['setup_imports_s']:.1f} s importing Dynamo and Inductor (any compile does) "
                 f"+ {r['setup_s'] - r['setup_imports_s']:.2f} s hook")
    return (f"{notes}; {hook.get('configs_skipped', 0)} Triton configs not generated, "
            f"{hook.get('kernel_configs_loaded', 0)} pointwise configs served")


def _megacache_notes(r: dict[str, Any]) -> str:
    notes = ""
    saved, loaded = r.get("megacache_saved"), r.get("megacache_loaded")
    if r.get("caching_precompile"):
        notes += "; caching_precompile on"
    if r.get("caching_precompile_error"):
        notes += f"; failed with caching_precompile on, ran again without: {str(r['caching_precompile_error'])[:120]}"
    if saved:
        notes += ("; Mega-cache save failed: " + str(saved["error"])[:120] if saved.get("error") else
                  f"; saved Mega-cache {_kib(saved.get('bytes'))} {_kinds(saved.get('artifacts'))} "
                  f"in {_fmt(saved.get('save_s'), '.2f')} s (after the first call)")
    if loaded:
        notes += (f"; loaded Mega-cache {_kib(loaded.get('bytes'))} {_kinds(loaded.get('artifacts'))}"
                  if loaded.get("loaded") else f"; nothing to load ({loaded.get('note', 'empty')})")
    return notes


def _kib(value: Any) -> str:
    return f"{value / 1024:.0f} KiB" if isinstance(value, (int, float)) else "-"


def _kinds(artifacts: Any) -> str:
    if not artifacts:
        return "(no artifacts)"
    return "(" + ", ".join(f"{kind} {count}" for kind, count in sorted(artifacts.items())) + ")"


def _other_notes(r: dict[str, Any]) -> str:
    notes = ""
    if r.get("kernel_us_per_call") is not None:
        notes += f"; kernels {_fmt(r['kernel_us_per_call'] / 1e3, '.3f')} ms/call"
    if r.get("launch_calls"):
        notes += "; launches/call " + ", ".join(f"{name} {count:g}" for name, count in sorted(r["launch_calls"].items()))
    optimizer = r.get("optimizer")
    if optimizer:
        how = "compiled" if optimizer.get("compiled") else "eager"
        notes += (f"; optimizer step ({how}) {_fmt(optimizer.get('first_step_s'), '.1f')} s of the first step, "
                  f"{benchmark_total(optimizer.get('benchmarks')) or 0} benchmarks")
    caches = r.get("caches")
    if caches:
        notes += "; caches " + ", ".join(f"{k.replace('_cache', '')} {v}" for k, v in sorted(caches.items()))
    recompile = r.get("recompile")
    if recompile:
        hook = recompile.get("hook") or {}
        lookups = f", hits/misses {hook.get('hits')}/{hook.get('misses')}" if hook else ""
        notes += (f"; dynamic={r.get('dynamic')}: the call at 2x batch took "
                  f"{_fmt(recompile.get('seconds'), '.1f')} s, "
                  f"{recompile.get('graphs')} graphs, {benchmark_total(recompile.get('bench')) or 0} benchmarks"
                  f"{lookups}")
    elif r.get("dynamic"):
        notes += f"; dynamic={r['dynamic']}"
    later = benchmark_total(r.get("bench_after_first_call"))
    if later:
        notes += f"; {later} benchmarks after the first call"
    return notes


def _sweep_row(r: dict[str, Any]) -> tuple[str, str, str]:
    first = _fmt(r.get("wall_s"), ".1f")
    notes = (f"found {r.get('found', '-')}, tuned {r.get('tuned', '-')}, failed {r.get('failed', '-')}, "
             f"cached {r.get('cached', '-')}; sweep's own wall {_fmt(r.get('sweep_wall_s'), '.1f')} s "
             f"(capture {_fmt(r.get('capture_s'), '.1f')} s, GEMM tuning {_fmt(r.get('tuning_s'), '.1f')} s")
    pointwise = r.get("pointwise") or {}
    if pointwise:
        notes += (f", end-to-end pass {_fmt(pointwise.get('seconds'), '.1f')} s storing "
                  f"{pointwise.get('saved', 0)} configs")
        if "artifacts_published" in pointwise:
            notes += f", publishing {pointwise.get('artifacts_published')} signed artifacts"
        if pointwise.get("republished"):
            notes += f" from a second publishing compile ({pointwise['republished']} withheld)"
    notes += ")" + ("; signed" if r.get("signed") else "")
    signing_error = (r.get("signing") or {}).get("error")
    if signing_error:
        notes += f"; no signing key: {signing_error}"
    return first, _fmt(r.get("tuned"), "d"), notes


def _row(name: str, r: dict[str, Any] | None) -> list[str]:
    if r is None:
        return [name, "not run", "-", "-", "-", "-", "-", "-", ""]
    status = r.get("status", "?")
    if name == "sweep":
        first, bench, notes = _sweep_row(r)
    else:
        first, bench = _fmt(r.get("first_call_s"), ".1f"), _bench_cell(r)
        notes = f"gpu {_fmt(r.get('median_gpu_ms'), '.3f')} ms" if r.get("median_gpu_ms") is not None else ""
        notes = (notes + _hook_notes(r) + _megacache_notes(r) + _other_notes(r)).lstrip("; ")
    if status != "ok":
        notes = f"{status}: {str(r.get('error', ''))[:200]}" + (f"; {notes}" if notes else "")
    notes = " ".join(notes.split()).replace("|", "\\|")  # one table cell: no newlines, no pipes
    return [name, status, first, _fmt(r.get("median_ms"), ".3f"), bench, _hook_cell(r), _artifacts_cell(r),
            _phases_cell(r), notes]


def _met(value: bool | None) -> str:
    return "n/a" if value is None else ("met" if value else "NOT met")


def _goal_value(goal: dict[str, Any]) -> str:
    value = goal["value"]
    return _fmt(value, "d") if isinstance(value, int) and not isinstance(value, bool) else _fmt(value, ".2f")


METHOD = (
    "Each scenario runs in its own fresh process with empty TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR, "
    "and Python bytecode compiled beforehand (PYTHONPYCACHEPREFIX, as a normal install has it). "
    "*First call*: `torch.compile` + the first call, synchronized (for a training-step model: the first full "
    "step, forward + loss + backward + optimizer step), including the *setup*: `import autotune` + "
    "`autotune.warm_start()` for the hook scenarios, reading and `torch.compiler.load_cache_artifacts()` for "
    "the Mega-cache ones. *Median*: wall time per call (per training step), synchronized after each, over the "
    "measured runs after warm-up (`gpu` in notes: the same calls timed with CUDA events; `kernels`: summed GPU "
    "kernel time per call with `--kernel-profile`). *Bench @1st*: benchmarks run by the first call: GEMM "
    "autotunes / pointwise autotunes / coordinate descents, and in parentheses every outermost call into "
    "Inductor's Benchmarker (any kind of benchmark ends there); for the sweep, requests tuned. "
    "*Hits/misses*: the warm-start hook's GEMM stats; *artifacts*: signed artifacts it loaded/rejected. "
    "*Phases* (seconds, from Dynamo's `compile_times` and the script's timers; estimates that add up to the "
    "first call): setup / Dynamo tracing / AOTAutograd and backward / lowering / tuning (GEMM autotuning, "
    "pointwise autotuning, coordinate descent) / codegen / kernel compile and load (cache hits included) / the "
    "rest: the run itself, and whatever compiles or loads outside Dynamo's timers. The sweep's first-call "
    "column is the wall time of the whole `autotune sweep` command (Python "
    "and Ray start-up included); the warm-starts read the database that this sweep filled. The Mega-cache "
    "anchors load what `max-autotune-cold` (or, for `floor`, `default-precompile`) saved after its first call; when "
    "`caching_precompile` is on in a saving scenario (notes), it was on for that scenario's whole compile."
)


def _machine_lines(report: dict[str, Any]) -> list[str]:
    info = report["machine"]
    return [f"# Compile time: {info.get('gpu') or 'no GPU'}", "",
            f"Generated {report['date']} by `python benchmarks/compile_time.py {report['argv']}`.", "",
            "## Machine", "",
            f"- GPU: {info.get('gpu') or '-'} x{info.get('gpu_count', 0)}"
            + (f", {info['gpu_memory_gib']} GiB" if info.get("gpu_memory_gib") else "")
            + (f", driver {info['driver']}" if info.get("driver") else ""),
            f"- CPU: {info.get('cpu') or '-'} ({info.get('cpu_count')} logical cores)",
            f"- python {info.get('python')}, torch {info.get('torch')}, triton {info.get('triton')}, "
            f"CUDA {info.get('cuda')}, autotune {info.get('autotune')}", "",
            "## Method", "", METHOD, ""]


TABLE_HEADER = ("| scenario | status | first call s | median ms | bench @1st gemm/pw/cd (calls) | hits/misses "
                "| artifacts ld/rej | phases s " + "/".join(PHASE_LABELS) + " | notes |")


def render_markdown(report: dict[str, Any]) -> str:
    lines = _machine_lines(report)
    for model, entry in report["models"].items():
        results = entry["scenarios"]
        lines += [f"## {model}", "", f"`{entry['path']}`", "", TABLE_HEADER,
                  "| --- | --- | ---: | ---: | ---: | --- | --- | --- | --- |"]
        for name in SCENARIOS:
            if name in DEFAULT_SCENARIOS or name in results:
                lines.append("| " + " | ".join(_row(name, results.get(name))) + " |")
        lines += ["", "| ratio | goal | value | verdict |", "| --- | --- | ---: | --- |"]
        for goal in goals(results):
            lines.append(f"| {goal['name']} | {goal['goal']} | {_goal_value(goal)} | {_met(goal['met'])} |")
        lines.append("")
    return "\n".join(lines)


def print_summary(report: dict[str, Any]) -> None:
    header = ["model", "scenario", "status", "first s", "median ms", "bench", "hit/miss", "art", "phases"]
    rows = [header]
    for model, entry in report["models"].items():
        for name in SCENARIOS:
            r = entry["scenarios"].get(name)
            if r is not None:
                rows.append([model] + _row(name, r)[:8])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    for model, entry in report["models"].items():
        for goal in goals(entry["scenarios"]):
            print(f"{model}: {goal['name']} = {_goal_value(goal)} (goal {goal['goal']}): {_met(goal['met'])}")


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


def scenario_list(raw: str, cache_given: bool) -> list[str]:
    """The scenarios asked for, plus those they need from the same run, in run order."""
    chosen = {s.strip() for s in raw.split(",") if s.strip()}
    unknown = sorted(chosen - set(SCENARIOS))
    if unknown:
        raise SystemExit(f"--scenarios: unknown {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    if chosen & set(WARM) and "sweep" not in chosen and not cache_given:
        log.warning("warm-start needs a filled cache: adding the sweep scenario (or pass --cache URL)")
        chosen.add("sweep")
    for loader, (source, _) in MEGACACHE_LOADS.items():
        if loader in chosen and source not in chosen:
            log.warning("%s loads what %s saves in the same run: adding %s", loader, source, source)
            chosen.add(source)
    return [s for s in SCENARIOS if s in chosen]


def _new_report(json_path: Path, args: argparse.Namespace, info: dict[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = {"models": {}}
    if json_path.exists() and not args.no_merge:
        try:
            report = json.loads(json_path.read_text())
            log.info("merging into %s (pass --no-merge to start afresh)", json_path)
        except (OSError, json.JSONDecodeError) as exc:
            log.warning("ignoring unreadable %s: %s", json_path, exc)
    report.update(machine=info, date=_now(), argv=" ".join(sys.argv[1:]), scenarios=list(SCENARIOS),
                  settings={"runs": args.runs, "warmup": args.warmup, "timeout_s": args.timeout,
                            "batch_size": args.batch_size, "optimizer_step": args.optimizer_step})
    report.setdefault("models", {})
    return report


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def _warm_bytecode() -> None:
    """Compile the bytecode of the modules every scenario imports, once, before any is timed
    (see PYTHONPYCACHEPREFIX in _child_env); torch's own caches stay empty."""
    env = dict(os.environ, PYTHONPYCACHEPREFIX=os.environ.get("PYTHONPYCACHEPREFIX", str(PYCACHE)))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # this process writes it; the scenarios only read it
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    started = time.perf_counter()
    # Each on its own: one that is missing here (Ray on a job-only machine) skips only itself.
    code = ("import importlib\nfor name in %r:\n    try:\n        importlib.import_module(name)\n"
            "    except Exception:\n        pass\n" % (WARM_IMPORTS,))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    log.info("bytecode warm-up: %.1f s (rc %s)", time.perf_counter() - started, done.returncode)


def benchmark(args: argparse.Namespace) -> int:
    models = _model_list(args.models)
    scenarios = scenario_list(args.scenarios, bool(args.cache))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _warm_bytecode()
    info = machine_info(min(args.timeout, 300))
    gpu = slug(info.get("gpu") or "cpu")
    json_path, md_path = out / f"compile_time_{gpu}.json", out / f"compile_time_{gpu}.md"
    report = _new_report(json_path, args, info)
    for name, path in models:
        entry = report["models"].setdefault(name, {"path": path, "scenarios": {}})
        entry["path"] = path
        tmp = Path(tempfile.mkdtemp(prefix=f"compile_time_{name}_"))
        run = ModelRun(name, path, scenarios, tmp, args.cache or f"sqlite:///{tmp / 'cache.db'}",
                       train=is_training_file(REPO / path if not Path(path).is_absolute() else path),
                       signing_key=str(Path(args.signing_key).resolve()) if args.signing_key else None)
        try:
            _run_model(run, entry, args, gpu, (report, json_path, md_path))
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


def _run_model(run: ModelRun, entry: dict[str, Any], args: argparse.Namespace, gpu: str,
               sink: tuple[dict[str, Any], Path, Path]) -> None:
    for scenario in run.scenarios:
        log.info("%s: %s ...", run.name, scenario)
        log_path = Path(args.log_dir) / f"{gpu}-{run.name}-{scenario}.log" if args.log_dir else None
        try:
            if scenario == "sweep":
                result = run_sweep(run, args, log_path)
            else:
                result = run_model_scenario(scenario, run, args, log_path)
        except Exception as exc:  # noqa: BLE001 - record and go on
            log.exception("%s %s failed to run", run.name, scenario)
            result = {"scenario": scenario, "status": "error", "error": f"{type(exc).__name__}: {exc}"}
        result["date"] = _now()
        run.results[scenario] = entry["scenarios"][scenario] = result
        log.info("%s: %s %s%s", run.name, scenario, result.get("status"),
                 f" ({result.get('error')})" if result.get("error") else "")
        entry["goals"] = goals(entry["scenarios"])
        _write(*sink)  # after every scenario: a crash loses nothing


def _write(report: dict[str, Any], json_path: Path, md_path: Path) -> None:
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md_path.write_text(render_markdown(report))


# ============================================================== command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compile_time.py",
        description="Compile time and latency of default, max-autotune (cold), the autotune sweep, "
        "max-autotune with the warm-start hook (with and without signed artifacts) and the Mega-cache "
        "anchors; each scenario in a fresh process with fresh caches.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python benchmarks/compile_time.py --models resnet --out $OUT\n"
        "  python benchmarks/compile_time.py --models mlp --scenarios default,max-autotune-cold,sweep,"
        "warm-start,warm-start-artifacts --runs 20 --out /tmp/ctcpu",
    )
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma-separated model names ({', '.join(MODELS)}) or model file paths "
                        f"(default: {','.join(DEFAULT_MODELS)}; mlp is the CPU example)")
    parser.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS),
                        help=f"comma-separated subset of {', '.join(SCENARIOS)} (default: the first "
                        f"{len(DEFAULT_SCENARIOS)}); a warm-start without sweep adds the sweep unless --cache "
                        "is given, a Mega-cache anchor adds the scenario whose save it loads")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"),
                        help="directory for compile_time_<gpu>.md/.json (default: benchmarks/results)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per scenario (default 600)")
    parser.add_argument("--runs", type=int, default=100, help="timed calls per scenario (default 100)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls before them (default 10)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="batch size passed to example() and to the sweep (default: the model's own)")
    parser.add_argument("--cache", metavar="URL", default=None,
                        help="use this cache database for sweep and warm-starts instead of a fresh "
                        "SQLite file per model (its contents then count as cached)")
    parser.add_argument("--signing-key", metavar="PATH", default=None,
                        help="sign the sweep's artifacts with this private key and trust PATH.pub in "
                        f"{ARTIFACTS} (default: a fresh pair from `autotune keys new` per model)")
    parser.add_argument("--optimizer-step", choices=("compiled", "eager"), default="compiled",
                        help="for a training-step model: torch.compile the optimizer step too (default) "
                        "or run it eagerly")
    parser.add_argument("--sweep-arg", action="append", metavar="ARG",
                        help="extra argument for `autotune sweep` (repeatable), e.g. --sweep-arg=--gpus=1")
    parser.add_argument("--no-merge", action="store_true",
                        help="overwrite the results files instead of merging into them")
    parser.add_argument("--log-dir", default=None, help="write each child's full stdout/stderr here")
    parser.add_argument("--keep-tmp", action="store_true", help="keep the per-model temporary caches")
    parser.add_argument("--kernel-profile", action="store_true",
                        help="also record GPU time per kernel (10 profiled calls after the timed ones)")
    parser.add_argument("--dynamic", choices=tuple(DYNAMIC), default=None,
                        help="torch.compile(dynamic=False|None|True) for every scenario (default: torch's own); "
                        "auto also calls at twice --batch-size after the first call, which recompiles with a "
                        "dynamic batch, and records that recompile")
    parser.add_argument("--dynamo-package", action=argparse.BooleanOptionalAction, default=None,
                        help="AUTOTUNE_DYNAMO_PACKAGE=1 or 0 for the sweep and every hook scenario (default: the "
                        f"setting's own, on): whether the sweep publishes Dynamo's package and {ARTIFACTS} loads "
                        "it, skipping tracing")
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
        parser.add_argument("--optimizer-step", choices=("compiled", "eager"), default="compiled")
        parser.add_argument("--save-artifacts", metavar="PATH", default=None,
                            help="save Mega-cache here after the first call")
        parser.add_argument("--load-artifacts", metavar="PATH", default=None,
                            help="load this Mega-cache file first, inside the timed first call")
        parser.add_argument("--precompile", action="store_true", help="torch._dynamo.config.caching_precompile")
        parser.add_argument("--dynamic", choices=tuple(DYNAMIC), default=None)
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
    if args.dynamic == "auto" and args.batch_size is None:
        raise SystemExit("--dynamic auto needs --batch-size: its second call runs at twice that")
    if args.dynamo_package is not None:  # every child inherits it (see _child_env)
        os.environ["AUTOTUNE_DYNAMO_PACKAGE"] = "1" if args.dynamo_package else "0"
    return benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
