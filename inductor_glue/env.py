"""Environment keys: what must match for a stored timing to be valid here.

A timing (and a Triton choice's hash) depends on the device, the software stack
and the Inductor config values that change the candidate list or kernel source.
Inductor's own system hash carries no device information on CPU, so the CPU
model and vector ISA are added here.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.util
import logging
import platform
import threading
from collections.abc import Callable
from typing import Any

from autotune.cache.records import Environment, digest

log = logging.getLogger(__name__)

# Inductor config values that change which candidates exist or what their source
# is (and so their hash_key), or how they are timed. Keys absent from the
# installed torch are skipped, so the list can name keys of several releases.
FINGERPRINT_KEYS: tuple[str, ...] = (
    "max_autotune",
    "max_autotune_gemm",
    "max_autotune_gemm_backends",
    "max_autotune_conv_backends",
    "max_autotune_gemm_search_space",
    "max_autotune_flex_search_space",
    "max_autotune_allow_flexible_layouts",
    "coordinate_descent_tuning",
    "coordinate_descent_check_all_directions",
    "coordinate_descent_search_radius",
    "autotune_remote_cache",
    "force_disable_caches",
    "deterministic",
    "freezing",
    "cpp_wrapper",
    "force_same_precision",
    "emulate_precision_casts",
    "search_autotune_cache",
    "autotune_fallback_to_aten",
    "epilogue_fusion",
    "prologue_fusion",
    "enable_persistent_tma_matmul",
    "triton.enable_persistent_tma_matmul",
    "triton.native_matmul",
    "cpp.simdlen",
    "cpp.weight_prepack",
    "cpp.enable_kernel_profile",
)

_MISSING = object()


def _config_value(config: Any, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        node = getattr(node, part, _MISSING)
        if node is _MISSING:
            return _MISSING
    return node


def relevant_config() -> dict[str, Any]:
    """The fingerprinted Inductor config values as they are right now."""
    from torch._inductor import config

    values: dict[str, Any] = {}
    for key in FINGERPRINT_KEYS:
        value = _config_value(config, key)
        if value is _MISSING:
            continue
        # Sets and other non-JSON values are stored by repr so that they stay data.
        values[key] = value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)
    return values


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return model


# Held while the vector ISA is probed: a caller meanwhile waits for that answer instead of
# probing again beside it (probe_vec_isa_early starts the probes on a thread of their own).
_CPU_DESCRIPTION_LOCK = threading.RLock()


def cpu_description() -> str:
    """CPU model name plus the vector ISA Inductor's C++ backend will use."""
    with _CPU_DESCRIPTION_LOCK:
        return _cpu_description()


def probe_vec_isa_early() -> threading.Thread | None:
    """Start Inductor's vector-ISA probes now, on a daemon thread, in a copy of the caller's
    context (torch 2.13 keeps an assigned config option per thread); None where a module they
    need is missing (they run at the first compile then, as they would without this).

    A CPU job's cache keys name the ISA, so its first compile asks for it first, and the probes
    are a large part of a small model's warm first call (docs/results.md): each builds a small
    C++ program (fetched through the artifact tier, where one is stored) and starts a Python
    process that loads it. Started while the script builds its model, they are done when the
    compile asks. The modules they use are imported here, on the caller's thread, so the thread
    imports nothing: two threads importing at once can meet in Python's per-module import locks."""
    try:
        import_probe_modules()
    except Exception:  # noqa: BLE001 - setuptools absent, say: never fail a warm start for an optimization
        log.debug("the vector-ISA probes wait for the first compile", exc_info=True)
        return None
    thread = threading.Thread(target=contextvars.copy_context().run, args=(cpu_description,),
                              name="autotune-isa-probe", daemon=True)
    thread.start()
    return thread


# Every module the vector-ISA probes import (tests/test_isa_probes.py checks it). The install on
# a thread imports them on a CPU job before the script's imports go on (autotune/job/background.py).
PROBE_MODULES = (
    "torch._inductor.codecache",  # a probe writes its source and takes its file lock there
    "torch._inductor.cpp_builder",
    "torch._inductor.cpu_vec_isa",
    "torch.utils.cpp_extension",  # a probe's build imports it, and setuptools with it
)


def import_probe_modules() -> None:
    for name in PROBE_MODULES:
        importlib.import_module(name)


@functools.cache
def _cpu_description() -> str:
    model = cpu_model()
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa

        isa = str(pick_vec_isa()) or "scalar"
    except Exception:  # the ISA probe compiles C++; never fail a key on it
        isa = "unknown-isa"
    return f"{model} [{isa}]"


@functools.cache
def reprobe_vec_isa() -> str:
    """Probe the CPU's vector ISA again, as a fresh process would, and return the ISA picked
    ("" where it cannot be done).

    Inductor probes each ISA once per process by building a small C++ program into its cache
    dir. A publishing pass calls this in its fresh cache dir with the artifact tier installed:
    the probes are built again there, through the tier, and published with the kernels. A job on
    a fresh node then fetches them instead of compiling them (the probes were most of a small
    model's first call on a 2-core CPU: docs/results.md). Once per process: the probes do not
    depend on the graph, and a pass compiles once per batch size, each in a fresh cache dir."""
    from .seams import PICK_VEC_ISA, VEC_ISA_LIST, VEC_ISAS

    try:
        probed, isas = VEC_ISA_LIST.resolve(), VEC_ISAS.resolve()
        for cached in _probe_caches(isas):
            cached.cache_clear()
        for isa in isas:
            _forget_probed_flags(isa)
        probed.cache_clear()
        return str(PICK_VEC_ISA.resolve()())
    except Exception:  # noqa: BLE001 - a probe not published costs a job its compile, nothing more
        log.debug("could not probe the vector ISA again", exc_info=True)
        return ""


def _forget_probed_flags(isa: Any) -> None:
    """Drop what an earlier probe left on an ISA object: a probe that passes sets a flag on it
    (``_is_avx512_bf16_supported``) that adds compiler flags to the next probes, whose builds
    then have other keys than a fresh process's. Such flags shadow class attributes; the
    object's dataclass fields (its construction) stay."""
    import dataclasses

    fields = {field.name for field in dataclasses.fields(isa)} if dataclasses.is_dataclass(isa) else set()
    for name in [n for n in vars(isa) if n not in fields and hasattr(type(isa), n)]:
        delattr(isa, name)


def _probe_caches(isas: Any) -> list[Any]:
    """The cached probe verdicts of each ISA class (its ``__bool__`` and helpers), once each."""
    found: dict[int, Any] = {}
    for isa in isas:
        for klass in type(isa).__mro__:
            for value in vars(klass).values():
                if callable(getattr(value, "cache_clear", None)):
                    found.setdefault(id(value), value)
    return list(found.values())


def triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return str(triton.__version__)


@functools.cache
def _device_and_versions(device_kind: str) -> dict[str, Any]:
    """The device and the software versions: cheap, and fixed within a process."""
    import torch

    return {
        "device_kind": device_kind,
        "device_name": torch.cuda.get_device_name(0) if device_kind == "cuda" else cpu_description(),
        "torch_version": torch.__version__,
        "triton_version": triton_version(),
        "cuda_version": torch.version.cuda,
    }


@functools.cache
def _static_part(device_kind: str) -> dict[str, Any]:
    """Parts that cannot change within a process, Inductor's system hash included: computed once."""
    from torch._inductor.codecache import CacheBase

    return {**_device_and_versions(device_kind), "system_hash": CacheBase.get_system()["hash"]}


def current_environment(device_kind: str) -> Environment:
    """The environment a request on ``device_kind`` is tuned or served in, now."""
    import torch

    config = relevant_config()
    static = dict(_static_part(device_kind))
    if device_kind == "cpu":
        # The thread count changes C++ GEMM blocking (so the kernel source and hash)
        # and every CPU timing.
        static["device_name"] = f"{static['device_name']} {torch.get_num_threads()} threads"
    return Environment(config_fingerprint=digest(config)[:32], config=config, **static)


def package_environment(device_kind: str) -> str:
    """What a Dynamo package's key is filed under: versions, device and Inductor config.

    Lighter than the full environment key: on a GPU that key's system hash hashes Triton's
    whole install (about a second on a GPU host), which a job that loads its package pays for nothing
    else. Triton's and CUDA's versions and the GPU's name stand in for it; the package's
    compiled graphs keep their own keys, and Dynamo checks Python's and torch's versions.
    """
    import torch

    known = _device_and_versions(device_kind)
    # On CPU the thread count shapes C++ kernels, as in current_environment.
    device = known["device_name"] if device_kind == "cuda" else f"{known['device_name']} {torch.get_num_threads()} threads"
    parts = (device_kind, device, known["torch_version"], known["triton_version"], known["cuda_version"],
             relevant_config())
    return digest(*parts)[:24]


def kernel_config_environment(device_kind: str) -> Environment:
    """The environment pointwise/reduction configs are filed under: device and versions only.

    Their keys hash the kernel source, which already carries every Inductor flag that
    matters and Triton's own hash (Inductor writes it into each kernel's metadata); and
    they are saved when a kernel first runs, outside the compile, where torch.compile's
    mode options are no longer applied. So Inductor's system hash is not needed here, and
    it is dear: it hashes Triton's whole install. A job reads these configs on a thread
    that the first kernel it loads from a cached graph waits for; on a CUDA host (torch 2.11)
    that hash took most of a second of that thread, and its GIL slowed the job's own imports.
    """
    known = _device_and_versions(device_kind)
    return Environment(config_fingerprint="kernel-configs", config={}, system_hash=digest(known)[:32], **known)


def cpu_threads(env: Environment) -> int | None:
    """The thread count a CPU environment was recorded with."""
    if env.device_kind != "cpu" or not env.device_name.endswith(" threads"):
        return None
    return int(env.device_name.rsplit(" ", 2)[-2])


def pin_triton_toolchain() -> None:
    """Make Triton's backend hash the same in every process: capture, workers and jobs.

    Every Triton template's source embeds a backend hash that includes the ptxas
    version. Torch points TRITON_PTXAS_PATH at its own ptxas the first time it
    compiles a Triton kernel in a process, so a hash taken before that moment
    differs from one taken after (seen on a CUDA host, torch 2.11: every Triton
    choice hash of a one-op reproduction differed from the model's). Doing what
    torch will do anyway, up front, gives one answer everywhere.
    """
    try:
        from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path
    except ImportError:  # older or newer torch without it: nothing to pin
        return
    _set_triton_ptxas_path()


# The thread hashing Triton's install (prewarm_triton_key), once per process.
_TRITON_KEY: list[threading.Thread] = []


def prewarm_triton_key() -> threading.Thread | None:
    """Start hashing Triton's install, its key, on a thread (None: no Triton here, or started already).

    Every compiled graph's cache key holds it (``CacheBase.get_system``), so a fresh process's
    first compile computes it unless something did before: it reads and hashes Triton's
    sources and its native library, longer beside other work (the prewarm's thread, started at
    the install, was still at it when a compile called at once asked, and the compile hashed
    it again: docs/internals.md). Reading files and hashing megabyte chunks hold the GIL
    little, so started before Inductor's imports it ends during them. Triton is imported here,
    on the caller's thread: the hashing thread then imports nothing that another thread may be
    importing. Triton caches the key (functools.lru_cache), and torch reads it from there."""
    from .seams import TRITON_KEY

    if _TRITON_KEY or importlib.util.find_spec("triton") is None:
        return None
    try:
        triton_key = TRITON_KEY.resolve()
    except Exception:  # noqa: BLE001 - a Triton without it, or one that fails to import: the compile says so
        log.debug("Triton's key is left to the first compile", exc_info=True)
        return None

    def compute() -> None:
        try:
            triton_key()
        except Exception:  # noqa: BLE001 - the compile computes it again and reports what fails
            log.debug("hashing Triton's install failed", exc_info=True)

    thread = threading.Thread(target=compute, name="autotune-triton-key", daemon=True)
    _TRITON_KEY.append(thread)
    thread.start()
    return thread


def prewarm_triton_backend() -> threading.Thread | None:
    """Start building what Inductor's Triton backend hash needs, on a thread (None: nothing to build).

    A compiled graph loaded from a cache asks for ``triton_hash_with_backend()`` before
    it runs (Inductor's autotune-cache metadata). In a fresh process that builds
    Triton's CUDA driver stub with the C compiler and hashes Triton's whole install:
    most of a second on the main thread of a GPU job (torch 2.11), almost all of it waiting on
    the compiler or hashing megabyte chunks, neither of which holds the GIL. Started
    at warm_start(), it overlaps the job's own imports. The result is cached by torch
    (functools.cache), so the job reads it; join the thread before the first cached
    graph loads, so the two never build it twice at once. Call after
    ``pin_triton_toolchain()``: the hash includes the ptxas version.
    """
    try:
        from torch.utils._triton import has_triton, triton_hash_with_backend
    except ImportError:  # a torch without it: nothing to prewarm
        return None

    def build() -> None:
        for hashing in _TRITON_KEY:  # the key hashed once: this thread builds the driver's module after it
            hashing.join()
        try:
            if has_triton():
                triton_hash_with_backend()
        except Exception:  # noqa: BLE001 - the job computes it again and reports what fails
            log.debug("prewarming Triton's backend hash failed", exc_info=True)

    thread = threading.Thread(target=build, name="autotune-triton-prewarm", daemon=True)
    thread.start()
    return thread


def prewarm_compile_passes(device: str, stop: Callable[[], bool] = lambda: False,
                           pace: Callable[[], None] = lambda: None) -> int:
    """Register Inductor's pattern passes now, as the first compile on ``device`` would: the
    background install does it while the script builds its model, so the first compile finds
    them done (a small model's first call spent a large share of its time there). First it
    sets up what every compile sets up on first use (``set_up_first_compile``). Before each
    step, ``pace()`` returns once the step may run (the caller's choice of when), then
    ``stop()`` true leaves it and the rest to the compile. Never raises; how many passes it
    registered (a pass already registered in this process is not counted).

    They are registered on a thread of this function's own, which never exits where it must
    not: tracing the patterns enters ``FakeTensorMode``, and its first entry in a process with a
    CUDA build and no usable GPU (PyPI's torch wheel on a CPU machine, ``CUDA_VISIBLE_DEVICES=``)
    makes c10 swap CUDA's device guard for a fake one kept in the entering thread's
    ``thread_local`` storage, its address stored in the process-wide guard registry
    (``c10::impl::ensureCUDADeviceGuardSet``; torch 2.11 and 2.13 alike, the CPU wheel has no
    CUDA guard to swap). Once that thread exits, the registry points at freed memory and the
    next ``FakeTensorMode`` entry, the script's first compile, dies of a segmentation fault. So
    the thread that traced outlives the process there (parked, at most one per device); the
    install thread waits for it and exits as before."""
    done = threading.Event()
    warmed: list[int] = []
    threading.Thread(target=_register_passes, args=(device, warmed, done, stop, pace),
                     name="autotune-inductor-passes", daemon=True).start()
    done.wait()
    return warmed[0] if warmed else 0


def set_up_first_compile(stop: Callable[[], bool] = lambda: False, pace: Callable[[], None] = lambda: None) -> None:
    """Run what every compile runs once per process on first use (``FIRST_COMPILE_SETUP``:
    Dynamo's backends, Inductor's code generators, the modules a trace filters from its stack,
    then local_map's module), importing the modules they import, so that a served compile's
    first call does not. Each is a ``functools.cache``: the compile's own call then returns at
    once, and a step this leaves is run by the compile as without it. ``pace`` and ``stop`` as
    for the passes. Never raises."""
    import torch

    from .seams import FIRST_COMPILE_SETUP, LOCAL_MAP_MODULE

    # local_map's module is imported only where torch.distributed is built in, as Dynamo does.
    local_map = (LOCAL_MAP_MODULE,) if torch.distributed.is_available() else ()
    for seam in (*FIRST_COMPILE_SETUP, *local_map):
        try:
            pace()
            if stop():
                return
            set_up = seam.resolve()  # a module seam: the import itself
            if callable(set_up):
                set_up()
        except Exception:  # noqa: BLE001 - the first compile sets it up itself
            log.debug("setting up %s early failed", seam.path, exc_info=True)


# Never set: the passes' thread waits on it for good where the fake CUDA guard is its own.
_OUTLIVE_THE_PROCESS = threading.Event()


def _register_passes(device: str, warmed: list[int], done: threading.Event, stop: Callable[[], bool],
                     pace: Callable[[], None]) -> None:
    traced = False
    try:
        import torch

        from .seams import LAZY_PASSES

        set_up_first_compile(stop, pace)
        count = 0
        for seam in LAZY_PASSES:
            try:
                pace()
                if stop():
                    break
                lazy_init = seam.resolve()
                misses = _cache_misses(lazy_init)
                if seam.module.endswith("joint_graph"):  # its patterns are per device, as the compile's inputs
                    on = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device(device)
                    args: tuple[Any, ...] = (on,)
                else:
                    args = ()
                try:
                    lazy_init(*args)
                finally:  # a trace that raised may have entered FakeTensorMode all the same
                    ran = misses is None or _cache_misses(lazy_init) != misses
                    traced = traced or ran
                count += ran  # a pass some compile had registered already is not counted
            except Exception:  # noqa: BLE001 - the first compile registers them itself
                log.debug("prewarming %s failed", seam.path, exc_info=True)
        warmed.append(count)
    finally:
        done.set()
    if traced and _fake_cuda_guard_is_thread_local():
        _OUTLIVE_THE_PROCESS.wait()


def _cache_misses(lazy_init: Any) -> int | None:
    """How often ``lazy_init`` (a ``functools.cache``) ran its body; None where it is not one."""
    info = getattr(lazy_init, "cache_info", None)
    return info().misses if info is not None else None


def _fake_cuda_guard_is_thread_local() -> bool:
    """Whether FakeTensorMode swaps in a fake CUDA guard owned by the entering thread: a CUDA
    build without a usable GPU (True where it cannot tell)."""
    try:
        import torch

        return bool(torch.backends.cuda.is_built()) and not torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return True


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
