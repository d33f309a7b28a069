"""A plain Python process that tunes jobs for one actor, one at a time.

Why not tune inside the Ray actor itself: a Ray worker process is not a plain
Python process, and on an H200 (torch 2.11, triton 3.6) the Triton backend hash
that Inductor bakes into every template's source came out different there, so
no reproduced Triton choice hash matched the ones a training job computes. A
child started with ``python -m workers.child`` and the Ray variables removed
gets the same hashes as the job. It also isolates each job: a crash or hang
kills the child, not the actor, and the next job gets a new child.

Protocol: one JSON job per line on stdin; one JSON result per line on the file
descriptor given as argv[1] (stdout and stderr stay free for Inductor's logs).
A line ``{"warm": DEVICE}`` instead asks the child to pay its one-time start-up
costs now (see ``warm_up``) and is answered with ``{"warm_seconds": S}``.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import selectors
import subprocess
import sys
from typing import IO, Any

log = logging.getLogger(__name__)

# Variables Ray sets in its workers that a job process does not have.
_RAY_ONLY = ("PYTHONBREAKPOINT", "SPT_NOENV", "OMP_NUM_THREADS")


def clean_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k not in _RAY_ONLY}
    # The child must import this project wherever the actor found it.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


class ChildDied(Exception):
    """The child exited (crash) or was killed (timeout) before answering."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ChildTuner:
    """Owns one child process; restarts it after a crash or a timeout."""

    def __init__(self, timeout: float, command: list[str] | None = None) -> None:
        self.timeout = timeout
        # The child's command line, before its result descriptor (benchmarks run a wrapped child).
        self.command = command or [sys.executable, "-m", "workers.child"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.results: IO[bytes] | None = None

    def _start(self) -> None:
        read_fd, write_fd = os.pipe()
        self.proc = subprocess.Popen(
            [*self.command, str(write_fd)],
            stdin=subprocess.PIPE,
            pass_fds=(write_fd,),
            env=clean_environment(),
        )
        os.close(write_fd)
        self.results = os.fdopen(read_fd, "rb")

    def tune(self, job_json: dict[str, Any]) -> dict[str, Any]:
        return self._ask(job_json)

    def warm(self, device: str) -> float:
        """Start the child and warm it up now, so the first job does not pay for it."""
        return float(self._ask({"warm": device})["warm_seconds"])

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None and self.results is not None
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            raise ChildDied("crash", "the tuning process had exited") from None
        line = self._read_line()
        return json.loads(line)

    def _read_line(self) -> bytes:
        assert self.results is not None and self.proc is not None
        selector = selectors.DefaultSelector()
        selector.register(self.results, selectors.EVENT_READ)
        ready = selector.select(timeout=self.timeout)
        selector.close()
        if not ready:
            self.close()
            raise ChildDied("timeout", f"no result after {self.timeout:.0f} s; the tuning process was killed")
        line = self.results.readline()
        if not line:
            code = self.proc.wait()
            self.close()
            raise ChildDied("crash", f"the tuning process died (exit code {code})")
        return line

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None
        if self.results is not None:
            self.results.close()
            self.results = None


def warm_up(device: str) -> float:
    """Pay the first job's one-time costs: CUDA context, Dynamo/Inductor/C++ or Triton set-up.

    Measured on CPU (torch 2.13): the first job in a fresh child took ~13 s longer
    than the next ones; one tiny compile here pays nearly all of it. It runs in
    fresh Inductor state like every job, after pinning Triton's ptxas as every job
    does, so it changes no job's hashes or results. Best effort: a failure here is
    logged and the first job simply starts cold, as it did before.
    """
    import time

    started = time.perf_counter()
    try:
        import torch

        from inductor_glue.capture import fresh_inductor
        from inductor_glue.env import pin_triton_toolchain

        pin_triton_toolchain()
        if device == "cuda":
            torch.cuda.init()
        with fresh_inductor({}), torch.no_grad():
            torch.compile(lambda x: (x * 2.0).relu())(torch.ones(8, 8, device=device))
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception:
        log.warning("warm-up failed; the first job will start cold", exc_info=True)
    return time.perf_counter() - started


def _answer(message: dict[str, Any]) -> dict[str, Any]:
    from .faults import inject_fault
    from .jobs import TuneJob
    from .tune import tune_request

    if "warm" in message:
        return {"warm_seconds": warm_up(str(message["warm"]))}
    job = TuneJob.from_json(message)
    inject_fault(job.request.key)
    return tune_request(job).to_json()


def serve(result_fd: int) -> None:
    # Imported before the first line arrives: torch and Inductor load while the actor waits.
    importlib.import_module("workers.tune")

    results = os.fdopen(result_fd, "w")
    for line in sys.stdin:
        if not line.strip():
            continue
        results.write(json.dumps(_answer(json.loads(line))) + "\n")
        results.flush()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    serve(int(sys.argv[1]))
