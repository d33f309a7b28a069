"""The warm-start hook: torch.compile reads winners from the cache.

``warm_start()`` installs a selector whose lookups are answered from the SQL
cache. A hit hands Inductor the stored timing of every candidate, so nothing is
compiled or benchmarked and Inductor picks the stored winner. A miss falls back
(by ``on_miss``), is written back, and is logged for the next sweep.

The cache must never fail a job: every store call runs with a bounded timeout,
and the first error disables the cache for the process with one warning, after
which compiles behave like plain max-autotune.

This module installs and uninstalls; how each lookup is answered is ``ServePolicy``'s
(autotune/job/serve_policy.py), and what a job counts is ``HookStats`` (autotune/job/hook_stats.py).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autotune.cache.signing import NO_TRUSTED_KEYS, Signer, TrustedKeys
from autotune.inductor_glue import guard_repr, seams
from autotune.inductor_glue.inductor import install, uninstall
from autotune.settings import Settings, load_keys, warm_start_settings

from . import exit_wait
from .hook_stats import CacheMissError, HookStats
from .serve_policy import ServePolicy, artifact_device

if TYPE_CHECKING:
    from .artifacts import ArtifactSeams

# CacheMissError and HookStats are the hook's own public names (``autotune run``, a job catching
# on_miss="error"); they live in hook_stats.py, which the prefetch shares without importing the hook.
__all__ = ["CacheMissError", "HookStats", "WarmStart", "warm_start", "warm_start_for_pass"]

log = logging.getLogger(__name__)


class WarmStart:
    """The handle ``warm_start()`` returns: stats, uninstall, and a context manager."""

    # Inductor's benchmark_epilogue_fusion is left as the job has it (on, on GPUs):
    # whether a winning template should absorb its neighbours depends on the
    # graph, which an isolated tuning cannot see (on GPUs, turning it off made the
    # transformer example measurably slower). With pinning it
    # weighs one template against ATen, and where the sweep's pass stored its
    # verdict for a fusion, that verdict is served instead (inductor_glue/fusion.py).
    def __init__(self, policy: ServePolicy, trusted: TrustedKeys = NO_TRUSTED_KEYS,
                 signer: Signer | None = None, *, prefetch: bool = False) -> None:
        from autotune.inductor_glue.env import pin_triton_toolchain, prewarm_triton_backend, probe_vec_isa_early
        from autotune.inductor_glue.inductor import benchmarks_run

        pin_triton_toolchain()  # the same Triton backend hash as the sweep's workers
        self._benchmarks_before = benchmarks_run()  # the stats count this process's from here
        self._policy = policy
        guard_repr.push(self)  # a compiled optimizer step's first call prints none of its tensors
        gpu = _triton_device()
        off = seams.usable_all(_features_in_use(policy.settings, gpu))  # one warning per feature a seam turns off
        # Built at the first lowering, if any; None where this torch lacks the selector's seams.
        self._selector = install(policy, lazy=True) if seams.GEMM_SERVING.key not in off else None
        if self._selector is not None:
            from . import compile_retry

            compile_retry.push(policy)  # a graph that fails with served kernels compiles again with ATen's
        self._kernel_device = gpu if policy.settings.kernel_configs and seams.KERNEL_CONFIGS.key not in off else None
        self._holding_kernels = gpu is not None
        # The warm-ups on threads of their own come with the install on a thread (the opt-in,
        # autotune/job/background.py) only: by default the first compile does them itself, and the
        # only threads the install starts are the cache's reads (docs/guide.md says why).
        early = policy.settings.background_install
        if gpu is not None:
            self._prepare_kernels(policy, gpu, prewarm_triton_backend() if early else None)
        self._verdicts = _verdict_modules(policy, gpu, off)
        if prefetch:  # before the artifact tier, which asks the prefetch first
            policy.start_prefetch(trusted if policy.settings.artifacts else NO_TRUSTED_KEYS, gpu or "cpu")
        self._artifacts = _artifact_seams(policy, trusted, signer)
        # After the artifact tier, which serves the probes' builds. Their thread is not waited for
        # at exit (it runs Python and compilers in subprocesses, nothing that minds being ended,
        # and its probes take seconds on a small CPU): a script that never compiles exits at once.
        if prefetch and early and gpu is None:
            probe_vec_isa_early()
        self.installed = True

    def _prepare_kernels(self, policy: ServePolicy, device: str, prewarm: threading.Thread | None) -> None:
        """Threads that the first Triton kernel (compiled, or unpacked from a cached graph)
        waits for: Triton's backend hash, and the stored pointwise configs."""
        from . import kernel_configs

        threads = [prewarm] if prewarm is not None else []
        if self._kernel_device is not None:
            loader = threading.Thread(target=policy.load_kernel_configs, args=(device,),
                                      name="autotune-kernel-configs", daemon=True)
            loader.start()
            threads.append(loader)
            kernel_configs.push(lambda key, value: policy.save_kernel_config(device, key, value))
        for thread in threads:  # the interpreter's exit waits for them too (autotune/job/exit_wait.py says why)
            exit_wait.finish_before_exit(thread)
        timeout = policy.settings.lookup_timeout + 10

        def ready() -> None:
            for thread in threads:
                thread.join(timeout=timeout)

        kernel_configs.hold_compiles_until(ready)

    @property
    def stats(self) -> HookStats:
        from autotune.inductor_glue.inductor import benchmarks_run

        stats = self._policy.stats
        if self.installed:
            timed_here = stats.fusion_verdicts_saved + stats.pad_decisions_saved
            stats.benchmarks = benchmarks_run() - self._benchmarks_before + timed_here
        return stats

    @property
    def settings(self) -> Settings:
        return self._policy.settings

    def flush(self) -> None:
        """Finish writing what this process has to store so far: kernel configs, and with a
        signing key, the compiled artifacts and Dynamo's packages (call it once the model has
        run forward and backward: a package is complete only then)."""
        self._publish_packages()
        self._policy.store.flush(max(30.0, 10 * self.settings.lookup_timeout))

    @property
    def kernels_tuned(self) -> int:
        """Pointwise/reduction kernels Inductor tuned in this process (not served)."""
        return len(self._policy.tuned_keys)

    def withhold_artifacts(self) -> int:
        """Publish none of this process's compiled artifacts, queued or to come (the sweep's
        pass, when its graphs were compiled before some of their kernels were tuned: a node
        loading them would tune those kernels again). Data writes go on. Returns how many
        queued artifacts were dropped."""
        return self._policy.store.withhold_artifacts()

    def _publish_packages(self) -> None:
        if self._artifacts is not None:
            self._artifacts.publish_packages()  # a refusal counts itself in stats.packages_refused

    def uninstall(self) -> None:
        global _active
        if not self.installed:
            return
        if self._selector is not None:
            from . import compile_retry

            uninstall(self._selector)
            compile_retry.pop(self._policy)
        if self._artifacts is not None:
            self._publish_packages()
            self._artifacts.remove()
        if self._holding_kernels:
            from . import kernel_configs

            kernel_configs.release_compiles()
            if self._kernel_device is not None:
                kernel_configs.pop()
        for module in self._verdicts:
            module.pop()
        guard_repr.pop(self)
        self._policy.close()
        self.installed = False
        if _active is self:
            _active = None

    def __enter__(self) -> WarmStart:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def __repr__(self) -> str:
        return f"WarmStart({self.stats}, installed={self.installed})"


class _DecisionBook:
    """The policy's store as a book of one kind of decision (inductor_glue/fusion.py,
    padding.py) for one GPU; ``kind`` names its HookStats counters."""

    def __init__(self, policy: ServePolicy, device: str, prefix: str, kind: str) -> None:
        self._policy, self._device, self._prefix, self._kind = policy, device, prefix, kind
        self._served: set[str] = set()  # Inductor asks again about a pair it did not fuse
        self._recorded: set[str] = set()  # a pending fusion is recorded again once resolved

    def stored(self, key: str) -> dict[str, Any] | None:
        return self._policy.decisions(self._device, self._prefix).get(key)

    def record(self, key: str, value: dict[str, Any]) -> None:
        self._log("timed", key, value)
        counter = None if key in self._recorded else f"{self._kind}_saved"  # one per decision
        self._recorded.add(key)
        self._policy.save_decision(self._device, self._prefix, key, value, counter)

    def served(self, key: str) -> None:
        if key in self._served:
            return
        self._served.add(key)
        self._log("served", key, self.stored(key))
        counter = f"{self._kind}_served"
        setattr(self._policy.stats, counter, getattr(self._policy.stats, counter) + 1)

    def _log(self, what: str, key: str, value: Any) -> None:
        entries = self._policy.stats.verdict_log
        if len(entries) < 256:
            entries.append(f"{self._kind} {what} {key} {json.dumps(value, sort_keys=True, default=str)}")


def _features_in_use(settings: Settings, gpu: str | None) -> list[seams.Feature]:
    """The features this hook turns on, by its settings and device (the artifact tier's
    own are checked where it installs them, autotune/job/artifacts.py)."""
    wanted = {seams.GEMM_SERVING: True, seams.PINNING: settings.pin, seams.KERNEL_CONFIGS: settings.kernel_configs,
              seams.FUSION_VERDICTS: settings.verdicts, seams.PADDING_VERDICTS: settings.verdicts}
    return [feature for feature, on in wanted.items() if on and (gpu is not None or not feature.gpu_only)]


def _verdict_modules(policy: ServePolicy, gpu: str | None, off: set[str]) -> list[Any]:
    """Serve the stored fusion and padding verdicts on a GPU (each unless a seam turns it off);
    the modules to pop at uninstall."""
    if gpu is None or not policy.settings.verdicts:
        return []
    from autotune.inductor_glue import fusion, padding

    serving = []
    for feature, module, kind in ((seams.FUSION_VERDICTS, fusion, "fusion_verdicts"),
                                  (seams.PADDING_VERDICTS, padding, "pad_decisions")):
        if feature.key not in off:
            module.push(_DecisionBook(policy, gpu, module.PREFIX, kind))
            serving.append(module)
    if fusion in serving:
        policy.fusion_device = gpu
    return serving


_active: WarmStart | None = None


def _triton_device() -> str | None:
    """The device whose pointwise kernels Inductor tunes at run time (GPUs only)."""
    import torch

    return "cuda" if torch.cuda.is_available() else None


def warm_start(
    cache: str | None = None,
    *,
    on_miss: str | None = None,
    write_back: bool | None = None,
    read_only: bool = False,
    trusted_keys: Sequence[str] | None = None,
    signing_key: str | None = None,
    settings: Settings | None = None,
) -> WarmStart:
    """Serve every later torch.compile autotune request in this process from the cache.

    ``cache`` is a database URL (None: ``AUTOTUNE_CACHE`` or the embedded SQLite
    file). ``on_miss`` (None: ``AUTOTUNE_ON_MISS``, else "tune") is "tune" (benchmark as usual), "aten" (take ATen without
    benchmarking), "error" (raise, naming the request) or "nearest" (take the kernel
    the sweep chose for the nearest shape it swept, within 4x in every dimension, without
    benchmarking; tune if there is none). Every miss is logged for the next sweep. A second call replaces
    the first. Nothing here connects to the database: the first lookup does, so
    a cache that is down costs one warning, never the job.

    Artifacts (compiled graphs and kernels, Dynamo's packages) are loaded only when
    signed by one of ``trusted_keys`` (public key files; default
    ``AUTOTUNE_TRUSTED_KEYS``), and published, signed, when ``signing_key`` (a private
    key file; default ``AUTOTUNE_SIGNING_KEY``) is given. With neither, artifacts are
    neither read nor written. A key file that is missing or malformed raises
    ``KeyFileError`` here, naming the file, before anything is installed.
    """
    return _install(warm_start_settings(cache, on_miss=on_miss, write_back=write_back, read_only=read_only,
                                        trusted_keys=trusted_keys, signing_key=signing_key, settings=settings))


def warm_start_for_pass(settings: Settings, *, time_in_graph: bool = False) -> WarmStart:
    """The sweep's end-to-end pass: served like a job, except that its writes wait for
    ``flush()`` (it tunes kernels here, and they are timed in this process), and, with
    ``time_in_graph``, each hit is timed here and stored as its in-graph verdict
    (autotune/job/in_graph.py). A miss is tuned and written back, whatever a job's settings say."""
    return _install(settings.replace(on_miss="tune", write_back=True), time_in_graph=time_in_graph,
                    defer_writes=True)


def _install(settings: Settings, *, time_in_graph: bool = False, defer_writes: bool = False) -> WarmStart:
    global _active
    trusted, signer = load_keys(settings)  # a bad key file raises before anything is replaced
    if _active is not None:
        _active.uninstall()
    policy = ServePolicy(settings, time_in_graph=time_in_graph, defer_writes=defer_writes)
    # The sweep's pass (deferred writes) reads as it always has: its lookups are few and timed.
    _active = WarmStart(policy, trusted, signer, prefetch=settings.prefetch and not defer_writes)
    return _active


def _artifact_seams(policy: ServePolicy, trusted: TrustedKeys, signer: Signer | None) -> ArtifactSeams | None:
    """The artifact tier installed into torch's caches, or None when no key is configured."""
    if policy.settings.read_only:
        signer = None  # read-only credentials: never try to publish
    if not trusted and signer is None:
        return None
    from .artifacts import ArtifactSeams, ArtifactTier

    tier = ArtifactTier(trusted=trusted, signer=signer, device=artifact_device(), stats=policy.stats,
                        call=policy.store.call, submit=policy.store.submit_artifact_write, timeout=policy.settings.lookup_timeout,
                        max_bytes=policy.settings.max_artifact_bytes, malformed=policy.store.malformed_row,
                        prefetched=policy.prefetch)
    return ArtifactSeams(tier, dynamo_package=policy.settings.dynamo_package)
