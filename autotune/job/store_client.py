"""The job's client of the store: how the hook's policy, the prefetch and the node share reach it.

Every read runs on a daemon worker, bounded by the lookup timeout; the first error disables the
cache for the process with one warning, after which compiles behave like plain max-autotune.
Writes go through a writer thread of their own (or wait for ``flush`` in the sweep's pass). Under
``torchrun`` local rank 0 reads for the node's other ranks (node_share.py). What is asked, and
what an answer means, is the policy's (serve_policy.py); the prefetch opens the store through
``open_patiently`` and reports its errors to ``disable``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from autotune.cache import protocols
from autotune.cache.errors import MalformedRow
from autotune.cache.text import escape_control
from autotune.settings import Settings

from . import exit_wait, store_imports
from .hook_stats import HookStats

log = logging.getLogger(__name__)

T = TypeVar("T")


class StoreClient:
    """The job's way to the store: each read bounded by the lookup timeout and never raising
    (the first error disables the cache for the process, with one warning), each write on a
    thread of its own, and the reads shared with the node's other ranks where it has some."""

    def __init__(self, settings: Settings, stats: HookStats, *, defer_writes: bool = False) -> None:
        self.settings, self.stats = settings, stats
        # Writes held until flush(): the sweep's pass times kernels in this process, and a
        # writer thread holding the GIL (SQLAlchemy is Python) delays their launches.
        self._deferred: list[Callable[[], None]] | None = [] if defer_writes else None
        # Compiled artifacts are held apart from the data writes: a pass may withhold them.
        self._deferred_artifacts: list[Callable[[], None]] = []
        self._artifacts_withheld = False
        self._deferred_lock = threading.Lock()
        # The store's imports (made by the first caller of store_imports.join(): the prefetch's
        # thread, or a lookup before the timed call) are not part of the lookup timeout, which is
        # for a slow or unreachable database: on a busy node (a GPU host compiling, with the GIL
        # shared with the job's own imports) they alone could outlast the timeout and turn a
        # whole warm start into plain max-autotune.
        self._store: protocols.Store | None = None
        self._database: protocols.Store | None = None
        self.disabled = False
        self._closed = False  # uninstalled: a thread still running gets no answers, quietly
        self._lock = threading.Lock()
        self._database_lock = threading.Lock()
        self._node = _NodeShare(self) if settings.node_share else None
        self._wait_lock = threading.Lock()
        # Daemon workers: the exit waits for a call in flight at most a few seconds past the lookup
        # timeout, whatever the database does (autotune/job/exit_wait.py); concurrent.futures' would wait for it.
        self._pool = exit_wait.DaemonWorker("autotune-cache", settings.lookup_timeout + exit_wait.EXIT_GRACE_S)
        self._warned_rows: set[tuple[str, object]] = set()  # (table, id) of malformed rows
        self._warn_lock = threading.Lock()  # rows are read by compiles and by the kernel-config loader
        # Kernel config copies go through their own thread so lookups never queue behind them.
        self._writer = exit_wait.DaemonWorker("autotune-save", settings.lookup_timeout + exit_wait.EXIT_GRACE_S)

    # --- reads, bounded and never raising -------------------------------------------
    def call(self, fn: Callable[[protocols.Store], Any], timeout: float | None = None) -> Any:
        """Run ``fn(store)`` with the lookup timeout; on any failure disable the cache."""
        if self.disabled:
            return None
        store_imports.join()
        began = time.perf_counter()
        try:
            future = self._pool.submit(lambda: fn(self.open()))
            return future.result(timeout=timeout or self.settings.lookup_timeout)
        except Exception as exc:
            self.disable(exc)
            return None
        finally:
            with self._wait_lock:
                self.stats.store_wait_s += time.perf_counter() - began

    def open(self) -> protocols.Store:
        with self._lock:
            if self._store is None:
                shared = self._node.store() if self._node is not None else None
                if shared is None and self._node is not None and self._node.pending:
                    return self.open_database()  # local rank 0 is still starting: ask it next time
                self._store = cast("protocols.Store", shared) if shared is not None else self.open_database()
            return self._store

    def open_patiently(self) -> protocols.Store:
        """``_open`` for the prefetch: under torchrun it waits first for local rank 0's socket
        (``_PREFETCH_NODE_WAIT_S``). It runs on its own thread, and compiles that ask it first
        wait for it only up to the lookup timeout, so rank 0 coming up a few seconds after this
        rank costs nothing; without the wait this rank's whole prefetch read the database."""
        if self._node is not None:
            self._node.wait_connected(_PREFETCH_NODE_WAIT_S)
        return self.open()

    def open_database(self) -> protocols.Store:
        """The database itself, each call counted (``HookStats.database_calls``). Its modules come
        from the imports thread: SQLAlchemy's modules import each other in cycles, and a second
        thread importing them at once (the prefetch's) was handed unfinished ones, which disabled
        the cache for the whole job."""
        store_imports.join()
        with self._database_lock:
            if self._database is None:
                from autotune.cache.store import Store

                # The server's own bounds on this job's sessions: a lock wait ends with the lookup
                # (a table lock held for minutes frees the session and its thread at once); a statement
                # may run as long as WarmStart.flush waits for the writes (an artifact's upload).
                timeout = self.settings.lookup_timeout
                store = Store(self.settings.cache, read_only=self.settings.read_only, connect_timeout=timeout,
                              lock_timeout=timeout, statement_timeout=max(30.0, 10 * timeout))
                self._database = cast("protocols.Store", _Counted(store, self.stats))
            return self._database

    def malformed_row(self, error: MalformedRow) -> None:
        """A stored row that fails validation: read as absent, with one warning per row."""
        with self._warn_lock:
            if (error.table, error.row_id) in self._warned_rows:
                return
            self._warned_rows.add((error.table, error.row_id))
            self.stats.malformed_rows += 1
        log.warning("autotune: %s", escape_control(str(error)))

    def set_aside(self, found: T) -> T:
        """A listing from the store (None when the call failed), after a warning for each row
        it left out."""
        for error in getattr(found, "malformed", ()):
            self.malformed_row(error)
        return found

    def disable(self, exc: BaseException) -> None:
        # A call after uninstall, or from a thread the exit does not wait for (the ISA probes), is
        # refused by a shut executor: not a fault of the cache.
        if self._closed or exit_wait.exiting():
            log.debug("autotune: a store call after uninstall or at exit was dropped (%s)", exc)
            return
        self.stats.errors += 1
        if not self.disabled:
            self.disabled = True
            reason = "timed out" if isinstance(exc, concurrent.futures.TimeoutError) else f"{type(exc).__name__}: {exc}"
            message = f"autotune: kernel cache unavailable ({reason}); compiling as plain max-autotune"
            log.warning(message)

    # --- writes, on the writer thread ------------------------------------------------
    def write_later(self, work: Callable[[protocols.Store], None]) -> None:
        """Run ``work(store)`` on the writer thread (compiles never wait for it); an error
        disables the cache, as any other store error does."""
        def run() -> None:
            try:
                work(self.open())
            except Exception as exc:
                self.disable(exc)

        self.submit_write(run)

    def submit_write(self, work: Callable[[], None]) -> None:
        """Run a write on the writer thread, so compiles never wait for it (or, when writes
        are deferred, keep it for the next flush)."""
        if self.disabled:
            return
        with self._deferred_lock:
            if self._deferred is not None:
                self._deferred.append(work)
                return
        self._writer.submit(work)

    def submit_artifact_write(self, work: Callable[[], None]) -> None:
        """Like ``submit_write``, for a compiled artifact: deferred ones wait apart from the
        data writes, and none is written once ``withhold_artifacts`` was called."""
        with self._deferred_lock:
            if self._artifacts_withheld:
                return
            if self._deferred is not None:
                self._deferred_artifacts.append(work)
                return
        self.submit_write(work)

    def withhold_artifacts(self) -> int:
        """Drop the deferred artifact writes and write no artifact from now on. Returns how
        many were dropped."""
        with self._deferred_lock:
            dropped, self._deferred_artifacts = len(self._deferred_artifacts), []
            self._artifacts_withheld = True
        return dropped

    def _release_deferred(self) -> None:
        """Hand the deferred writes, in order, to the writer thread: data before artifacts."""
        with self._deferred_lock:
            held, self._deferred = self._deferred, ([] if self._deferred is not None else None)
            held = (held or []) + self._deferred_artifacts
            self._deferred_artifacts = []
        for work in held:
            if not self.disabled:
                self._writer.submit(work)

    def flush(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until every queued write is done, deferred ones included."""
        self._release_deferred()
        try:
            self._writer.submit(lambda: None).result(timeout=timeout)
        except Exception as exc:
            self.disable(exc)

    def closing(self) -> None:
        """Uninstalling: from now on a thread still running gets no answers, quietly."""
        self._closed = True

    def close(self) -> None:
        self._closed = True
        self._release_deferred()  # never lost: they finish on the writer thread
        self._pool.shutdown(wait=False)
        self._writer.shutdown(wait=False)  # queued writes still finish; a hung database never blocks uninstall
        if self._node is not None:
            self._node.close()
        if self._database is not None:  # a store shared through rank 0 is closed with the share
            try:
                self._database.close()
            except Exception:
                pass


class _Counted:
    """A store whose every call is counted as one database call."""

    def __init__(self, store: Any, stats: HookStats) -> None:
        self._inner, self._stats = store, stats

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if name.startswith("_") or not callable(found):
            return found

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._stats.database_calls += 1
            return found(*args, **kwargs)

        return counted


class _NodeShare:
    """This rank's part in sharing one reader per node (autotune/job/node_share.py): local rank 0
    serves from its first install, the others connect in the background and ask it."""

    def __init__(self, client: StoreClient) -> None:
        from . import node_share

        self._server: node_share.NodeServer | None = None
        self._client: concurrent.futures.Future[Any] | None = None
        self._timeout = client.settings.lookup_timeout
        self._waited = False
        role = node_share.node_role()
        if role is None:
            return
        try:
            if role.serves:
                # It ends once the node's other ranks are served (node_share.NodeServer).
                self._server = node_share.NodeServer(role.socket_path,
                                                     node_share.SharedReads(client.open_database, role.local_world_size),
                                                     peers=role.local_world_size - 1)
            else:  # rank 0 may still be starting: connect while this rank imports and traces
                self._client = concurrent.futures.Future()
                # A daemon thread: a rank whose local rank 0 never serves must not wait for it at exit.
                threading.Thread(target=_connect_into, args=(self._client, role.socket_path, client.open_database),
                                 daemon=True, name="autotune-node-connect").start()
        except OSError as exc:
            log.warning("autotune: ranks on this node do not share the cache (%s); each reads it", exc)

    def store(self) -> Any:
        """What this rank reads through: rank 0's answers, or None (read the database itself)."""
        if self._server is not None:
            return self._server.reads
        if self._client is None:
            return None
        try:  # the first ask waits a little for rank 0; while it is late, later asks do not
            waited, self._waited = (0.0 if self._waited else self._timeout / 2), True
            return self._client.result(timeout=waited)
        except concurrent.futures.TimeoutError:
            # The ranks start together, but local rank 0 may open its socket seconds after this
            # rank first asks (its imports, its GPU's start): while the connection still tries,
            # this call reads the database and the next one asks again (``pending``).
            if self.pending:
                return None
            why = "TimeoutError"
        except PermissionError as exc:  # another process listens where local rank 0 should (node_share.py)
            why = f"PermissionError: {exc}"
        except Exception as exc:  # noqa: BLE001 - rank 0 gone: this rank reads the database
            why = type(exc).__name__
        log.warning("autotune: local rank 0 does not answer (%s); this rank reads the cache itself", why)
        self._client = None
        return None

    def wait_connected(self, seconds: float) -> None:
        """Wait up to ``seconds`` for the connection to local rank 0 to be made (or to fail)."""
        if self._client is not None:
            concurrent.futures.wait([self._client], timeout=seconds)

    @property
    def pending(self) -> bool:
        """Still connecting to local rank 0 in the background."""
        return self._client is not None and not self._client.done()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._client is not None and self._client.done() and self._client.exception() is None:
            self._client.result().close()


# How long a rank waits in the background for local rank 0's socket to appear.
_NODE_CONNECT_S = 30.0
# How long a rank's prefetch waits for that socket before it reads the database itself.
_PREFETCH_NODE_WAIT_S = 10.0


def _connect_into(future: concurrent.futures.Future[Any], path: Any, fallback: Callable[[], Any]) -> None:
    from .node_share import NodeClient

    try:  # once local rank 0 ends the share, the client reads the database through fallback
        future.set_result(NodeClient(path, _NODE_CONNECT_S, fallback))
    except Exception as exc:  # noqa: BLE001 - store() reads it and falls back to the database
        future.set_exception(exc)
