"""The environment of a process started to do a job's work: a tuning child, a spare, a pass.

Beneath child.py and spares.py, which both start such processes (a spare becomes a child), so
that neither imports the other for it.
"""

from __future__ import annotations

import os
import sys

# Variables Ray sets in its workers that a job process does not have.
_RAY_ONLY = ("PYTHONBREAKPOINT", "SPT_NOENV", "OMP_NUM_THREADS")


def clean_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k not in _RAY_ONLY}
    # The child must import this project wherever the actor found it.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env
