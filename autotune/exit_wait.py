"""The warm start's threads end before the interpreter does.

``warm_start()`` leaves daemon threads working for the job: the install, the store's imports,
the prefetch, the vector-ISA probes. A script that exits while one of them still runs (one
that never compiles, or exits early) used to take them into the interpreter's finalization,
where a daemon thread taking the GIL back is ended by ``pthread_exit``; inside a C++ frame
that ends the process. A CI job aborted so after its last line had run ("terminate called
without an active exception"; which thread it was is not known), and threads still importing
printed errors about half-torn-down modules.

So each such thread is registered here with how to ask it to stop, and at exit every one is
asked, then joined, within ``EXIT_WAIT_S`` in all. A job that compiled finds them long ended
and waits for nothing. The prefetch is only asked (``stop_at_exit``): it reads the database,
which may hang, and exit never waits for it (issue 53); asked, it ends at its next step, mostly
just after the store's imports, which are joined. This runs among ``threading``'s exit
functions, ahead of ``concurrent.futures``' (they run in reverse order of registration, and
that module is imported before ours registers), so a thread still fetching through the store's
executor is not refused. A thread that outlasts the wait is left as before: a stuck database
never holds up the exit for long.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401 - its exit function is registered before ours (see above)
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# Longer than the install's imports on a busy node; a thread still running past it (a query to a
# hung database) stays a daemon, as every one did before.
EXIT_WAIT_S = 10.0

_lock = threading.Lock()
_waiting: list[tuple[threading.Thread, Callable[[], None] | None, bool]] = []  # thread, stop, joined
_registered = False
_exiting = threading.Event()


def exiting() -> bool:
    """Whether the interpreter's exit has begun (the threads' wait has started)."""
    return _exiting.is_set()


def finish_before_exit(thread: threading.Thread, stop: Callable[[], None] | None = None) -> None:
    """At the interpreter's exit, call ``stop()`` (if given), then join ``thread``."""
    _register(thread, stop, joined=True)


def stop_at_exit(thread: threading.Thread, stop: Callable[[], None]) -> None:
    """At the interpreter's exit, while ``thread`` runs, call ``stop()``; the exit does not wait for it."""
    _register(thread, stop, joined=False)


def _register(thread: threading.Thread, stop: Callable[[], None] | None, joined: bool) -> None:
    global _registered
    with _lock:
        # Ended threads are dropped, so a long process (a sweep makes many policies) keeps none.
        _waiting[:] = [entry for entry in _waiting if entry[0].ident is None or entry[0].is_alive()]
        _waiting.append((thread, stop, joined))
        if _registered:
            return
        _registered = True
    try:
        threading._register_atexit(_finish)  # type: ignore[attr-defined]  # CPython's, since 3.9
    except (AttributeError, RuntimeError):  # a Python without it, or the interpreter already exits
        atexit.register(_finish)


def _finish() -> None:
    _exiting.set()
    deadline = time.monotonic() + EXIT_WAIT_S
    while True:
        with _lock:
            if not _waiting:
                return
            pending, _waiting[:] = list(_waiting), []
        for thread, stop, _joined in pending:
            if stop is not None and thread.is_alive():
                _quietly(stop)
        for thread, _stop, joined in pending:  # a joined thread may have registered others: the loop takes them
            if joined and thread.ident is not None:  # never started: nothing to wait for
                thread.join(max(0.0, deadline - time.monotonic()))
            if joined and thread.is_alive():
                log.debug("autotune: %s still runs at exit; left to end with the process", thread.name)


def _quietly(stop: Callable[[], None]) -> None:
    try:
        stop()
    except Exception:  # noqa: BLE001 - the exit goes on
        log.debug("autotune: a thread's stop failed at exit", exc_info=True)
