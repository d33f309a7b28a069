"""The GPU timings of the sweep's processes that share one GPU take turns.

A GPU actor runs several requests at once (``--jobs-per-gpu``), each in its own
child process, because a request spends most of its time compiling candidates on
the CPU (torch 2.11: nearly all of a transformer GEMM's time; the timing is short).
The end-to-end passes of other models run on the same GPUs beside them (autotune/sweep/end_to_end.py),
timing pointwise and reduction configs. Two processes timing at the same moment would time
each other's kernels, so each holds this lock while Inductor times: an ``flock`` on a file
named after the GPU's UUID, which every process on the host that uses that GPU opens (Ray
nodes of one host included). Other devices: no lock.

The turn is the process's: a tuning child holds it around all of a request's candidates, and
the kernel-bound timing inside (timing.py) asks for it again per call, possibly from another
thread (Inductor may time on its own threads). While any of its threads is inside, the process
holds it, and others of its threads go in at once; Inductor's own lock orders them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Iterator
from typing import IO

_state = threading.Lock()  # guards the two below, never held while waiting for the file lock
_inside = 0  # this process's threads inside a turn
_held: IO[str] | None = None  # the locked file while _inside > 0


@contextlib.contextmanager
def gpu_timing_turn(device: str) -> Iterator[None]:
    """Hold this process's GPU for timing until the block ends (waits for its turn)."""
    if not device.startswith("cuda"):
        yield
        return
    _enter()
    try:
        yield
    finally:
        _leave()


def _enter() -> None:
    global _inside, _held
    with _state:
        if _inside > 0:  # the process holds the turn: join it
            _inside += 1
            return
    handle = open(lock_path(), "a")  # noqa: SIM115 - closed by the last thread to leave
    # Waits for other processes, and for a thread of ours that got here first: none of ours
    # can join a turn until this one holds the lock and says so below.
    fcntl.flock(handle, fcntl.LOCK_EX)
    with _state:
        _inside, _held = 1, handle


def _leave() -> None:
    global _inside, _held
    with _state:
        _inside -= 1
        if _inside == 0 and _held is not None:
            fcntl.flock(_held, fcntl.LOCK_UN)
            _held.close()
            _held = None


def lock_path() -> str:
    """One file per physical GPU (its UUID), whatever CUDA_VISIBLE_DEVICES numbers it."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    name = str(getattr(props, "uuid", "") or os.environ.get("CUDA_VISIBLE_DEVICES", "0")).replace("/", "_")
    return os.path.join(tempfile.gettempdir(), f"autotune-gpu-{name}.lock")
