"""How the warm-start hook answers Inductor's lookups: from the store (through the prefetch, the
node's share or the database, each call bounded by a timeout), with Inductor's own behaviour as
the fallback. ``autotune/hook.py`` installs it into Inductor and counts its work (hook_stats.py)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from autotune.cache import protocols
from autotune.cache.errors import MalformedRow, one_line, or_malformed
from autotune.cache.records import (
    STATUS_OK,
    Environment,
    InputLayout,
    Provenance,
    TuningRequest,
    TuningResult,
)
from autotune.cache.signing import TrustedKeys
from autotune.cache.text import escape_control
from autotune.inductor_glue.fusion import PREFIX as FUSION_PREFIX
from autotune.inductor_glue.inductor import (
    Benchmark,
    ObservedRequest,
    Timings,
    choice_hash,
    describe_choice,
)
from autotune.inductor_glue.pinning import Pin, PinIndex

from . import exit_wait, store_imports
from .hook_stats import MISSES_LISTED, CacheMissError, HookStats, missed_entry
from .plan import shape_summary
from .settings import Settings

if TYPE_CHECKING:
    from .nearest import NearestIndex
    from .prefetch import Prefetch

log = logging.getLogger(__name__)

T = TypeVar("T")


def _aten_answer(choices: list[Any]) -> Timings:
    """Timings that make Inductor pick ATen's kernel, as default mode does (the first choice
    where there is none)."""
    from torch._inductor import select_algorithm as sa

    aten = [c for c in choices if isinstance(c, sa.ExternKernelCaller)]
    fastest = aten[0] if aten else choices[0]
    return {c: (0.0 if c is fastest else math.inf) for c in choices}


def _device(inputs: Sequence[InputLayout]) -> str:
    """The device type a request's inputs live on ("cpu" for a request described without them)."""
    return inputs[0].device if inputs else "cpu"


class ServePolicy:
    """Answers lookups from the store, with Inductor's own behaviour as the fallback."""

    def __init__(self, settings: Settings, *, time_in_graph: bool = False, defer_writes: bool = False) -> None:
        self.settings = settings
        self.stats = HookStats()
        # The sweep's end-to-end pass: hits are timed in this process and stored as verdicts.
        self.time_in_graph = time_in_graph
        # Writes held until flush(): the sweep's pass times kernels in this process, and a
        # writer thread holding the GIL (SQLAlchemy is Python) delays their launches.
        self._deferred: list[Callable[[], None]] | None = [] if defer_writes else None
        # Compiled artifacts are held apart from the data writes: a pass may withhold them.
        self._deferred_artifacts: list[Callable[[], None]] = []
        self._artifacts_withheld = False
        self._deferred_lock = threading.Lock()
        self.served = 0  # stored answers given (compile_retry.py: did this graph use the cache?)
        self._aten_only = False  # answering every lookup with ATen: a graph's compile again
        # Pointwise/reduction kernels Inductor tuned in this process (saved, not served), by key.
        self.tuned_keys: set[str] = set()
        self._configs_saved: set[str] = set()  # keys stored so far (read and written on the writer thread only)
        self._verdicts: set[str] = set()  # request keys timed here
        # The store's imports (made by the first caller of store_imports.join(): the prefetch's
        # thread, or a lookup before the timed call) are not part of the lookup timeout, which is
        # for a slow or unreachable database: on a busy node (a GPU host compiling, with the GIL
        # shared with the job's own imports) they alone could outlast the timeout and turn a
        # whole warm start into plain max-autotune.
        self._store: protocols.Store | None = None
        self._database: protocols.Store | None = None
        self._disabled = False
        self._closed = False  # uninstalled: a thread still running gets no answers, quietly
        self._lock = threading.Lock()
        self._database_lock = threading.Lock()
        self._node = _NodeShare(self) if settings.node_share else None
        self._wait_lock = threading.Lock()
        # Daemon workers: the exit waits for a call in flight at most a few seconds past the lookup
        # timeout, whatever the database does (autotune/exit_wait.py); concurrent.futures' would wait for it.
        self._pool = exit_wait.DaemonWorker("autotune-cache", settings.lookup_timeout + exit_wait.EXIT_GRACE_S)
        self._logged_misses: set[str] = set()  # request keys
        self._warned_winners: set[str] = set()  # request keys whose winner was not generated
        self._warned_rows: set[tuple[str, object]] = set()  # (table, id) of malformed rows
        self._warn_lock = threading.Lock()  # rows are read by compiles and by the kernel-config loader
        self._warned_timings: set[str] = set()  # request keys whose stored timings serve no choice
        self._pins: dict[str, PinIndex | None] = {}  # device type -> stored winners
        self._results: dict[str, list[TuningResult]] = {}  # environment key -> its stored results
        self._nearest: dict[str, NearestIndex] = {}  # environment key -> its stored winners by shape
        self._served_nearest: set[str] = set()  # request keys
        self._decisions: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}  # (device, prefix) -> key -> value
        self.fusion_device: str | None = None  # the GPU whose fusion verdicts are served (WarmStart)
        self.prefetch: Prefetch | None = None  # what the store holds for this process, read ahead (WarmStart)
        # Kernel config copies go through their own thread so lookups never queue behind them.
        self._writer = exit_wait.DaemonWorker("autotune-save", settings.lookup_timeout + exit_wait.EXIT_GRACE_S)

    # --- store access, bounded and never raising ---------------------------------
    def _call(self, fn: Callable[[protocols.Store], Any], timeout: float | None = None) -> Any:
        """Run ``fn(store)`` with the lookup timeout; on any failure disable the cache."""
        if self._disabled:
            return None
        store_imports.join()
        began = time.perf_counter()
        try:
            future = self._pool.submit(lambda: fn(self._open()))
            return future.result(timeout=timeout or self.settings.lookup_timeout)
        except Exception as exc:
            self._disable(exc)
            return None
        finally:
            with self._wait_lock:
                self.stats.store_wait_s += time.perf_counter() - began

    def _open(self) -> protocols.Store:
        with self._lock:
            if self._store is None:
                shared = self._node.store() if self._node is not None else None
                if shared is None and self._node is not None and self._node.pending:
                    return self._open_database()  # local rank 0 is still starting: ask it next time
                self._store = cast("protocols.Store", shared) if shared is not None else self._open_database()
            return self._store

    def _open_patiently(self) -> protocols.Store:
        """``_open`` for the prefetch: under torchrun it waits first for local rank 0's socket
        (``_PREFETCH_NODE_WAIT_S``). It runs on its own thread, and compiles that ask it first
        wait for it only up to the lookup timeout, so rank 0 coming up a few seconds after this
        rank costs nothing; without the wait this rank's whole prefetch read the database."""
        if self._node is not None:
            self._node.wait_connected(_PREFETCH_NODE_WAIT_S)
        return self._open()

    def _open_database(self) -> protocols.Store:
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

    def _set_aside(self, found: T) -> T:
        """A listing from the store (None when the call failed), after a warning for each row
        it left out."""
        for error in getattr(found, "malformed", ()):
            self.malformed_row(error)
        return found

    def _disable(self, exc: BaseException) -> None:
        # A call after uninstall, or from a thread the exit does not wait for (the ISA probes), is
        # refused by a shut executor: not a fault of the cache.
        if self._closed or exit_wait.exiting():
            log.debug("autotune: a store call after uninstall or at exit was dropped (%s)", exc)
            return
        self.stats.errors += 1
        if not self._disabled:
            self._disabled = True
            reason = "timed out" if isinstance(exc, concurrent.futures.TimeoutError) else f"{type(exc).__name__}: {exc}"
            message = f"autotune: kernel cache unavailable ({reason}); compiling as plain max-autotune"
            log.warning(message)

    # --- the lookup ----------------------------------------------------------------
    def lookup(self, request: ObservedRequest, choices: list[Any], benchmark: Benchmark | None,
               default: Callable[[], Timings]) -> Timings:
        if self._aten_only:  # a graph compiled again after its compile with served kernels failed
            return _aten_answer(choices)
        # Key and environment once per lookup: the miss path needs them again.
        plain, env = request.to_request(), self._env(request)
        try:
            stored = self._stored_answer(env, plain, choices)
        except Exception as exc:  # a bug here must not break the compile either
            self._disable(exc)
            stored = None
        if stored is None:
            return self._miss(env, plain, choices, benchmark, default)
        self.served += 1
        if self.time_in_graph and len(choices) > 1:
            return self._time_in_graph(stored[0], benchmark, default)
        if benchmark is not None:
            self.stats.hits += 1
        return stored[1]

    @contextlib.contextmanager
    def aten_only(self) -> Iterator[None]:
        """Inside, every lookup is answered with ATen's kernel (compile_retry.py)."""
        self._aten_only = True
        try:
            yield
        finally:
            self._aten_only = False

    def compile_retried(self, error: BaseException) -> None:
        self.stats.compiles_retried += 1
        log.warning("autotune: compiling a graph with the cache's kernels failed (%s: %s); compiling it "
                    "again with ATen's kernels for its GEMMs", type(error).__name__, one_line(error))

    def _env(self, request: ObservedRequest) -> Environment:
        from autotune.inductor_glue.env import current_environment

        return current_environment(_device(request.inputs))

    def _stored_answer(self, env: Environment, request: TuningRequest,
                       choices: list[Any]) -> tuple[TuningResult, Timings] | None:
        """The stored result and the timings it gives ``choices``; None on a miss. A stored
        row that fails validation (the store checks every timing is a time) is a miss with one
        warning, and so is an answer that gives every offered choice an infinite time: Inductor
        handed it would fail the compile, finding no valid choice."""
        stored = self._lookup_stored(env, request.key)
        if isinstance(stored, MalformedRow):
            self.malformed_row(stored)
            return None
        if stored is None or stored.status != STATUS_OK:
            return None
        times = stored.timings()
        if any(choice_hash(c) not in times for c in choices):
            return None  # a candidate the sweep never saw: the answer may be wrong
        timings = {c: times[choice_hash(c)] for c in choices}
        if not any(math.isfinite(ms) for ms in timings.values()):
            if request.key not in self._warned_timings:  # Inductor asks twice; say it once
                self._warned_timings.add(request.key)
                log.warning("autotune: the stored result of %s times none of the %d choices offered; "
                            "compiling it as on a miss", shape_summary(request), len(choices))
            return None
        winner = stored.winner
        missing = winner is not None and all(choice_hash(c) != winner.choice_hash for c in choices)
        if winner is not None and missing and request.key not in self._warned_winners:
            self._warned_winners.add(request.key)  # Inductor asks twice; say it once
            self.stats.winner_not_generated += 1
            log.warning("autotune: the stored winner %s of %s was not generated; using the best of the rest",
                        escape_control(winner.name), shape_summary(request))
        return stored, timings

    def _lookup_stored(self, env: Environment, key: str) -> TuningResult | MalformedRow | None:
        """The stored result of a request: from the prefetch when it holds it, else the store."""
        if self.prefetch is not None and not self._disabled:
            held = self.prefetch.result(env.key, key)
            if held is not None:
                return held
        return self._call(lambda store: or_malformed(lambda: store.lookup(env, key)))

    def _time_in_graph(self, stored: TuningResult, benchmark: Benchmark | None,
                       default: Callable[[], Timings]) -> Timings:
        """Time the offered choices here, as Inductor does but kernel-bound as the sweep's
        worker does (inductor_glue/timing.py), and keep the verdict."""
        from autotune.inductor_glue.timing import kernel_bound_timing

        from .in_graph import verdict

        if benchmark is None:
            return default()  # Inductor's precompile check: nothing is timed yet
        with kernel_bound_timing(_device(stored.request.inputs)):
            timings = default()
        if stored.request.key in self._verdicts:
            return timings
        self._verdicts.add(stored.request.key)
        self.stats.hits += 1
        found = verdict(stored, {choice_hash(c): ms for c, ms in timings.items()})
        if found is not None:
            self.stats.verdicts.append(found.to_json())
            if self.settings.write_back and not self.settings.read_only:
                self._store_later(lambda store: store.put_result(found.result))
        return timings

    def _miss(self, env: Environment, request: TuningRequest, choices: list[Any], benchmark: Benchmark | None,
              default: Callable[[], Timings]) -> Timings:
        if benchmark is not None or self.settings.on_miss != "tune":
            self._log_miss(env, request)
        on_miss = self.settings.on_miss
        if on_miss == "error" and not self._disabled:
            raise CacheMissError(
                f"autotune: the cache has no result for {shape_summary(request)} "
                f"(inputs_key {request.inputs_key}); run `autotune sweep` for this model"
            )
        if on_miss == "aten":
            return _aten_answer(choices)
        if on_miss == "nearest":
            served = self._serve_nearest(env, request, choices)
            if served is not None:
                return served
        timings = default()
        if benchmark is not None and timings and len(timings) == len(choices):
            self._write_back(env, request, choices, timings)
        return timings

    def _serve_nearest(self, env: Environment, request: TuningRequest, choices: list[Any]) -> Timings | None:
        """The nearest swept shape's kind of kernel, without benchmarking (see autotune/nearest.py)."""
        from .nearest import NearestIndex, match_choice

        if env.key not in self._nearest:
            self._nearest[env.key] = NearestIndex(self._env_results(env))
        stored = self._nearest[env.key].nearest(request)
        if stored is None or stored.winner is None:
            return None
        chosen = match_choice(stored.winner, [(c, describe_choice(c, None)) for c in choices])
        if chosen is None:
            return None
        if request.key not in self._served_nearest:  # Inductor may ask twice
            self._served_nearest.add(request.key)
            self.stats.nearest += 1
            log.info("autotune: %s served from the nearest swept shape %s (%s)", shape_summary(request),
                     shape_summary(stored.request), stored.winner.name)
        return {c: (0.0 if c is chosen else 1.0) for c in choices}

    def _env_results(self, env: Environment) -> list[TuningResult]:
        """Every stored result of env, read once per process (pinning and nearest use them)."""
        if env.key not in self._results:
            held = self.prefetch.env_results(env.key, env.device_kind) if self.prefetch is not None else None
            if held is not None and not self._disabled:
                self._results[env.key] = held
            else:
                self._results[env.key] = self._set_aside(self._call(lambda store: store.results_for_env(env))) or []
        return self._results[env.key]

    def _log_miss(self, env: Environment, request: TuningRequest) -> None:
        if request.key in self._logged_misses:
            return  # Inductor may look the same request up twice (precompile check, then tuning)
        self._logged_misses.add(request.key)
        self.stats.misses += 1
        if len(self.stats.missed) < MISSES_LISTED:
            self.stats.missed.append(missed_entry(request))
        log.info("autotune: cache miss %s", shape_summary(request))
        if self.settings.read_only:
            return
        self._call(lambda store: store.record_miss(env, request, host=socket.gethostname()))

    def _write_back(self, env: Environment, request: TuningRequest, choices: list[Any], timings: Timings) -> None:
        if not self.settings.write_back or self.settings.read_only:
            return
        candidates = tuple(describe_choice(c, timings.get(c)) for c in choices)
        timed = [c for c in candidates if c.ok]
        if not timed:
            return
        result = TuningResult(
            env=env,
            request=request,
            candidates=candidates,
            winner_hash=min(timed, key=lambda c: c.time_ms or math.inf).choice_hash,
            status=STATUS_OK,
            validation=None,  # timed by the job itself, not checked against ATen
            provenance=Provenance(host=socket.gethostname(), source="write_back"),
        )
        self._call(lambda store: store.put_result(result))
        if not self._disabled:
            self.stats.written += 1

    # --- pinning: which Triton configs are generated at all ------------------------
    def allow_template(self, pin: Pin) -> bool | Pin:
        """Generate a Triton config unless a stored result says it lost; in the place of the
        first that lost, its family's stored winner where this compile's config list lacks it
        (an exhaustive search's winner: ``PinIndex.instead``)."""
        if not self.settings.pin or self._disabled:
            return True
        index = self._pin_index(pin.device)
        if index is None or index.allows(pin):
            return True
        self.stats.configs_skipped += 1
        return index.instead(pin) or False

    def _pin_index(self, device: str) -> PinIndex | None:
        if device not in self._pins:
            from autotune.inductor_glue.env import current_environment

            results = self._env_results(current_environment(device))  # inside the compile: the job's config
            fused = frozenset(str(v.get("choice")) for v in self.decisions(device, FUSION_PREFIX).values()
                              if v.get("fuse") and v.get("choice")) if device == self.fusion_device else frozenset()
            self._pins[device] = (PinIndex(results, fastest_template_too=self.time_in_graph, also=fused)
                                  if results else None)
        return self._pins[device]

    # --- pointwise/reduction configs -------------------------------------------------
    def load_kernel_configs(self, device: str) -> None:
        """Write the stored configs for device into Inductor's cache dir, before any compile."""
        from autotune.inductor_glue.env import kernel_config_environment

        from . import kernel_configs

        if not self.settings.kernel_configs:
            return
        env = kernel_config_environment(device)
        configs = self._set_aside(self._call(lambda store: store.kernel_configs(env, kernel_configs.PREFIX)))
        if configs:
            try:
                self.stats.kernel_configs_loaded += kernel_configs.materialize(configs)
            except OSError as exc:
                self._disable(exc)

    def save_kernel_config(self, device: str, key: str, value: dict[str, Any]) -> None:
        """Copy one config Inductor just tuned into the store, without waiting for it."""
        from autotune.inductor_glue.env import kernel_config_environment

        self.tuned_keys.add(key)
        if self._disabled or not self.settings.write_back or self.settings.read_only:
            return
        env = kernel_config_environment(device)

        def put(store: protocols.Store) -> None:
            store.put_kernel_configs(env, {key: value})  # coordinate descent's config replaces autotuning's
            if key not in self._configs_saved:
                self._configs_saved.add(key)
                self.stats.kernel_configs_saved += 1
            if len(self.stats.saved_keys) < 64 and key not in self.stats.saved_keys:
                self.stats.saved_keys.append(key)

        self._store_later(put)

    # --- decisions Inductor takes by timing: fusion and padding verdicts ---------------
    def decisions(self, device: str, prefix: str) -> dict[str, dict[str, Any]]:
        """Every stored decision for device whose key starts with prefix (key -> value), read
        once per process. Filed with the pointwise configs: data, per device and versions."""
        from autotune.inductor_glue.env import kernel_config_environment

        if (device, prefix) not in self._decisions:
            env = kernel_config_environment(device)
            stored = self._set_aside(self._call(lambda store: store.kernel_configs(env, prefix)))
            self._decisions[device, prefix] = dict(stored or {})
        return self._decisions[device, prefix]

    def save_decision(self, device: str, prefix: str, key: str, value: dict[str, Any], counter: str | None) -> None:
        """Keep a decision Inductor just reached by timing, without waiting for the store;
        ``counter`` names the HookStats field that counts it once stored (None: counted already)."""
        from autotune.inductor_glue.env import kernel_config_environment

        self.decisions(device, prefix)[key] = value
        if self._disabled or not self.settings.write_back or self.settings.read_only:
            return
        env = kernel_config_environment(device)

        def put(store: protocols.Store) -> None:
            store.put_kernel_configs(env, {key: value})
            if counter is not None:
                setattr(self.stats, counter, getattr(self.stats, counter) + 1)

        self._store_later(put)

    def _store_later(self, work: Callable[[protocols.Store], None]) -> None:
        """Run ``work(store)`` on the writer thread (compiles never wait for it); an error
        disables the cache, as any other store error does."""
        def run() -> None:
            try:
                work(self._open())
            except Exception as exc:
                self._disable(exc)

        self.submit_write(run)

    def submit_write(self, work: Callable[[], None]) -> None:
        """Run a write on the writer thread, so compiles never wait for it (or, when writes
        are deferred, keep it for the next flush)."""
        if self._disabled:
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
            if not self._disabled:
                self._writer.submit(work)

    def flush(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until every queued write is done, deferred ones included."""
        self._release_deferred()
        try:
            self._writer.submit(lambda: None).result(timeout=timeout)
        except Exception as exc:
            self._disable(exc)

    def start_prefetch(self, trusted: TrustedKeys, device_kind: str) -> None:
        """Read ahead, on a daemon thread, what this process's compiles will ask the store for."""
        from .prefetch import Prefetch

        self.prefetch = Prefetch(open_store=self._open_patiently, disable=self._disable, stats=self.stats,
                                 device_kind=device_kind, device_name=artifact_device, trusted=trusted,
                                 max_bytes=self.settings.max_artifact_bytes, timeout=self.settings.lookup_timeout,
                                 fault=self.settings.fault_inject)
        self.prefetch.start()

    def close(self) -> None:
        self._closed = True
        if self.prefetch is not None:
            self.prefetch.close()
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
    """This rank's part in sharing one reader per node (autotune/node_share.py): local rank 0
    serves from its first install, the others connect in the background and ask it."""

    def __init__(self, policy: ServePolicy) -> None:
        from . import node_share

        self._server: node_share.NodeServer | None = None
        self._client: concurrent.futures.Future[Any] | None = None
        self._timeout = policy.settings.lookup_timeout
        self._waited = False
        role = node_share.node_role()
        if role is None:
            return
        try:
            if role.serves:
                # It ends once the node's other ranks are served (node_share.NodeServer).
                self._server = node_share.NodeServer(role.socket_path,
                                                     node_share.SharedReads(policy._open_database, role.local_world_size),
                                                     peers=role.local_world_size - 1)
            else:  # rank 0 may still be starting: connect while this rank imports and traces
                self._client = concurrent.futures.Future()
                # A daemon thread: a rank whose local rank 0 never serves must not wait for it at exit.
                threading.Thread(target=_connect_into, args=(self._client, role.socket_path, policy._open_database),
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


def artifact_device() -> str:
    """The device name artifacts are filed under (for ls and prune; keys carry their own)."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
