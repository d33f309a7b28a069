"""Every private torch, Triton or CPython name autotune reads, patches, subclasses or assigns: one table.

Each seam names its dotted path, what is done with it (``read``, ``patch``: a method or
function replaced while a feature is active, ``subclass``: a class we derive from or a
method our subclass overrides, ``assign``: an attribute or config key we set), the
features that depend on it, and the releases it was checked on. Patch sites take
their target from here (``StackedPatch(seam, ...)``, ``seam.owner()``), so a seam torch
renames is one edit here, and ``autotune doctor`` says which features this torch leaves
off. ``required=False`` marks a seam whose absence the code handles by itself (a newer
or older torch that no longer needs the workaround); it never turns a feature off.

Names are declared one by one: a declared module declares none of its names, and there are
no wildcards. ``tests/test_seam_names.py`` reads the product's code (``ast``) and fails on a
private name it touches that no entry names. Public APIs (``torch.compile``,
``torch.compiler``, ``torch._dynamo.mark_dynamic`` and its kin, ``torch._inductor.config.patch``)
are not listed, nor are the Inductor config keys that only enter the environment key
(``inductor_glue/env.py``, by a computed name: absent keys are skipped); config keys the code
names are. Public attributes of objects torch hands to our wrappers (a launcher's ``config``, a
graph's ``sizevars``) are read with defaults where they are read, and are not listed; private
ones are. An attribute torch sets on instances only is declared on its class with
``on_instances``: it resolves where the module's code names it.

Resolving a seam imports its module (``torch._inductor.*``), nothing more.
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import logging
import re
import sys
import threading
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

READ, PATCH, SUBCLASS, ASSIGN = "read", "patch", "subclass", "assign"
# The torch releases the project tests (2.11 on the GPU machines; 2.13, 2.14 and 2.15 on CPUs),
# on which `autotune doctor` saw a seam resolve (docs/versions.md). A seam some of them lack
# lists the others; tests/test_seam_names.py checks each list against benchmarks/results.
CHECKED_ON = ("2.11", "2.13", "2.14", "2.15")
# Triton's seams, by the Triton those torches pin (2.13's CPU wheel has none).
TRITON_CHECKED_ON = ("triton 3.6", "triton 3.8", "triton 3.9")
# Seams first declared after the matrix's doctor runs: read in torch 2.13's and 2.14's wheels
# and resolved on 2.15; CI's 2.11 subset resolves the required ones (tests/test_seams.py).
SOURCE_CHECKED_ON = ("2.13", "2.14", "2.15")
# CPython's seams (autotune/job/import_gate.py, exit_wait.py), by Python release.
PYTHON_CHECKED_ON = ("Python 3.11", "Python 3.12")


@dataclass(frozen=True)
class Feature:
    key: str  # as --json gives it
    name: str  # as doctor prints it
    gpu_only: bool  # used only where a CUDA device is
    fallback: str  # what happens instead while it is off


GEMM_SERVING = Feature("gemm_serving", "GEMM serving", False,
                       "GEMM/conv lookups are not served from the cache; they tune as plain max-autotune")
PINNING = Feature("pinning", "pinning", True, "every Triton config is generated, as plain max-autotune does")
KERNEL_CONFIGS = Feature("kernel_configs", "kernel configs", True,
                         "pointwise/reduction kernels tune at their first run, as plain max-autotune")
FUSION_VERDICTS = Feature("fusion_verdicts", "fusion verdicts", True, "Inductor times each epilogue fusion itself")
PADDING_VERDICTS = Feature("padding_verdicts", "padding verdicts", True, "Inductor times each GEMM padding itself")
ARTIFACTS = Feature("fx_aot_artifacts", "FX/AOT artifacts", False,
                    "compiled graphs and C++ kernels are neither loaded nor published; everything compiles")
DYNAMO_PACKAGE = Feature("dynamo_package", "Dynamo's package", False,
                         "Dynamo traces every model; the FX/AOT entries still serve")
CUDAGRAPH_RELOAD = Feature("cudagraph_reload", "CUDA-graph reload", True,
                           "Dynamo's packages are not loaded on GPUs (they would run without CUDA graphs)")
SWEEP_CAPTURE = Feature("sweep_capture", "the sweep's capture", False,
                        "`autotune sweep` cannot capture or tune requests with this torch")

FEATURES: tuple[Feature, ...] = (GEMM_SERVING, PINNING, KERNEL_CONFIGS, FUSION_VERDICTS, PADDING_VERDICTS,
                                 ARTIFACTS, DYNAMO_PACKAGE, CUDAGRAPH_RELOAD, SWEEP_CAPTURE)


class SeamMissing(RuntimeError):
    """A required seam does not resolve on the installed torch."""


@dataclass(frozen=True)
class Seam:
    module: str
    attr: str  # dotted path inside the module; "" for the module itself
    kind: str
    features: tuple[Feature, ...]
    why: str
    required: bool = True
    checked_on: tuple[str, ...] = CHECKED_ON
    # Other names of the attribute (dotted paths in the same module), any one of which serves:
    # a method torch renamed. The seam resolves to the first of attr and these that exists.
    alternatives: tuple[str, ...] = ()
    # The torch releases a workaround is for, [first, past): None, every release. Outside them
    # the seam is not touched at all (``needed()``), whether or not it resolves.
    needed_on: tuple[str, str] | None = None
    # An attribute torch's own code sets on instances (or on objects its module makes), not on
    # the owner itself: it resolves where a function or method of the module names it.
    on_instances: bool = False

    @property
    def path(self) -> str:
        return f"{self.module}.{self.attr}" if self.attr else self.module

    @property
    def name(self) -> str:
        """The attribute patched or assigned on ``owner()``."""
        return self.attr.rpartition(".")[2]

    def owner(self) -> Any:
        """The module, class or object that holds the attribute."""
        try:
            node: Any = importlib.import_module(self.module)
            for part in self.attr.split(".")[:-1] if self.attr else ():
                node = getattr(node, part)
        except (ImportError, AttributeError) as exc:
            raise SeamMissing(self._missing(exc)) from exc
        return node

    def resolve(self) -> Any:
        """The attribute itself: for a patch, as the owner itself defines it (not inherited)."""
        return self._resolve_one(self.present_attr())

    def present_attr(self) -> str:
        """The first of ``attr`` and its alternatives that this torch has (``attr`` where none)."""
        return next((attr for attr in (self.attr, *self.alternatives) if _resolves(self, attr)), self.attr)

    def _resolve_one(self, attr: str) -> Any:
        if attr != self.attr:
            return dataclasses.replace(self, attr=attr, alternatives=()).resolve()
        owner = self.owner()
        if not self.attr:
            return owner
        if self.on_instances:
            if self.name not in _names_in_code(importlib.import_module(self.module)):
                raise SeamMissing(self._missing(f"no code of {self.module} sets {self.name}"))
            return owner
        if self.kind == PATCH:  # replaced and restored in the owner's own namespace
            held = vars(owner)
            if self.name not in held:
                raise SeamMissing(self._missing(f"{self.attr.rpartition('.')[0] or self.module} defines no {self.name}"))
            return held[self.name]
        try:
            return getattr(owner, self.name)
        except AttributeError as exc:
            raise SeamMissing(self._missing(exc)) from exc

    def needed(self) -> bool:
        """Whether this torch is one of the releases ``needed_on`` names (True without a gate).
        Reads only torch's version: nothing of the seam's module is imported."""
        if self.needed_on is None:
            return True
        import torch

        first, past = self.needed_on
        return _release(first) <= _release(str(torch.__version__)) < _release(past)

    def problem(self) -> str | None:
        """Why this seam does not resolve here, or None when it does."""
        try:
            self.resolve()
        except SeamMissing as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - a module that fails to import says so
            return f"{self.path}: {type(exc).__name__}: {exc}"
        return None

    def get(self) -> Any:
        return getattr(self.owner(), self.name)

    def set(self, value: Any) -> None:
        setattr(self.owner(), self.name, value)

    def set_for_every_thread(self, value: Any) -> Callable[[], None]:
        """Assign ``value`` here and, for an option of a torch config module, as its default
        too; returns the undo. torch 2.13 keeps an assigned config option per thread (a
        ContextVar): set on the background install's thread alone, the artifact tier's switches
        never reached the script's compiles. The default is read by every thread that assigned
        none of its own. The undo restores the default and the assigned value: from the thread
        that set it where torch keeps one per thread, from any thread where it keeps one for the
        process (torch 2.11)."""
        entry = _config_entry(self.owner(), self.name)
        before, default = self.get(), getattr(entry, "default", None)
        setter, per_thread = threading.get_ident(), _assigned_per_thread(entry)
        if entry is not None:
            entry.default = value
        self.set(value)

        def undo() -> None:
            if entry is not None:
                entry.default = default
            # One value for the process (torch 2.11, a plain attribute): undone from any thread,
            # the hook's uninstall on the script's thread included. Per thread: only the setter's.
            if threading.get_ident() == setter or not per_thread:
                self.set(before)

        return undo

    @property
    def of_the_interpreter(self) -> bool:
        """A CPython name: the standard library's, or the import system's frozen bootstrap."""
        package = self.module.partition(".")[0]
        return package in sys.stdlib_module_names or package == _BOOTSTRAP

    def _missing(self, detail: object) -> str:
        package = self.module.partition(".")[0]
        if self.of_the_interpreter:
            return f"Python {sys.version.split()[0]} has no {self.path} ({detail})"
        try:
            version = importlib.import_module(package).__version__
        except Exception:  # noqa: BLE001 - a package that is not installed has no version to name
            return f"{package} is not installed: no {self.path} ({detail})"
        return f"{package} {version} has no {self.path} ({detail})"


SEAMS: list[Seam] = []


def _release(version: str) -> tuple[int, int]:
    """A torch version's release, (major, minor): a pre-release or local build counts as its release."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _gated(seam: Seam, first: str, past: str) -> Seam:
    """``seam`` needed only on torch releases [``first``, ``past``) (``Seam.needed``)."""
    gated = dataclasses.replace(seam, needed_on=(first, past))
    SEAMS[SEAMS.index(seam)] = gated
    return gated


def _resolves(seam: Seam, attr: str) -> bool:
    try:
        seam._resolve_one(attr)
    except SeamMissing:
        return False
    return True


def _names_in_code(module: types.ModuleType) -> set[str]:
    """The names the code of ``module``'s functions and its classes' methods uses (nested code too)."""
    codes = []
    for value in vars(module).values():
        for item in (*vars(value).values(), value) if isinstance(value, type) else (value,):
            function = getattr(item, "__func__", item)
            if isinstance(function, types.FunctionType) and function.__globals__ is vars(module):
                codes.append(function.__code__)
    names: set[str] = set()
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return names


def _assigned_per_thread(entry: Any) -> bool:
    """Whether torch keeps a value assigned to this config option per thread: its entry's
    ``user_override`` is a ContextVar in torch 2.13, one value for the process in 2.11."""
    return isinstance(getattr(entry, "user_override", None), contextvars.ContextVar)


def _config_entry(owner: Any, name: str) -> Any:
    """The entry of option ``name`` when ``owner`` is a torch config module (CONFIG_ENTRY), else None."""
    entries = vars(owner).get("_config") if hasattr(owner, "__dict__") else None
    entry = entries.get(name) if isinstance(entries, dict) else None
    return entry if entry is not None and hasattr(entry, "default") else None


def _declare(module: str, attr: str, kind: str, features: tuple[Feature, ...], why: str,
             required: bool = True, checked_on: tuple[str, ...] = CHECKED_ON,
             alternatives: tuple[str, ...] = (), on_instances: bool = False) -> Seam:
    seam = Seam(module, attr, kind, features, why, required, checked_on, alternatives,
                on_instances=on_instances)
    SEAMS.append(seam)
    return seam


_SA = "torch._inductor.select_algorithm"
_SERVE_OR_CAPTURE = (GEMM_SERVING, SWEEP_CAPTURE)

# --- the autotune selector: GEMM serving, and the sweep's capture and tuning (inductor_glue/inductor.py)
ALGORITHM_SELECTOR_CACHE = _declare(_SA, "AlgorithmSelectorCache", SUBCLASS, _SERVE_OR_CAPTURE,
                                    "Selector derives from Inductor's selector")
SELECTOR_CALL = _declare(_SA, "AlgorithmSelectorCache.__call__", SUBCLASS, _SERVE_OR_CAPTURE,
                         "overridden: describes each request before Inductor looks it up")
SELECTOR_LOOKUP = _declare(_SA, "AlgorithmSelectorCache.lookup", SUBCLASS, _SERVE_OR_CAPTURE,
                           "overridden: every lookup goes to the policy (cache, capture or tuning)")
SELECTOR_CACHE_CLEAR = _declare(_SA, "AlgorithmSelectorCache.cache_clear", SUBCLASS, _SERVE_OR_CAPTURE,
                                "overridden: forgets the described requests with Inductor's cache")
_declare(_SA, "AlgorithmSelectorCache.key_of", READ, (GEMM_SERVING, PINNING, SWEEP_CAPTURE),
         "an input's layout exactly as Inductor's inputs key spells it")
SELECTOR_GLOBAL = _declare(_SA, "_ALGORITHM_SELECTOR_CACHE", ASSIGN, _SERVE_OR_CAPTURE,
                           "the process-wide selector, replaced by ours while installed")
_declare(_SA, "create_inputs_key", READ, _SERVE_OR_CAPTURE, "the request's inputs key, as Inductor's")
FP32_PRECISION_KEY = _declare("torch._inductor.utils", "fp32_matmul_precision_key", READ, _SERVE_OR_CAPTURE,
                              "a request's matmul precision where a script set it per backend (torch 2.15's "
                              "API; torch.get_float32_matmul_precision() raises then)", required=False,
                              checked_on=("2.15",))
_declare(_SA, "create_benchmark_cache_key", READ, _SERVE_OR_CAPTURE,
         "torch 2.15 looks timings up under the inputs key and a benchmark policy after it, which the "
         "selector takes off (inductor_glue/inductor.py); before 2.15 the key is the inputs key alone",
         required=False, checked_on=("2.15",))
_declare(_SA, "ExternKernelCaller", READ, _SERVE_OR_CAPTURE, "tells ATen choices apart")
_declare(_SA, "TritonTemplateCaller", READ, _SERVE_OR_CAPTURE, "tells Triton template choices apart")
_declare(_SA, "DataProcessorChoiceCallerWrapper._wrapped", READ, _SERVE_OR_CAPTURE,
         "a wrapped choice is named by the choice it wraps (by the wrapper's type without it)",
         required=False, checked_on=SOURCE_CHECKED_ON, on_instances=True)
_declare("torch._inductor.virtualized", "V", READ, (GEMM_SERVING, SWEEP_CAPTURE, FUSION_VERDICTS),
         "the graph being lowered: its current node, size hints and layout decision")
_declare("torch._inductor.sizevars", "SizeVarAllocator.optimization_hint", READ, _SERVE_OR_CAPTURE,
         "a size symbol's hint (torch 2.13's name); size_hint is used where it is absent", required=False)
_declare("torch._inductor.sizevars", "SizeVarAllocator.size_hint", READ, _SERVE_OR_CAPTURE,
         "a size symbol's hint where optimization_hint is absent (gone in torch 2.13)", required=False,
         checked_on=("2.11",))
_declare("torch._inductor.codecache", "CacheBase.get_system", READ, _SERVE_OR_CAPTURE,
         "Inductor's system hash, part of every environment key")
PICK_VEC_ISA = _declare("torch._inductor.cpu_vec_isa", "pick_vec_isa", READ, _SERVE_OR_CAPTURE,
                        "the CPU's vector ISA in its environment key (\"unknown-isa\" without it)", required=False)
_declare("torch._inductor.runtime.compile_tasks", "_set_triton_ptxas_path", READ, _SERVE_OR_CAPTURE,
         "pins Triton's ptxas before any hash is taken (nothing to pin without it)", required=False)
COMPILE_GRAPH = _declare("torch._inductor.compile_fx", "_compile_fx_inner", PATCH, (GEMM_SERVING,),
                         "a graph whose compile with served kernels fails is compiled again with ATen for "
                         "its GEMMs (autotune/job/compile_retry.py; without it the failure is the job's)",
                         required=False)
# Inductor's pattern passes, registered once per process at its first compile; the background
# install registers them while the script builds its model (inductor_glue/env.py). joint_graph's
# are registered per device: its lazy_init takes the device of the compile's inputs.
LAZY_PASSES = tuple(_declare(f"torch._inductor.fx_passes.{module}", "lazy_init", READ, (),
                             "registered by the background install before the first compile "
                             "(which registers them itself without it)", required=False)
                    for module in ("pre_grad", "joint_graph", "post_grad"))
# What every compile sets up on first use, importing modules as it goes (a warm compile, whose
# graphs the cache serves, spent a share of its first call in these imports): the background
# install calls them while the script builds its model, before the pattern passes.
FIRST_COMPILE_SETUP = (
    _declare("torch._dynamo.backends.registry", "_lazy_import", READ, (),
             "Dynamo's backends and their entry points, imported as every compile ends", required=False),
    _declare("torch._inductor.codegen.common", "init_backend_registration", READ, (),
             "Inductor's code generators, imported for the first graph's cache key", required=False),
    _declare("torch.fx.experimental.symbolic_shapes", "uninteresting_files", READ, (),
             "the modules Dynamo's first traced op imports to filter its stack", required=False),
)
# Imported by Dynamo's first trace of a callable attribute (a local_map check), where
# torch.distributed is built in.
LOCAL_MAP_MODULE = _declare("torch.distributed.tensor.experimental._func_map", "", READ, (),
                            "imported before the first trace, as FIRST_COMPILE_SETUP", required=False)
# Dynamo's identity guards, which torch 2.10 to 2.12 annotate with repr() of the guarded value
# (inductor_glue/guard_repr.py): a compiled optimizer step's first call prints every state tensor.
# 2.9 annotates nothing and 2.13 names the value's type: there, neither is patched.
_GUARD_REPR_RELEASES = ("2.10", "2.13")
ID_MATCH_GUARD = _gated(_declare("torch._dynamo.guards", "GuardBuilder.id_match_unchecked", PATCH, (),
                                 "a tensor it guards is named, not printed (printed, as torch does, without it); "
                                 "torch 2.10-2.12 only", required=False), *_GUARD_REPR_RELEASES)
TENSOR_REPR = _gated(_declare("torch._tensor", "Tensor.__repr__", PATCH, (),
                              "a tensor printed for an identity guard is named without its values; torch 2.10-2.12 "
                              "only", required=False), *_GUARD_REPR_RELEASES)
_declare("torch.utils._triton", "triton_hash_with_backend", READ, (GEMM_SERVING,),
         "prewarms Triton's backend hash at warm_start (computed on first use without it)", required=False)
_declare("torch.utils._triton", "has_triton", READ, (GEMM_SERVING,),
         "whether Triton's backend hash is prewarmed at all (nothing is prewarmed without it)", required=False,
         checked_on=SOURCE_CHECKED_ON)
_declare("torch._inductor.config", "", READ, _SERVE_OR_CAPTURE + (FUSION_VERDICTS, ARTIFACTS),
         "Inductor's options: the environment key's and the ones set below")
CONFIG_OPTIONS = _declare("torch._inductor.config", "_config", READ, (ARTIFACTS, DYNAMO_PACKAGE),
                         "a torch config module's option entries (each module has its own), whose defaults "
                         "set_for_every_thread sets (only the assigned value without it)", required=False,
                         checked_on=SOURCE_CHECKED_ON)
_declare("torch._inductor.config", "get_config_copy", READ, (SWEEP_CAPTURE,),
         "the options a model file set at import, and the keys --inductor-config may set",
         checked_on=SOURCE_CHECKED_ON)
_declare("torch._inductor.config", "compile_threads", READ, (SWEEP_CAPTURE,),
         "the exhaustive search compiles that many candidates at a time (workers/search.py; one without it)",
         required=False, checked_on=SOURCE_CHECKED_ON)
# The exhaustive search (inductor_glue/search_space.py names them by a computed name, which the
# name check cannot see): set where this torch has them, nothing searched exhaustively without.
_declare("torch._inductor.config", "max_autotune_gemm_search_space", ASSIGN, (SWEEP_CAPTURE,),
         "a worker's exhaustive GEMM/conv search space (`sweep --search exhaustive`)", required=False,
         checked_on=SOURCE_CHECKED_ON)
_declare("torch._inductor.config", "max_autotune_prune_choices_based_on_shared_mem", ASSIGN, (SWEEP_CAPTURE,),
         "the exhaustive space drops configs that cannot launch for their shared memory (GPUs)", required=False,
         checked_on=SOURCE_CHECKED_ON)
_declare("torch._inductor.config", "cpp.cxx", READ, (),
         "autotune doctor names the C++ compiler Inductor's CPU code is built with (g++ without it)",
         required=False, checked_on=SOURCE_CHECKED_ON)
_declare("torch._dynamo.utils", "counters", READ, _SERVE_OR_CAPTURE,
         "Inductor's benchmark count: a job's stats (benchmarks=) and the sweep's, which tests and benchmarks "
         "compare")

# --- pinning (inductor_glue/pinning.py)
TEMPLATE_GENERATE = _declare(_SA, "TritonTemplate.generate", PATCH, (PINNING,),
                             "pin digests on every Triton config; a stored loser is never generated")

# --- run-time tuning of pointwise/reduction kernels: kernel configs, and capture's untuned kernels
_TH = "torch._inductor.runtime.triton_heuristics"
COORDINATE_DESCENT = _declare(_TH, "CachingAutotuner.coordinate_descent_tuning", PATCH,
                              (KERNEL_CONFIGS, SWEEP_CAPTURE),
                              "skipped for a served config, and for kernels capture leaves untuned "
                              "(inductor_glue/descent.py: one patch)")
AUTOTUNE_TO_ONE_CONFIG = _declare(_TH, "CachingAutotuner.autotune_to_one_config", PATCH, (SWEEP_CAPTURE,),
                                  "capture and workers run pointwise kernels untuned")
SCALE_RBLOCK = _declare(_TH, "CachingAutotuner._dynamic_scale_rblock", PATCH, (KERNEL_CONFIGS,),
                        "no halved-RBLOCK candidates for a served config (torch 2.11; later torches "
                        "fixed the retuning and may drop it)", required=False)
AUTOTUNE_CACHE_SAVE = _declare("torch._inductor.runtime.autotune_cache", "AutotuneCache.save", PATCH,
                               (KERNEL_CONFIGS,), "copies each tuned config into the cache")
_declare("torch._inductor.runtime.autotune_cache", "AutotuneCache.create", READ, (KERNEL_CONFIGS,),
         "finds a served config's file on this node")
ASYNC_COMPILE_TRITON = _declare("torch._inductor.async_compile", "AsyncCompile.triton", PATCH, (KERNEL_CONFIGS,),
                                "the first Triton compile waits until the stored configs are on disk")
BUNDLER_READ_AND_EMIT = _declare("torch._inductor.triton_bundler", "TritonBundler.read_and_emit", PATCH,
                                 (KERNEL_CONFIGS,),
                                 "a cached graph's kernels unpack after the stored configs are on disk")
_declare("torch._inductor.runtime.runtime_utils", "cache_dir", READ, (KERNEL_CONFIGS, ARTIFACTS),
         "Inductor's local cache dir, which the hook fills")

# --- fusion verdicts (inductor_glue/fusion.py)
SPEEDUP_BY_FUSION = _declare("torch._inductor.scheduler", "Scheduler.speedup_by_fusion", PATCH,
                             (FUSION_VERDICTS,), "a stored verdict answers instead of a benchmark")
_declare("torch._inductor.scheduler", "Scheduler._has_layout_conflict_for_template", READ, (FUSION_VERDICTS,),
         "a verdict is not served onto a conflicting layout (unchecked without it)", required=False)
_declare("torch._inductor.scheduler", "FusionResult", READ, (FUSION_VERDICTS,),
         "a served verdict in the form Inductor gives it, at once or pending")
_declare("torch._inductor.codecache", "LambdaFuture", READ, (FUSION_VERDICTS,),
         "a pending verdict's future, as Inductor's")
_declare("torch._inductor.ir", "MultiTemplateBuffer.finalize_as_triton_caller", READ, (FUSION_VERDICTS,),
         "the template is finalized with the verdict's config")
_declare("torch._inductor.config", "multi_kernel_hints", READ, (FUSION_VERDICTS,),
         "no verdict is served under multi-kernel hints")

# --- padding verdicts (inductor_glue/padding.py)
_PAD = "torch._inductor.fx_passes.pad_mm"
PAD_GET = _declare(_PAD, "get_cached_should_pad", PATCH, (PADDING_VERDICTS,),
                   "a stored verdict answers before Inductor's own file")
PAD_SET = _declare(_PAD, "set_cached_should_pad", PATCH, (PADDING_VERDICTS,), "each timed verdict is kept")

# --- the artifact tier (autotune/job/artifacts.py)
_RC = "torch._inductor.remote_cache"
REMOTE_BACKEND = _declare(_RC, "RemoteCacheBackend", SUBCLASS, (ARTIFACTS,),
                          "the signed store as Inductor's remote cache backend")
_declare(_RC, "RemoteCacheBackend._get", SUBCLASS, (ARTIFACTS,), "overridden: a verified fetch")
_declare(_RC, "RemoteCacheBackend._put", SUBCLASS, (ARTIFACTS,), "overridden: a signed publish")
FX_BACKEND_OVERRIDE = _declare(_RC, "RemoteFxGraphCache.backend_override_cls", ASSIGN, (ARTIFACTS,),
                               "FX graph entries go to our backend")
AOT_BACKEND_OVERRIDE = _declare(_RC, "RemoteAOTAutogradCache.backend_override_cls", ASSIGN, (ARTIFACTS,),
                                "AOTAutograd entries go to our backend")
FX_REMOTE_SWITCH = _declare("torch._inductor.config", "fx_graph_remote_cache", ASSIGN, (ARTIFACTS,),
                            "turns the FX graph remote cache on")
AOT_REMOTE_SWITCH = _declare("torch._functorch.config", "enable_remote_autograd_cache", ASSIGN, (ARTIFACTS,),
                             "turns the AOTAutograd remote cache on")
CPP_BUILD = _declare("torch._inductor.cpp_builder", "CppBuilder.build", PATCH, (ARTIFACTS,),
                     "a C++ library is fetched before it is built, and published after")
_declare("torch._inductor.cpp_builder", "CppBuilder.get_target_file_path", READ, (ARTIFACTS,),
         "the library's path under the cache dir: its key")
# `autotune doctor` names the compiler Inductor would build with (autotune/doctor.py); no
# feature depends on it, and without it doctor says it cannot tell.
CPP_COMPILER = _declare("torch._inductor.cpp_builder", "get_cpp_compiler", READ, (),
                        "autotune doctor names the C++ compiler Inductor's CPU code is built with", required=False)
# Triton's, not torch's: its build of a native module (a kernel's launcher, the driver's
# utilities) with the C compiler, called only when Triton's own cache lacks the module
# (autotune/job/triton_modules.py). A CPU machine may have no Triton: not required.
TRITON_BUILD = _declare("triton.runtime.build", "_build", PATCH, (ARTIFACTS,),
                        "a native module Triton builds is fetched before the C compiler runs, and published "
                        "after (the compiler runs without it)", required=False, checked_on=TRITON_CHECKED_ON)
# Triton's key, hashed from its install (its sources and native library), part of every compiled
# graph's cache key; computed beside the install's imports (inductor_glue/env.py, prewarm_triton_key).
TRITON_KEY = _declare("triton.runtime.cache", "triton_key", READ, (),
                      "hashed at warm_start, beside the install's imports (the first compile hashes it without it)",
                      required=False, checked_on=TRITON_CHECKED_ON)
# The vector-ISA probes: Inductor builds a small C++ program per ISA into the cache dir, once per
# process (these caches), seconds of a fresh CPU node's first compile. A publishing pass clears
# them and probes again inside the artifact tier, so the probes' builds are published too
# (inductor_glue/env.py, reprobe_vec_isa).
VEC_ISA_LIST = _declare("torch._inductor.cpu_vec_isa", "valid_vec_isa_list", READ, (ARTIFACTS,),
                        "the probed ISAs, cached per process: cleared before probing again", required=False)
VEC_ISAS = _declare("torch._inductor.cpu_vec_isa", "supported_vec_isa_list", READ, (ARTIFACTS,),
                    "the ISA objects: their cached probe verdicts (__bool__) are cleared with it, and the flags a "
                    "passed probe left on them (_is_avx512_bf16_supported) dropped", required=False)

# --- Dynamo's package (autotune/job/dynamo_package.py)
_PKG = "torch._dynamo.package"
CONFIG_ENTRY = _declare("torch.utils._config_module", "_ConfigEntry", READ, (ARTIFACTS, DYNAMO_PACKAGE),
                       "a config option's entry (a module's _config), whose default the background install "
                       "sets: torch 2.13 keeps assigned options per thread (its user_override a ContextVar, "
                       "one value for the process in 2.11, which the uninstall restores from any thread)",
                       required=False)
CACHING_PRECOMPILE = _declare("torch._dynamo.config", "caching_precompile", ASSIGN, (DYNAMO_PACKAGE,),
                              "torch.compile asks for a package before it traces")
PACKAGE_LOAD = _declare(_PKG, "DiskDynamoCache.load", PATCH, (DYNAMO_PACKAGE,),
                        "the package is fetched and checked before Dynamo reads it")
SERIALIZE_GUARDS = _declare("torch._dynamo.guards", "CheckFunctionManager.serialize_guards", PATCH,
                            (DYNAMO_PACKAGE,), "guards that cannot be pickled leave the frame out")
ADD_GUARDED_CODE = _declare(_PKG, "CompilePackage.add_guarded_code", PATCH, (DYNAMO_PACKAGE,),
                            "a frame whose guards could not be pickled is bypassed")
PACKAGE_INSTALL = _declare(_PKG, "CompilePackage.install", PATCH, (DYNAMO_PACKAGE,),
                           "a package that fails to install falls back to tracing")
_declare(_PKG, "CompilePackage.source_id_from_fn", READ, (DYNAMO_PACKAGE,), "the package's id, as torch's")
PACKAGE_BYPASS = _declare(_PKG, "CompilePackage.bypass_current_entry", READ, (DYNAMO_PACKAGE,),
                          "leaves a frame out (torch 2.15 renamed it bypass_current_compile, which leaves out "
                          "the frame's current compile, as torch's own bypass does)",
                          checked_on=CHECKED_ON, alternatives=("CompilePackage.bypass_current_compile",))
_declare(_PKG, "CompilePackage.uninstall", READ, (DYNAMO_PACKAGE,), "undoes a half-done install")
_declare(_PKG, "CompilePackage._initialized", ASSIGN, (DYNAMO_PACKAGE,),
         "reset after a failed install, so the fallback's own initialization does not assert (torch "
         "2.11-2.13)", required=False, checked_on=SOURCE_CHECKED_ON, on_instances=True)
GUARDS_LOG = _declare("torch._dynamo.guards", "log", READ, (DYNAMO_PACKAGE,),
                     "its warning per guard that caching_precompile drops is kept at debug level in our log",
                     required=False)
OUTPUT_GRAPH_LOG = _declare("torch._dynamo.output_graph", "log", READ, (DYNAMO_PACKAGE,),
                           "its warning per graph caching_precompile leaves out of the package is kept at debug "
                           "level in our log", required=False)
_declare(_PKG, "DynamoCache.path_prefix", READ, (DYNAMO_PACKAGE,), "where Dynamo reads packages")
_declare(_PKG, "_hash_sourcelines", READ, (DYNAMO_PACKAGE,),
         "a package whose inlined source changed is refused early (torch checks it later)", required=False)
_declare("torch._dynamo.precompile_context", "PrecompileContext.create_cache_entries", READ, (DYNAMO_PACKAGE,),
         "the packages this process recorded, to publish")
_declare("torch._dynamo.eval_frame", "innermost_fn", READ, (DYNAMO_PACKAGE,), "the compiled function's source file")
DYNAMO_CONTEXT_CALL = _declare("torch._dynamo.eval_frame", "_TorchDynamoContext.__call__", PATCH,
                               (CUDAGRAPH_RELOAD,),
                               "a loaded package's graphs are set up under the compile's options (CUDA graphs)")
_declare("torch._dynamo.convert_frame", "ConvertFrame._torchdynamo_orig_backend", READ, (CUDAGRAPH_RELOAD,),
         "the compile's backend under Dynamo's wrappers, whose options a loaded package's graphs are set "
         "up under (none without it)", required=False, checked_on=SOURCE_CHECKED_ON, on_instances=True)

# --- the sweep's capture and its workers (inductor_glue/capture.py, timing.py, workers/)
_declare("torch._inductor.utils", "fresh_cache", READ, (SWEEP_CAPTURE,),
         "each capture and tuning compile starts from empty Inductor caches")
BENCHMARK_FUSION = _declare("torch._inductor.config", "benchmark_template_fusion", ASSIGN, (SWEEP_CAPTURE,),
                            "off while capturing and tuning (it changes no choice); torch 2.15's name, whose "
                            "old name is a deprecated alias there that warns", checked_on=CHECKED_ON,
                            alternatives=("benchmark_epilogue_fusion",))
_declare("torch._inductor", "list_mode_options", READ, (SWEEP_CAPTURE,), "a mode's options, CUDA graphs taken out")
UNIQUE_ID = _declare("torch.fx.experimental.symbolic_shapes", "ShapeEnv._generate_unique_id", PATCH,
                     (SWEEP_CAPTURE,), "a worker's size symbols get the model's numbers (creation order "
                     "numbering, before torch 2.7, needs nothing)", required=False)
BENCHMARK_GPU = _declare("torch._inductor.runtime.benchmarking", "benchmarker.benchmark_gpu", ASSIGN,
                         (SWEEP_CAPTURE,), "the sweep times GPU candidates kernel-bound")
_declare("torch._inductor.runtime.benchmarking", "maybe_gpu_benchmark_lock", READ, (SWEEP_CAPTURE,),
         "Inductor's lock around GPU timing (torch 2.13; none before)", required=False,
         checked_on=("2.13", "2.14", "2.15"))
_declare("torch.cuda", "_sleep", READ, (SWEEP_CAPTURE,), "holds the GPU while the CPU queues timed calls")
_declare("torch._dynamo.utils", "compilation_time_metrics", READ, (SWEEP_CAPTURE,),
         "the pointwise pass reports where its compile's time went")
_declare("torch", "Tensor._base", READ, (SWEEP_CAPTURE,),
         "a worker copies a view's input to a tensor of its own, so its size symbols are the model's",
         checked_on=SOURCE_CHECKED_ON)
# Only `autotune sweep --ddp/--fsdp` needs it (inductor_glue/distributed.py): not required.
FAKE_STORE = _declare("torch.testing._internal.distributed.fake_pg", "FakeStore", READ, (SWEEP_CAPTURE,),
                      "--ddp/--fsdp compile a rank's graphs in one process over a fake process group",
                      required=False)

# --- CPython's own internals (not torch's): the import gate of the background install
# (autotune/job/import_gate.py, which leaves a Python without them alone) and the exit wait
# (autotune/job/exit_wait.py, atexit without it). No feature depends on them.
_BOOTSTRAP = "_frozen_importlib"  # importlib._bootstrap, as the interpreter runs it
IMPORT_FIND_AND_LOAD = _declare(_BOOTSTRAP, "_find_and_load", PATCH, (),
                                "wrapped while the gate is closed: a missing module's import waits for it to open",
                                required=False, checked_on=PYTHON_CHECKED_ON)
IMPORT_LOCK_UNLOCK = _declare(_BOOTSTRAP, "_lock_unlock_module", PATCH, (),
                              "wrapped while the gate is closed: an import of a module still executing waits",
                              required=False, checked_on=PYTHON_CHECKED_ON)
_declare(_BOOTSTRAP, "_blocking_on", READ, (),
         "which module lock the install waits for: a thread holding it is never held by the gate",
         required=False, checked_on=PYTHON_CHECKED_ON)
_declare(_BOOTSTRAP, "ModuleSpec._initializing", READ, (),
         "a module still executing is not complete: an import of it waits at the gate",
         required=False, checked_on=PYTHON_CHECKED_ON, on_instances=True)
_declare("threading", "_register_atexit", READ, (),
         "the exit wait runs before threading joins its threads (atexit, after them, without it)",
         required=False, checked_on=PYTHON_CHECKED_ON)


# ------------------------------------------------------------------ features


@dataclass(frozen=True)
class FeatureState:
    feature: Feature
    missing: tuple[tuple[Seam, str], ...]  # required seams that do not resolve, and why

    @property
    def on(self) -> bool:
        return not self.missing


def seams_of(feature: Feature) -> list[Seam]:
    return [seam for seam in SEAMS if feature in seam.features]


def state(feature: Feature) -> FeatureState:
    missing = []
    for seam in seams_of(feature):
        problem = seam.problem() if seam.required else None
        if problem is not None:
            missing.append((seam, problem))
    return FeatureState(feature, tuple(missing))


_warned: set[str] = set()


def usable(feature: Feature) -> bool:
    """Whether every seam ``feature`` needs resolves; if not, one warning per process
    names the feature, the first missing seam and the fallback."""
    found = state(feature)
    if not found.on and feature.key not in _warned:
        _warned.add(feature.key)
        problem = found.missing[0][1]
        log.warning("autotune: %s is off: %s; %s", feature.name, problem, feature.fallback)
    return found.on


def usable_all(features: Iterable[Feature]) -> set[str]:
    """The keys of the features among ``features`` that are off (each warned once)."""
    return {feature.key for feature in features if not usable(feature)}
