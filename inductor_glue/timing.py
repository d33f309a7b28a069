"""Kernel-bound GPU timing for the sweep: its GEMM tuning and its whole end-to-end pass.

Inductor times a candidate with CUDA events around each call, after an L2 flush that
takes microseconds. When the CPU takes longer than that to launch the call, the GPU can
idle inside the timed span (how much depends on when the driver submits the queued work),
and the launch is timed as if it were the kernel. A cuBLAS
bias epilogue (``bias_addmm``) queries cuBLASLt's heuristics on every call: on GPUs
(torch 2.11) the sweep timed it far slower while a compile ran beside it than on an idle
CPU, so the sweep kept Triton templates plus a GELU kernel where cold max-autotune kept
cuBLAS, and the transformer's kernels ran slower than cold's. A job replays these choices in
CUDA graphs, or queues them behind other kernels, where launch time does not count.

The same holds for pointwise and reduction kernels, which run in a few microseconds:
timed with their launch, one kernel's configs look alike, and the sweep's end-to-end pass
may store one that runs much slower than cold max-autotune's. On a GPU host where other
sweeps compiled side by side, BERT's layer norm, softmax and GELU kernels ran far slower than
cold's with the configs the pass stored; on a quiet CPU the same pass stored configs as fast
as cold's, and beside one busy process per core the GELU config this timing stored ran much
faster than the one Inductor's own timing stored.

So, while tuning and throughout the end-to-end pass, each timed loop starts behind a GPU
sleep long enough for the CPU to queue its first calls: the events then time those
kernels alone, whatever the CPU was doing. Everything else is Inductor's method: warm-up,
an L2 flush before each call, an estimate that sizes the loop, the minimum.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from .gpu_lock import gpu_timing_turn

AHEAD_CALLS = 8  # calls the CPU queues while the GPU sleeps: their timings carry no launch
SLEEP_CYCLES_PER_MS = 2_000_000  # a data-centre GPU's SM clock (~2 GHz); a slower clock sleeps longer
MIN_HOLD_MS = 0.1
HOLD_MARGIN = 2.0  # a hold lasts twice AHEAD_CALLS calls at the pace measured at warm-up
MAX_HOLD_MS = 128.0
MAX_TRIES = 4  # hold up to 4x, 16x, 64x longer before timing as Inductor does, gaps and all


def queued_min_ms(fn: Callable[[], Any], flush: Any, iters: int, hold_ms: float) -> tuple[float, float]:
    """The fastest of ``iters`` calls of ``fn``, each after an L2 flush, timed by CUDA
    events; and the hold that worked, for the next loop of the same call.

    One GPU sleep (``hold_ms``) starts the loop, long enough for the CPU to queue its
    first ``AHEAD_CALLS`` calls: the GPU then runs them back to back, and their timings
    are the kernels' alone. Later calls may wait for their launch, which only makes them
    slower, so the minimum is launch-free. If the sleep ended before the CPU got ahead
    (a busy CPU), a short loop runs again behind a longer sleep.
    """
    times, ahead = _queued_loop(fn, flush, iters, hold_ms)
    for _ in range(MAX_TRIES - 1):
        if ahead:
            break
        hold_ms = min(hold_ms * 4, MAX_HOLD_MS)
        more, ahead = _queued_loop(fn, flush, min(iters, 2 * AHEAD_CALLS), hold_ms)
        times += more
    return min(times), hold_ms


def _queued_loop(fn: Callable[[], Any], flush: Any, count: int, hold_ms: float) -> tuple[list[float], bool]:
    import torch

    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]
    released = torch.cuda.Event()
    torch.cuda._sleep(int(hold_ms * SLEEP_CYCLES_PER_MS))
    released.record()
    ahead = True
    for index, (start, end) in enumerate(pairs):
        flush.zero_()
        start.record()
        fn()
        end.record()
        if index == min(count, AHEAD_CALLS) - 1:
            ahead = not released.query()  # the GPU still slept: the calls so far run back to back
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in pairs], ahead


def benchmark_gpu_queued(fn: Callable[[], Any], estimation_iters: int = 5, benchmark_iters: int = 100,
                         max_benchmark_duration: int = 25) -> float:
    """Inductor's ``InductorBenchmarker.benchmark_gpu`` (min mode), timed kernel-bound.

    One sleep per timed loop, sized from the CPU's pace at warm-up, so a busy CPU costs
    about what it costs Inductor's own loop (which waits for the CPU anyway). Inductor's
    estimate sizes the loop (at most ``max_benchmark_duration`` ms): the warm-up's span,
    launch included, is an upper bound, and only a call that bound would cut below
    ``benchmark_iters`` is estimated again, launch-free.
    """
    import torch

    torch.cuda.synchronize()  # no earlier error may surface inside the timing
    fn()  # warm-up; a failing candidate raises here, as in Inductor
    torch.cuda.synchronize()
    flush = torch.empty(_l2_bytes() // 4, dtype=torch.int, device="cuda")
    flush.zero_()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began = time.perf_counter()
    flush.zero_()
    start.record()
    fn()
    end.record()
    per_call_ms = (time.perf_counter() - began) * 1e3
    torch.cuda.synchronize()
    hold_ms = min(max(MIN_HOLD_MS, HOLD_MARGIN * AHEAD_CALLS * per_call_ms), MAX_HOLD_MS)
    estimate = start.elapsed_time(end)
    fastest = float("inf")
    if estimate > 0 and max_benchmark_duration // estimate < benchmark_iters:
        fastest, hold_ms = queued_min_ms(fn, flush, estimation_iters, hold_ms)
        estimate = fastest
    iters = max(min(benchmark_iters, int(max_benchmark_duration // estimate)), 1) if estimate > 0 else benchmark_iters
    return min(fastest, queued_min_ms(fn, flush, iters, hold_ms)[0])


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
        # In turn with the other processes timing on this GPU: the tuning children, and other
        # models' end-to-end passes that run beside them.
        with gpu_timing_turn(device), _benchmark_lock():
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
    from .seams import BENCHMARK_GPU

    benchmarker = BENCHMARK_GPU.owner()
    shadowed = benchmarker.__dict__.get("benchmark_gpu")  # an enclosing use of this context
    benchmarker.benchmark_gpu = _wrap(benchmarker.benchmark_gpu)
    try:
        yield
    finally:
        if shadowed is None:
            del benchmarker.benchmark_gpu
        else:
            benchmarker.benchmark_gpu = shadowed


def others_running_per_core() -> float | None:
    """Threads of other processes running or ready to run right now, per CPU core this process
    may run on (Linux's /proc; None elsewhere). The one-minute load average lags a load that began
    seconds ago, and counts this process's own timing threads; this does neither."""
    import glob
    import os

    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None
    own = 0
    for path in glob.glob("/proc/self/task/*/stat"):
        try:
            with open(path) as f:
                stat = f.read()
        except OSError:
            continue  # a thread that ended meanwhile
        own += stat[stat.rindex(")") + 2 : stat.rindex(")") + 3] == "R"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(0, running - own) / (cores or 1)
