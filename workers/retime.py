"""Which cached results a sweep times again: those whose candidates were timed on a busy host
(workers/noise.py), when this host is quiet (``host_is_quiet``). The new result replaces the
old in its row, as any re-tune does. On a host that is busy itself, timing them again would
measure no better, so they stay cached. ``--force`` re-tunes everything, as before.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from autotune.cache.records import Environment
from autotune.inductor_glue.timing import others_running_per_core

from .noise import BUSY_LOAD

log = logging.getLogger(__name__)


def host_is_quiet(samples: int = 3, interval_s: float = 0.1) -> bool:
    """Quiet now and over the last minute: the load average per core, and each of a few
    readings of the other processes ready to run, below ``BUSY_LOAD``. Both, because a busy
    host has quiet instants, and a result timed again there would be no better (unknown: quiet)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if hasattr(os, "getloadavg") and os.getloadavg()[0] / (cores or 1) >= BUSY_LOAD:
        return False
    for sample in range(samples):
        if sample:
            time.sleep(interval_s)
        load = others_running_per_core()
        if load is not None and load >= BUSY_LOAD:
            return False
    return True


def without_busy_timed(store: Any, env: Environment, cached: set[str], quiet: bool | None = None) -> set[str]:
    """``cached`` less the keys whose results were timed on a busy host, where this host is quiet."""
    if not cached or not (host_is_quiet() if quiet is None else quiet):
        return cached
    retimed = cached & store.busy_timed_request_keys(env)
    if retimed:
        log.info("%d cached result(s) timed on a busy host are timed again on this quiet one", len(retimed))
    return cached - retimed
