"""Kernel-bound GPU timing for the sweep's tuning and in-graph verdicts.

Inductor times a candidate with CUDA events around each call, after an L2 flush of
~17 us on an H100. When the CPU takes longer than that to launch the call, the GPU can
idle inside the timed span (how much depends on when the driver submits the queued work),
and the launch is timed as if it were the kernel. A cuBLAS
bias epilogue (``bias_addmm``) queries cuBLASLt's heuristics on every call: on an
H100 (torch 2.11) the sweep timed it at 0.069-0.123 ms while a compile ran beside it,
against 0.041-0.053 ms on an idle CPU, so the sweep kept Triton templates plus a GELU
kernel where cold max-autotune kept cuBLAS (the transformer's kernel time 1.22x cold,
run 51). A job replays these choices in CUDA graphs, or queues them behind other
kernels, where launch time does not count.

So, while tuning and while timing in the graph, each timed loop starts behind a GPU
sleep long enough for the CPU to queue the whole loop first: the events then time the
kernels alone, whatever the CPU was doing. Everything else is Inductor's method: warm-up,
an L2 flush before each call, a short estimate that sizes the loop, the minimum.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, Callable

CHUNK = 20  # calls queued behind one sleep: few enough for CUDA's launch queue
SLEEP_CYCLES_PER_MS = 2_000_000  # an H100 SM clock (~1.98 GHz); a slower clock sleeps longer
FIRST_HOLD_MS = 2.0  # the least hold; the first is sized from one call's CPU time
HOLD_MARGIN = 2.0  # the first hold: twice a chunk of calls at the measured pace
MAX_HOLD_MS = 128.0
MAX_TRIES = 4  # hold up to 4x, 16x, 64x longer before timing as Inductor does, gaps and all


def queued_min_ms(fn: Callable[[], Any], flush: Any, iters: int, hold_ms: float = FIRST_HOLD_MS) -> tuple[float, float]:
    """The fastest of ``iters`` calls of ``fn``, each after an L2 flush, timed by CUDA
    events while the GPU never waits for the CPU (``flush``: a CUDA int32 buffer); and
    the hold that let the CPU get ahead, for the next loop of the same call to start from."""
    fastest = float("inf")
    left = iters
    while left > 0:
        count = min(CHUNK, left)
        times, ahead = _queued_chunk(fn, flush, count, hold_ms)
        for _ in range(MAX_TRIES - 1):
            if ahead:
                break
            hold_ms = min(hold_ms * 4, MAX_HOLD_MS)  # the CPU did not finish queueing before the sleep ended
            times, ahead = _queued_chunk(fn, flush, count, hold_ms)
        fastest = min(fastest, *times)
        left -= count
    return fastest, hold_ms


def _queued_chunk(fn: Callable[[], Any], flush: Any, count: int, hold_ms: float) -> tuple[list[float], bool]:
    import torch

    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]
    released = torch.cuda.Event()
    torch.cuda._sleep(int(hold_ms * SLEEP_CYCLES_PER_MS))
    released.record()
    for start, end in pairs:
        flush.zero_()
        start.record()
        fn()
        end.record()
    ahead = not released.query()  # the GPU was still asleep when the last call was queued
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in pairs], ahead


def benchmark_gpu_queued(fn: Callable[[], Any], estimation_iters: int = 5, benchmark_iters: int = 100,
                         max_benchmark_duration: int = 25) -> float:
    """Inductor's ``InductorBenchmarker.benchmark_gpu`` (min mode), timed kernel-bound."""
    import torch

    torch.cuda.synchronize()  # no earlier error may surface inside the timing
    fn()  # warm-up; a failing candidate raises here, as in Inductor
    torch.cuda.synchronize()
    flush = torch.empty(_l2_bytes() // 4, dtype=torch.int, device="cuda")
    flush.zero_()
    # The first hold covers a chunk at the pace of one more call queued now (a call
    # through Python can take tens of microseconds, more on a busy CPU), so few chunks
    # need a longer sleep and a second try.
    began = time.perf_counter()
    flush.zero_()
    fn()
    per_call_ms = (time.perf_counter() - began) * 1e3
    torch.cuda.synchronize()
    hold_ms = min(max(FIRST_HOLD_MS, HOLD_MARGIN * CHUNK * per_call_ms), MAX_HOLD_MS)
    estimate, hold_ms = queued_min_ms(fn, flush, estimation_iters, hold_ms)
    iters = max(min(benchmark_iters, int(max_benchmark_duration // estimate)), 1) if estimate > 0 else benchmark_iters
    return min(estimate, queued_min_ms(fn, flush, iters, hold_ms)[0])


def _l2_bytes() -> int:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or 256 * 1024 * 1024)


def _wrap(original: Callable[..., float]) -> Callable[..., float]:
    def benchmark_gpu(_callable: Callable[[], Any], *args: Any, **kwargs: Any) -> float:
        device = str(kwargs.get("device_type") or "cuda")
        plain = not args and kwargs.get("return_mode", "min") == "min" and "quantiles" not in kwargs
        if not plain or not device.startswith("cuda"):
            return original(_callable, *args, **kwargs)  # a mode we do not reproduce
        sizes = {k: kwargs[k] for k in ("estimation_iters", "benchmark_iters", "max_benchmark_duration") if k in kwargs}
        with _benchmark_lock():
            return benchmark_gpu_queued(_callable, **sizes)

    return benchmark_gpu


def _benchmark_lock() -> contextlib.AbstractContextManager[Any]:
    """Inductor's lock around GPU timing where it has one (torch 2.13): its threads that
    benchmark at once must not time each other's kernels."""
    from torch._inductor.runtime import benchmarking

    lock = getattr(benchmarking, "maybe_gpu_benchmark_lock", None)
    return lock() if lock is not None else contextlib.nullcontext()


@contextlib.contextmanager
def kernel_bound_timing(device: str) -> Iterator[None]:
    """Inside, Inductor's benchmarker times GPU calls kernel-bound (see the module's
    docstring). Nothing changes on other devices."""
    if not device.startswith("cuda"):
        yield
        return
    from torch._inductor.runtime.benchmarking import benchmarker

    shadowed = benchmarker.__dict__.get("benchmark_gpu")  # an enclosing use of this context
    benchmarker.benchmark_gpu = _wrap(benchmarker.benchmark_gpu)
    try:
        yield
    finally:
        if shadowed is None:
            del benchmarker.benchmark_gpu
        else:
            benchmarker.benchmark_gpu = shadowed
