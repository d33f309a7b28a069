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

The hook's store calls run on ``DaemonWorker`` threads, not ``concurrent.futures``' own: that
module joins its workers at exit without a bound, and a job whose database stalled after
connecting (a table lock, a server that stops answering) waited minutes at exit for a lookup it
had given up on long before (issue 78). At exit, each call a worker runs gets the
worker's ``stall_s`` (the lookup timeout plus ``EXIT_GRACE_S``) from the moment it started, so a
queue of writes to a database that answers drains, a call stuck since long before the exit (a
lookup its caller gave up on) is given up at once, and one that started just before it costs at
most ``stall_s``; what is left is given up with one warning. A write given up never
commits: its transaction dies with the process, and the server rolls it back.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import concurrent.futures.thread  # noqa: F401 - its exit function is registered before ours (see above)
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

# Longer than the install's imports on a busy node; a thread still running past it (a query to a
# hung database) stays a daemon, as every one did before.
EXIT_WAIT_S = 10.0

# How long past the lookup timeout the exit waits for a store call in flight: a write's commit,
# on a database that answers, takes far less.
EXIT_GRACE_S = 3.0
# The most the exit waits for store workers that keep finishing calls (a long queue of writes).
DRAIN_CAP_S = 30.0
# How long a store worker's thread waits for another call before it ends (the next call starts
# another): a compile's lookups come in bursts, and nothing of ours stays alive between them.
IDLE_S = 0.5

T = TypeVar("T")

_lock = threading.Lock()
_waiting: list[tuple[threading.Thread, Callable[[], None] | None, bool]] = []  # thread, stop, joined
_workers: list[DaemonWorker] = []  # started store workers, drained at exit
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


def _register(thread: threading.Thread | None, stop: Callable[[], None] | None, joined: bool,
              worker: DaemonWorker | None = None) -> None:
    global _registered
    with _lock:
        # Ended threads are dropped, so a long process (a sweep makes many policies) keeps none.
        _waiting[:] = [entry for entry in _waiting if entry[0].ident is None or entry[0].is_alive()]
        _workers[:] = [held for held in _workers if held.alive()]
        if thread is not None:
            _waiting.append((thread, stop, joined))
        if worker is not None and worker not in _workers:  # a worker whose idle thread ended comes back
            _workers.append(worker)
        if _registered:
            return
        _registered = True
    try:
        threading._register_atexit(_finish)  # type: ignore[attr-defined]  # CPython's, since 3.9
    except (AttributeError, RuntimeError):  # a Python without it, or the interpreter already exits
        atexit.register(_finish)


def _finish() -> None:
    _exiting.set()
    began = time.monotonic()
    _join_threads(began + EXIT_WAIT_S)
    with _lock:
        workers, _workers[:] = list(_workers), []
    _drain(workers, began)


def _join_threads(deadline: float) -> None:
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


def _drain(workers: list[DaemonWorker], began: float) -> None:
    """Wait for the workers' calls while each runs within its worker's ``stall_s`` (all of them at
    most ``DRAIN_CAP_S``); give up the rest with one warning."""
    cap = began + DRAIN_CAP_S
    while time.monotonic() < cap and any(worker.pending and not worker.stalled() for worker in workers):
        time.sleep(0.02)
    left = sum(worker.pending for worker in workers)
    if left:
        log.warning("autotune: at exit, %d cache call(s) still waited for the database; given up after %.1f s "
                    "(a write among them is not stored)", left, time.monotonic() - began)


class DaemonWorker:
    """Runs the calls given to ``submit`` one at a time, in order, on one daemon thread:
    ``ThreadPoolExecutor(max_workers=1)``'s part for the hook's store calls, except that the
    interpreter's exit waits for its calls at most ``stall_s`` (the module's docstring), and that
    the thread ends once it has waited ``IDLE_S`` for a call; the next call starts another. A job
    keeps no idle thread of ours for its whole life (docs/internals.md)."""

    def __init__(self, name: str, stall_s: float) -> None:
        self.name = name
        self.stall_s = stall_s
        self.completed = 0  # calls finished (the exit's wait counts progress by it)
        self._calls: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]] | None] = \
            queue.SimpleQueue()
        self._submitted = 0
        self._lock = threading.Lock()
        self._shut = False
        self._thread: threading.Thread | None = None
        self._running_since: float | None = None  # monotonic start of the call running now

    @property
    def pending(self) -> int:
        """Calls submitted and not finished (queued, or running now)."""
        return self._submitted - self.completed

    def stalled(self) -> bool:
        """The call running now has run ``stall_s`` or more (False while the next one starts)."""
        since = self._running_since
        return since is not None and time.monotonic() - since >= self.stall_s

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Queue ``fn()``; its future holds what it returns or raises. Refused once shut down."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._shut:
                raise RuntimeError(f"cannot schedule new calls on {self.name}: it was shut down")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
                _register(None, None, joined=False, worker=self)
            self._submitted += 1
            self._calls.put((future, fn))
        return future

    def shutdown(self, wait: bool = False) -> None:
        """Refuse new calls; those queued still run. With ``wait``, return once they ran, as the
        executor's does (tests; the hook never waits here: its uninstall never waits for a hung
        database)."""
        with self._lock:
            if not self._shut:
                self._shut = True
                if self._thread is not None:
                    self._calls.put(None)  # after the queued calls: the thread ends once they ran
            thread = self._thread
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            try:
                item = self._calls.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:  # submit() queues under it: no call is left behind an ending thread
                    if self._calls.empty():
                        self._thread = None
                        return
                continue
            if item is None:
                return
            future, fn = item
            self._running_since = time.monotonic()
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as exc:  # noqa: BLE001 - handed to the caller, as an executor does
                        future.set_exception(exc)
            finally:
                with self._lock:
                    self.completed += 1
                    self._running_since = None
