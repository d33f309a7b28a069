"""Tuning children started before Ray is up, for the actors of a local sweep to adopt.

A GPU actor's first request waited for Ray's start, then the actor's, then its
child's start (Python, torch and Inductor imports) and warm-up: on a GPU host the
first child was warm seconds after the sweep's capture was done, and the GPU waited. A
local sweep therefore starts ``count`` children itself, at once, while Ray starts and the
models are captured. Each imports what a job needs and waits on two named pipes in
a directory of its own; an actor (on this host) claims one per lane and talks to it
as to a child it started (``ChildTuner.adopt``), so only the warm-up is left.

A spare must time on its actor's GPU: it learns the actor's ``CUDA_VISIBLE_DEVICES``
in the warm-up message and sets it before CUDA starts. Should CUDA have started in
the spare already (so that it would see every GPU), the warm-up says so and the
actor starts a child of its own instead. Linux only (named pipes, and a spare dies
with the sweep through PR_SET_PDEATHSIG); elsewhere no spare is started. The sweep
kills every spare once its actors are gone.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from .environment import clean_environment

log = logging.getLogger(__name__)

JOBS, RESULTS, CLAIMED, PID = "jobs", "results", "claimed", "pid"


def supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "mkfifo")


def gpus_on_this_host() -> int:
    """NVIDIA GPUs this process may use, counted without starting CUDA (or importing torch):
    CUDA_VISIBLE_DEVICES where set, else the driver's list."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")])
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def die_with_parent(parent: int) -> None:
    """In the spare, first thing: a SIGKILL when the sweep's process ends, however it ends.

    Set by the spare itself, not in a ``preexec_fn``: after a fork from a process with
    threads (Ray's start, CUDA's), Python code before exec can deadlock (seen on a CUDA host).
    """
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the sweep ended before this was set
        os._exit(0)


class Spares:
    """``count`` spare children in a fresh directory; ``close`` kills them all."""

    def __init__(self, count: int) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="autotune-spares-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        env = clean_environment()
        try:
            for index in range(count):
                self.procs.append(self._start(self.root / str(index), env))
        except BaseException:  # none half-started: the caller goes on without spares
            self.close()
            raise

    @staticmethod
    def _start(home: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        home.mkdir()
        os.mkfifo(home / JOBS)
        os.mkfifo(home / RESULTS)
        proc = subprocess.Popen([sys.executable, "-m", "autotune.workers.child", "--spare", str(home), str(os.getpid())],
                                env=env, stdin=subprocess.DEVNULL)
        (home / PID).write_text(str(proc.pid))
        return proc

    @property
    def directory(self) -> str:
        return str(self.root)

    def close(self) -> None:
        """Kill every spare still running. Called once the sweep's actors are gone: an adopted
        spare is no use then, and one claimed by an actor that died never heard from it."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def claim(directory: str | None) -> Path | None:
    """A spare's directory that this caller now owns, or None (none left, another host's
    directory, or no spares at all)."""
    if not directory or not os.path.isdir(directory):
        return None
    for home in sorted(Path(directory).iterdir(), key=lambda p: p.name):
        if not (home / PID).exists():
            continue  # still being started
        try:
            os.close(os.open(home / CLAIMED, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except OSError:
            continue  # claimed by another lane, or the directory went away
        if _alive(home):
            return home
    return None


def spare_pid(home: Path) -> int | None:
    try:
        return int((home / PID).read_text())
    except (OSError, ValueError):
        return None


def _alive(home: Path) -> bool:
    pid = spare_pid(home)
    return pid is not None and running(pid)


def running(pid: int) -> bool:
    """The process runs: not gone, and no zombie (a spare that exited stays one until the
    sweep's process, its parent, reaps it; an actor cannot wait for it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
