"""The store's imports (SQLAlchemy and the cache package), once per process.

A warm start's first lookup needs them, and they are a quarter of a second of CPU work that
cannot hang. Where they run matters:

- the hook's install starts them on a thread of their own (``start``), beside the rest of the
  install and the script's model building;
- the install on a thread imports them itself (``import_here``), first, before Inductor's
  imports: started at its end they came after those imports, and a compile called at once
  waited for them through the prefetch; run beside those imports they took turns with them on
  the GIL and lengthened them by more than their own length (docs/internals.md).

Every user of the store waits for the one import (``join``): SQLAlchemy's modules import each
other in cycles, and a second thread importing them at once was handed unfinished ones, which
disabled a job's cache. Nothing here imports torch.
"""

from __future__ import annotations

import importlib
import threading

from . import exit_wait

THREAD_NAME = "autotune-imports"  # the import gate never holds a thread named autotune-*

_lock = threading.Lock()
_claimed = False
_done = threading.Event()


def _import_store_modules() -> None:
    importlib.import_module("autotune.cache.store")


def _claim() -> bool:
    """True for the one caller that imports them."""
    global _claimed
    with _lock:
        claimed, _claimed = _claimed, True
        return not claimed


def _run() -> None:
    try:
        _import_store_modules()
    finally:  # failed: the store's own import raises where it is used, as it would without this
        _done.set()


def start() -> None:
    """Import them on a thread of their own, unless that has begun already."""
    if _claim():
        thread = threading.Thread(target=_run, name=THREAD_NAME, daemon=True)
        thread.start()
        exit_wait.finish_before_exit(thread)


def import_here() -> None:
    """Import them on the calling thread now, or wait for the thread that is at it."""
    if _claim():
        _run()
    else:
        _done.wait()


def join() -> None:
    """Return once they are imported (started now if nothing started them)."""
    start()
    _done.wait()
