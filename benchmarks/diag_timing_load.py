"""Does a timer see a microsecond kernel, or its launch? On a quiet CPU and on a busy one.

Two calls whose kernels differ by a known amount (an in-place add on N and 1.5N bf16
elements: two "configs" of one pointwise kernel) are timed by Inductor's
``benchmark_gpu`` and by the sweep's kernel-bound timer (``inductor_glue/timing.py``),
each call launched plainly (ATen, a few microseconds of CPU) and through a Python
launcher that spends ``--launch-us`` first (as Inductor's Triton ``kernel_call`` does).
It reports each timer's median figure against the profiler's kernel time, how often it
ranks the two calls right (what autotuning needs), and its wall time per benchmark;
then the same with one busy process per CPU core beside it.

    python benchmarks/diag_timing_load.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _hog(stop: Any) -> None:
    while not stop.is_set():
        pass


class CpuLoad:
    """One busy process per core while inside."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self.stop = multiprocessing.Event()
        self.procs: list[Any] = []

    def __enter__(self) -> CpuLoad:
        self.procs = [multiprocessing.Process(target=_hog, args=(self.stop,), daemon=True)
                      for _ in range(self.processes)]
        for proc in self.procs:
            proc.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for proc in self.procs:
            proc.join(5)


def _calls(elements: int, launch_us: float) -> dict[str, Callable[[], Any]]:
    import torch

    x = torch.zeros(elements, device="cuda", dtype=torch.bfloat16)
    y = torch.zeros(int(elements * 1.5), device="cuda", dtype=torch.bfloat16)

    def python_launch(tensor: Any) -> Callable[[], Any]:
        def call() -> None:
            until = time.perf_counter() + launch_us * 1e-6
            while time.perf_counter() < until:
                pass
            tensor.add_(1.0)
        return call

    return {"small/aten": lambda: x.add_(1.0), "large/aten": lambda: y.add_(1.0),
            "small/python": python_launch(x), "large/python": python_launch(y)}


def _profiled_us(call: Callable[[], Any], reps: int = 50) -> float:
    """The profiler's GPU time per call (compile_time.py's kernel profile), after a warm-up."""
    import torch

    from compile_time import _kernel_profile

    call()
    torch.cuda.synchronize()
    return _kernel_profile(call, torch.cuda.synchronize, calls=reps)[1]


def measure(calls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, Any]:
    from torch._inductor.runtime.benchmarking import benchmarker

    from autotune.inductor_glue.timing import benchmark_gpu_queued

    timers = {"inductor": benchmarker.benchmark_gpu, "kernel-bound": benchmark_gpu_queued}
    out: dict[str, Any] = {}
    for timer, bench in timers.items():
        for launch in ("aten", "python"):
            small, large, walls = [], [], []
            for _ in range(repeats):
                for size, into in (("small", small), ("large", large)):
                    began = time.perf_counter()
                    into.append(bench(calls[f"{size}/{launch}"]) * 1e3)
                    walls.append((time.perf_counter() - began) * 1e3)
            out[f"{timer}/{launch}"] = {
                "small_us": round(statistics.median(small), 2), "large_us": round(statistics.median(large), 2),
                "small_spread_us": round(max(small) - min(small), 2),
                "right_order": sum(s < l for s, l in zip(small, large)) / repeats,
                "wall_ms_per_benchmark": round(statistics.median(walls), 2)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=1 << 20, help="the small call's elements (default 1M)")
    parser.add_argument("--launch-us", type=float, default=25.0, help="the Python launcher's CPU time")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None, help="write timing_load_<gpu>.md/.json here")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("diag_timing_load: no CUDA GPU here; run it on a GPU machine", file=sys.stderr)
        return 2
    import triton
    calls = _calls(args.elements, args.launch_us)
    truth = {name: round(_profiled_us(call), 2) for name, call in calls.items() if name.endswith("/aten")}
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(), "cpus": os.cpu_count(), "torch": torch.__version__,
        "triton": triton.__version__, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]), "elements": args.elements, "launch_us": args.launch_us,
        "profiler_kernel_us": truth, "quiet": measure(calls, args.repeats)}
    with CpuLoad(os.cpu_count() or 1):
        result["busy"] = measure(calls, args.repeats)
    text = render(result)
    print(text)
    if args.out:
        stem = args.out / f"timing_load_{result['gpu'].lower().replace(' ', '-')}"
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        stem.with_suffix(".md").write_text(text)
    return 0


def render(result: dict[str, Any]) -> str:
    truth = result["profiler_kernel_us"]
    lines = [f"# Timing a microsecond kernel: {result['gpu']}", "",
             f"{result['date']}, `{result['command']}`; torch {result['torch']}, triton {result['triton']}, "
             f"{result['cpus']} CPUs. Profiler kernel time per call: small {truth['small/aten']} us, large "
             f"{truth['large/aten']} us. Busy: one spinning process per CPU beside the timer.", "",
             "| CPU | timer | launch | small us | large us | small spread us | right order | wall ms / benchmark |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for load in ("quiet", "busy"):
        for key, row in result[load].items():
            timer, launch = key.split("/")
            lines.append(f"| {load} | {timer} | {launch} | {row['small_us']} | {row['large_us']} | "
                         f"{row['small_spread_us']} | {row['right_order']:.2f} | {row['wall_ms_per_benchmark']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
