"""The store's imports (SQLAlchemy and the cache package), once per process, by one thread at a time.

SQLAlchemy's modules import each other in cycles, and a second thread importing them at once
was handed unfinished ones, which disabled a job's cache. So every user of the store calls
``join()`` first: the first caller imports them, on its own thread, while any other waits for it.
By default that is the prefetch's thread (its first read opens the store), or a compile's first
lookup where the prefetch is off: the warm start starts no thread for them.

With the install on a thread (``AUTOTUNE_BACKGROUND_INSTALL=1``, autotune/job/background.py),
``start()`` imports them on a thread of their own, started before Inductor's imports: a compile
called at once then found the store open rather than waiting for them through the prefetch.
Beside Inductor's imports they take turns with them on the GIL and lengthen them; made first on
the install's thread instead, they lengthened them more in the one run measured
(docs/internals.md). Nothing here imports torch.
"""

from __future__ import annotations

import importlib
import logging
import threading

from . import exit_wait

log = logging.getLogger(__name__)

THREAD_NAME = "autotune-imports"  # the import gate never holds a thread named autotune-*

_lock = threading.Lock()  # guards _thread
_importing = threading.Lock()  # held by the one thread importing the store's modules
_thread: threading.Thread | None = None
_imported = False  # the store's modules are imported (or their import failed)


def _import_store_modules() -> None:
    importlib.import_module("autotune.cache.store")


def _import_once() -> None:
    global _imported
    if _imported:
        return
    with _importing:
        if _imported:
            return
        if threading.current_thread() is not threading.main_thread():
            # The prefetch's thread (a daemon): the interpreter's exit lets its imports end first,
            # as it joins start()'s thread; imports left running into finalization printed errors
            # about half-torn-down modules (autotune/job/exit_wait.py).
            exit_wait.stop_at_exit(threading.current_thread(), stop=_let_imports_end)
        try:
            _import_store_modules()
        except Exception:  # noqa: BLE001 - the store's own import raises it where it is used
            log.debug("the store's imports failed", exc_info=True)
        _imported = True


def _let_imports_end() -> None:
    """At exit: return once no thread is importing the store's modules (within the exit's wait)."""
    if _importing.acquire(timeout=exit_wait.EXIT_WAIT_S):
        _importing.release()


def start() -> threading.Thread:
    """The thread importing the store's modules, started on the first call (the install on a
    thread's: the default start-up calls none)."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_import_once, name=THREAD_NAME, daemon=True)
            _thread.start()
            exit_wait.finish_before_exit(_thread)
        return _thread


def join() -> None:
    """Return once the store's modules are imported (or their import failed: the store's own
    import then raises where it is used, as it would without this): by ``start()``'s thread
    where it was started, else here, on the calling thread."""
    with _lock:
        thread = _thread
    if thread is None:
        _import_once()
    elif threading.current_thread() is not thread:
        thread.join()
