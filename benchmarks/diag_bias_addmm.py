"""Why does cuBLAS's bias epilogue time slower in the sweep's processes than in cold max-autotune?

Times Inductor's two ATen choices for a GEMM with a broadcast bias (``bias_addmm``:
``addmm`` on the 1-D bias, cuBLASLt's epilogue; ``addmm``: the expanded bias) with
Inductor's own benchmarker, on inputs laid out as Inductor lays them out, at stages of
one process: plain torch, with every CPU busy (what a sweep's compile beside the timing
does), Inductor imported, the warm-start hook installed, after a max-autotune compile under
the hook. Each line gives Inductor's figure and the kernel-bound one the sweep times with
(``inductor_glue/timing.py``). A diagnostic: it prints one line per stage and shape.

usage: python benchmarks/diag_bias_addmm.py [--cache sqlite:////tmp/diag.db]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = ((4096, 1024, 3072), (4096, 1024, 4096), (4096, 4096, 1024))  # M, K, N: the transformer's FFN


def measure(stage: str) -> None:
    import torch
    from torch._dynamo.testing import rand_strided
    from torch._inductor.runtime.benchmarking import benchmarker

    from autotune.inductor_glue.timing import benchmark_gpu_queued

    for m, k, n in SHAPES:
        bias = rand_strided((m, n), (0, 1), dtype=torch.bfloat16, device="cuda")
        mat1 = rand_strided((m, k), (k, 1), dtype=torch.bfloat16, device="cuda")
        mat2 = rand_strided((k, n), (1, k), dtype=torch.bfloat16, device="cuda")
        out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
        calls = {
            "bias_addmm": lambda: torch.addmm(bias[0], mat1, mat2, out=out),
            "addmm": lambda: torch.addmm(bias, mat1, mat2, out=out),
            "mm": lambda: torch.mm(mat1, mat2, out=out),
        }
        for timer, bench in (("inductor", benchmarker.benchmark_gpu), ("kernel-bound", benchmark_gpu_queued)):
            times = {name: bench(call) for name, call in calls.items()}
            print(f"{stage:24} {timer:12} {m}x{k}x{n}  " + "  ".join(f"{name} {ms:.4f}" for name, ms in times.items()),
                  flush=True)


def _spin(stop: object) -> None:
    while not stop.is_set():  # type: ignore[attr-defined]
        sum(range(1000))


@contextlib.contextmanager
def cpu_busy() -> Iterator[None]:
    """Every core busy in other processes, and a thread of this one holding the GIL at
    times, as the compile workers and the compile beside a sweep's timing do."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    spinners = [context.Process(target=_spin, args=(stop,), daemon=True) for _ in range(os.cpu_count() or 1)]
    for process in spinners:
        process.start()
    local_stop = threading.Event()
    thread = threading.Thread(target=_spin, args=(local_stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        local_stop.set()
        thread.join()
        for process in spinners:
            process.join(timeout=5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default="sqlite:////tmp/diag_bias_addmm.db")
    parser.add_argument("--no-hook", action="store_true", help="the same stages without the hook")
    args = parser.parse_args()
    import torch

    measure("torch")
    with cpu_busy():
        measure("torch, CPU busy")
    import torch._inductor.select_algorithm  # noqa: F401

    measure("inductor imported")
    handle = None
    if not args.no_hook:
        import autotune

        handle = autotune.warm_start(args.cache)
        measure("hook installed")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    model = model.to("cuda", torch.bfloat16)
    with torch.no_grad():
        torch.compile(model, mode="max-autotune")(torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16))
    measure("after a compile")
    if handle is not None:
        handle.uninstall()
        measure("hook removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
