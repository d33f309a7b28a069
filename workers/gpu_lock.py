"""The GPU timings of the tuning children that share one GPU take turns.

A GPU actor runs several requests at once (``--jobs-per-gpu``), each in its own
child process, because a request spends most of its time compiling candidates on
the CPU (torch 2.11: nearly all of a transformer GEMM's time; the timing is short).
Two children timing candidates at the same moment would time each other's
kernels, so each holds this lock while Inductor times its candidates: an
``flock`` on a file named after the GPU's UUID, which every process on the host
that uses that GPU opens (Ray nodes of one host included). Other devices: no lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def gpu_timing_turn(device: str) -> Iterator[None]:
    """Hold this process's GPU for timing until the block ends (waits for its turn)."""
    if not device.startswith("cuda"):
        yield
        return
    with open(lock_path(), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def lock_path() -> str:
    """One file per physical GPU (its UUID), whatever CUDA_VISIBLE_DEVICES numbers it."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    name = str(getattr(props, "uuid", "") or os.environ.get("CUDA_VISIBLE_DEVICES", "0")).replace("/", "_")
    return os.path.join(tempfile.gettempdir(), f"autotune-gpu-{name}.lock")
