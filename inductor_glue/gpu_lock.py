"""The GPU timings of the sweep's processes that share one GPU take turns.

A GPU actor runs several requests at once (``--jobs-per-gpu``), each in its own
child process, because a request spends most of its time compiling candidates on
the CPU (torch 2.11: nearly all of a transformer GEMM's time; the timing is short).
The end-to-end passes of other models run on the same GPUs beside them (autotune/pointwise.py),
timing pointwise and reduction configs. Two processes timing at the same moment would time
each other's kernels, so each holds this lock while Inductor times: an ``flock`` on a file
named after the GPU's UUID, which every process on the host that uses that GPU opens (Ray
nodes of one host included). Other devices: no lock.

The turn is reentrant within a process: a tuning child holds it around all of a request's
candidates, and the kernel-bound timing inside (timing.py) asks for it again per call.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Iterator

_guard = threading.RLock()  # this process's threads take turns here; the flock is between processes
_depth = 0
_handle: object | None = None


@contextlib.contextmanager
def gpu_timing_turn(device: str) -> Iterator[None]:
    """Hold this process's GPU for timing until the block ends (waits for its turn)."""
    global _depth, _handle
    if not device.startswith("cuda"):
        yield
        return
    with _guard:
        if _depth == 0:
            handle = open(lock_path(), "a")  # noqa: SIM115 - held across the block, closed below
            fcntl.flock(handle, fcntl.LOCK_EX)
            _handle = handle
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
            if _depth == 0 and _handle is not None:
                fcntl.flock(_handle, fcntl.LOCK_UN)  # type: ignore[arg-type]
                _handle.close()  # type: ignore[attr-defined]
                _handle = None


def lock_path() -> str:
    """One file per physical GPU (its UUID), whatever CUDA_VISIBLE_DEVICES numbers it."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    name = str(getattr(props, "uuid", "") or os.environ.get("CUDA_VISIBLE_DEVICES", "0")).replace("/", "_")
    return os.path.join(tempfile.gettempdir(), f"autotune-gpu-{name}.lock")
