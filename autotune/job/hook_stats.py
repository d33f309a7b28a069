"""What a warm start counts, and how it names a miss: shared by the hook, its serving policy,
the prefetch and ``autotune run``'s summary."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.cache.records import TuningRequest
from autotune.shapes import shape_summary


class CacheMissError(RuntimeError):
    """Raised with on_miss="error": the cache does not cover a request."""


MISSES_LISTED = 32


def missed_entry(request: TuningRequest) -> dict[str, Any]:
    """What a miss asked for, to compare with what the sweep captured (``autotune cache show``)."""
    return {"request": shape_summary(request), "key": request.key,
            "exprs": [list(i.exprs) for i in request.inputs], "strides": [list(i.strides) for i in request.inputs]}


@dataclass
class HookStats:
    hits: int = 0
    misses: int = 0
    # Graphs whose compile failed with served kernels, compiled again with ATen's (compile_retry.py).
    compiles_retried: int = 0
    written: int = 0
    errors: int = 0
    # Stored rows that failed validation (a timing that is no time, JSON of the wrong shape, a
    # payload over the size cap): each read as absent, with one warning.
    malformed_rows: int = 0
    # Seconds compiles spent waiting on the cache (bounded by the lookup timeout once
    # per process: the first timeout disables the cache).
    store_wait_s: float = 0.0
    # Triton configs of cached requests that were never generated (pinning).
    configs_skipped: int = 0
    # Hits whose stored winner was not among the generated choices (a pin that did
    # not match): the best remaining choice was used. Should stay 0.
    winner_not_generated: int = 0
    # Misses served with on_miss="nearest" from the nearest swept shape (still misses).
    nearest: int = 0
    # Pointwise/reduction configs served from the cache, and copied into it (one per kernel:
    # Inductor saves a kernel's config after its autotuning and again after coordinate descent).
    kernel_configs_loaded: int = 0
    kernel_configs_saved: int = 0
    # Decisions Inductor takes by timing on GPUs, served from the cache instead, and copied
    # into it: epilogue-fusion verdicts (inductor_glue/fusion.py) and padding verdicts
    # (inductor_glue/padding.py).
    fusion_verdicts_served: int = 0
    fusion_verdicts_saved: int = 0
    pad_decisions_served: int = 0
    pad_decisions_saved: int = 0
    # The first of them, "<kind> served|timed <key> <value>", to compare two compiles by.
    verdict_log: list[str] = field(default_factory=list)
    # The first few keys copied into the cache (to compare runs).
    saved_keys: list[str] = field(default_factory=list)
    # The first few misses, with their size expressions: a dynamic graph's job that misses
    # what the sweep stored asks for other forms (seen with ConvNeXt-T).
    missed: list[dict[str, Any]] = field(default_factory=list)
    # Artifact tier: compiled artifacts that verified and were handed to torch; ones that
    # did not (unsigned, unknown key, bad signature) and were compiled instead; ones signed
    # and stored by this process; models Dynamo could not package.
    artifacts_loaded: int = 0
    artifacts_rejected: int = 0
    artifacts_published: int = 0
    packages_refused: int = 0
    # C++ libraries (kernels, Inductor's vector-ISA probes) this process compiled while the tier
    # read: none was stored under their key, or it was rejected. 0 on a node the sweep served.
    cpp_compiled: int = 0
    # The sweep's end-to-end pass only: each hit it timed in the graph's process (autotune/job/in_graph.py).
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    # Benchmarks of any kind since the hook was installed: Inductor's GEMM/conv, pointwise and
    # coordinate-descent tuning, and the fusion and padding verdicts timed here. 0 when every
    # answer came from the cache. Brought up to date by ``WarmStart.stats``.
    benchmarks: int = 0
    # Calls this process made to the database, its own and, on local rank 0 of a torchrun job,
    # those it made for the node's other ranks (autotune/job/node_share.py); 0 on those ranks.
    database_calls: int = 0
    # The prefetch (autotune/job/prefetch.py): stored results and verified artifacts it held in
    # memory, the seconds it took, and how often and how long compiles waited for it.
    prefetched_rows: int = 0
    prefetched_artifacts: int = 0
    prefetch_s: float = 0.0
    prefetch_waits: int = 0
    prefetch_wait_s: float = 0.0
    # The install: seconds from warm_start() to the hook in place; on a thread, the seconds it
    # then spent on the first compile's set-ups and Inductor's pattern passes (waiting its turn
    # beside a busy script included), how many passes it registered before the first compile,
    # and how long torch.compile and the script's imports of torch's modules waited for it (autotune/job/background.py,
    # autotune/job/import_gate.py).
    install_s: float = 0.0
    prewarm_s: float = 0.0
    passes_prewarmed: int = 0
    install_wait_s: float = 0.0
    import_wait_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        """One line, each figure named: what ``autotune run`` prints at the end of a job."""
        return (f"hits={self.hits} misses={self.misses} benchmarks={self.benchmarks} written={self.written} "
                f"errors={self.errors} configs_skipped={self.configs_skipped} "
                f"kernel_configs_loaded={self.kernel_configs_loaded} kernel_configs_saved={self.kernel_configs_saved} "
                f"artifacts_loaded={self.artifacts_loaded} artifacts_rejected={self.artifacts_rejected} "
                f"artifacts_published={self.artifacts_published} database_calls={self.database_calls}"
                + (f" compiles_retried={self.compiles_retried}" if self.compiles_retried else "")
                + (f" cpp_compiled={self.cpp_compiled}" if self.cpp_compiled else ""))
