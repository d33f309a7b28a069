"""Which cached results a sweep times again: those whose candidates were timed on a busy host
(workers/noise.py), when this host is quiet now. The new result replaces the old in its row,
as any re-tune does. On a host that is busy itself, timing them again would measure no better,
so they stay cached. ``--force`` re-tunes everything, as before.
"""

from __future__ import annotations

import logging
from typing import Any

from autotune.cache.records import Environment
from autotune.inductor_glue.timing import others_running_per_core

from .noise import BUSY_LOAD

log = logging.getLogger(__name__)


def host_is_quiet() -> bool:
    """No other processes ready to run on every core of this host right now (unknown: quiet)."""
    load = others_running_per_core()
    return load is None or load < BUSY_LOAD


def without_busy_timed(store: Any, env: Environment, cached: set[str], quiet: bool | None = None) -> set[str]:
    """``cached`` less the keys whose results were timed on a busy host, where this host is quiet."""
    if not cached or not (host_is_quiet() if quiet is None else quiet):
        return cached
    retimed = cached & store.busy_timed_request_keys(env)
    if retimed:
        log.info("%d cached result(s) timed on a busy host are timed again on this quiet one", len(retimed))
    return cached - retimed
