"""The store's imports (SQLAlchemy and the cache package), once per process, on a thread of their own.

They are CPU work that cannot hang, and a warm start's first lookup needs them. So
``warm_start()`` starts them before Inductor's imports (autotune/__init__.py), and the store
opens at once when the hook asks for it. Started later, at the hook's install, they came after
Inductor's imports, and a compile called at once waited for them through the prefetch. Beside
Inductor's imports they take turns with them on the GIL and lengthen them; made first on the
install's thread instead, they lengthened them more in the one run measured
(docs/internals.md).

Every user of the store joins the one thread (``join()``): SQLAlchemy's modules import each
other in cycles, and a second thread importing them at once was handed unfinished ones, which
disabled a job's cache. Nothing here imports torch.
"""

from __future__ import annotations

import importlib
import threading

from . import exit_wait

THREAD_NAME = "autotune-imports"  # the import gate never holds a thread named autotune-*

_lock = threading.Lock()
_thread: threading.Thread | None = None


def _import_store_modules() -> None:
    importlib.import_module("autotune.cache.store")


def start() -> threading.Thread:
    """The thread importing the store's modules, started on the first call."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_import_store_modules, name=THREAD_NAME, daemon=True)
            _thread.start()
            exit_wait.finish_before_exit(_thread)
        return _thread


def join() -> None:
    """Return once the store's modules are imported (or their import failed: the store's own
    import then raises where it is used, as it would without this thread)."""
    thread = start()
    if threading.current_thread() is not thread:
        thread.join()
