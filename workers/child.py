"""A plain Python process that tunes jobs for one actor, one at a time.

Why not tune inside the Ray actor itself: a Ray worker process is not a plain
Python process, and on a CUDA host (torch 2.11, triton 3.6) the Triton backend hash
that Inductor bakes into every template's source came out different there, so
no reproduced Triton choice hash matched the ones a training job computes. A
child started with ``python -m workers.child`` and the Ray variables removed
gets the same hashes as the job. It also isolates each job: a crash or hang
kills the child, not the actor, and the next job gets a new child.

Protocol: one JSON job per line on stdin; one JSON result per line on the file
descriptor given as argv[1] (stdout and stderr stay free for Inductor's logs).
A line ``{"warm": DEVICE}`` instead asks the child to pay its one-time start-up
costs now (see ``warm_up``) and is answered with ``{"warm_seconds": S}``.

``python -m workers.child --spare DIR`` is a spare (``spares.py``): it imports, then
serves the same protocol on DIR's two named pipes once an actor claims it; its warm-up
message also names the actor's ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import errno
import importlib
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from .environment import clean_environment

log = logging.getLogger(__name__)

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
        self.command = command or [sys.executable, "-m", "autotune.workers.child"]
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

    def adopt(self, home: Path) -> bool:
        """Talk to the spare child in ``home`` (claimed by the caller) as to one started here.
        False, with nothing changed, if it died before it answered the pipes."""
        from .spares import JOBS, RESULTS, spare_pid

        pid = spare_pid(home)
        if pid is None:
            return False
        process = _Adopted(pid)
        results = os.open(home / RESULTS, os.O_RDONLY | os.O_NONBLOCK)  # the spare opens its end next
        deadline = time.monotonic() + self.timeout
        while True:  # the spare opens the jobs pipe once its imports are done
            try:
                jobs = os.open(home / JOBS, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                if exc.errno != errno.ENXIO or process.poll() is not None or time.monotonic() > deadline:
                    os.close(results)
                    return False
                time.sleep(0.05)
        os.set_blocking(jobs, True)
        os.set_blocking(results, True)
        process.stdin = os.fdopen(jobs, "wb")
        self.proc, self.results = process, os.fdopen(results, "rb")  # type: ignore[assignment]
        return True

    def tune(self, job_json: dict[str, Any]) -> dict[str, Any]:
        return self._ask(job_json)

    def warm(self, device: str, visible_devices: str | None = None) -> dict[str, Any]:
        """Start the child (unless adopted) and warm it up now, so the first job does not
        pay for it: ``{"warm_seconds": S, "pinned": bool}``. ``visible_devices``: the GPUs
        an adopted spare must use (its own were the sweep's); ``pinned`` is False when
        it could not (CUDA had started in it), and the caller should not use it."""
        message: dict[str, Any] = {"warm": device}
        if visible_devices is not None:
            message["visible_devices"] = visible_devices
        answer = self._ask(message)
        return {"warm_seconds": float(answer["warm_seconds"]), "pinned": answer.get("pinned", True)}

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

    On CPU (torch 2.13) the first job in a fresh child takes far longer than the
    next ones; one tiny compile here pays nearly all of the difference. It runs in
    fresh Inductor state like every job, after pinning Triton's ptxas as every job
    does, so it changes no job's hashes or results. Best effort: a failure here is
    logged and the first job simply starts cold, as it did before.
    """
    started = time.perf_counter()
    try:
        import torch

        from autotune.inductor_glue.capture import fresh_inductor
        from autotune.inductor_glue.env import pin_triton_toolchain

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


class _Adopted:
    """What ChildTuner needs of a Popen, for a spare that the sweep's process started."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stdin: IO[bytes] | None = None
        self.returncode: int | None = None

    def poll(self) -> int | None:
        from .spares import running

        if self.returncode is None and not running(self.pid):
            self.returncode = -1
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        if self.stdin is not None:
            self.stdin.close()
            self.stdin = None

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(0.05)
        return -1


def _pin(visible_devices: str | None) -> bool:
    """Use the actor's GPUs; False if CUDA had already started here (every GPU in view)."""
    if visible_devices is None:
        return True
    import torch

    if torch.cuda.is_initialized():
        return os.environ.get("CUDA_VISIBLE_DEVICES") == visible_devices
    os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices
    wanted = len([d for d in visible_devices.split(",") if d.strip()])
    return torch.cuda.device_count() == wanted  # a count cached before this would be the sweep's


def _answer(message: dict[str, Any]) -> dict[str, Any]:
    from .entry import tune_request
    from .faults import FAULT_KEY, inject_fault
    from .jobs import TuneJob

    if "warm" in message:
        pinned = _pin(message.get("visible_devices"))
        seconds = warm_up(str(message["warm"])) if pinned else 0.0
        return {"warm_seconds": seconds, "pinned": pinned}
    fault = str(message.pop(FAULT_KEY, ""))
    job = TuneJob.from_json(message)
    inject_fault(fault, job.request.key)
    return tune_request(job).to_json()


def serve(result_fd: int, jobs: Iterable[str] | None = None) -> None:
    # Imported before the first line arrives: torch and Inductor load while the actor waits.
    importlib.import_module("autotune.workers.tune")

    results = os.fdopen(result_fd, "w")
    for line in sys.stdin if jobs is None else jobs:
        if not line.strip():
            continue
        results.write(json.dumps(_answer(json.loads(line))) + "\n")
        results.flush()


def serve_spare(home: Path, parent: int) -> None:
    """A spare: import now, then serve whichever actor claims ``home`` (spares.py)."""
    from .spares import JOBS, RESULTS, die_with_parent

    die_with_parent(parent)
    importlib.import_module("autotune.workers.tune")
    results = os.open(home / RESULTS, os.O_WRONLY)  # the claiming actor opened its end first
    with open(home / JOBS) as jobs:  # and opens this one once this end is open: both connected
        serve(results, jobs)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    if sys.argv[1] == "--spare":
        serve_spare(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        serve(int(sys.argv[1]))
