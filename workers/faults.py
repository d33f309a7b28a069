"""Fault injection for tests of the failure path, shared by the actor and its child.

Its own module so that the actor (which starts the child) and the child (which
injects the fault) do not import each other.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

# Fault injection for tests of the failure path: "crash:KEY" makes the process
# die (os._exit) on the request whose key starts with KEY, "hang:KEY" makes it
# sleep past any timeout, "kill-once:KEY" makes it SIGKILL itself the first time
# only (per parent process: a marker file), and "slow:SECONDS" delays every request
# by SECONDS (so that a test's jobs outlast the spread between its actors'
# start-ups); several, comma-separated. The end-to-end pass's key is
# "pass:<model file stem>". Set in the driver's environment, read there by the
# settings (``fault_inject``), and handed to the pool, its actors and their
# children with each job (``FAULT_KEY``).
FAULT_ENV = "AUTOTUNE_FAULT_INJECT"
FAULT_KEY = "fault"  # the job message's field that carries it to the tuning child


def inject_fault(spec: str, request_key: str) -> None:
    """Injects each fault of ``spec`` (comma-separated) that names this request or pass."""
    for one in spec.split(","):
        _inject_one(one.strip(), request_key)


def _inject_one(spec: str, request_key: str) -> None:
    kind, _, target = spec.partition(":")
    if kind == "slow" and target:
        time.sleep(float(target))
        return
    if not spec or not target or not request_key.startswith(target):
        return
    if kind == "crash":
        os._exit(17)
    if kind == "hang":
        time.sleep(3600)
    if kind == "kill-once":
        marker = Path(tempfile.gettempdir()) / f"autotune-fault-{os.getppid()}-{target.replace(':', '-')}"
        if not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
