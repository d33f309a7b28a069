"""The warm-start hook: torch.compile reads winners from the cache.

``warm_start()`` installs a selector whose lookups are answered from the SQL
cache. A hit hands Inductor the stored timing of every candidate, so nothing is
compiled or benchmarked and Inductor picks the stored winner. A miss falls back
(by ``on_miss``), is written back, and is logged for the next sweep.

The cache must never fail a job: every store call runs with a bounded timeout,
and the first error disables the cache for the process with one warning, after
which compiles behave like plain max-autotune.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import socket
import threading
from dataclasses import asdict, dataclass
from typing import Any, Callable

from cache.records import (
    STATUS_OK,
    Environment,
    Provenance,
    TuningRequest,
    TuningResult,
)

from .inductor import (
    Benchmark,
    ObservedRequest,
    Timings,
    choice_hash,
    describe_choice,
    install,
    uninstall,
)
from .plan import shape_summary
from .settings import Settings

log = logging.getLogger(__name__)


class CacheMissError(RuntimeError):
    """Raised with on_miss="error": the cache does not cover a request."""


@dataclass
class HookStats:
    hits: int = 0
    misses: int = 0
    written: int = 0
    errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __str__(self) -> str:
        return f"hits={self.hits} misses={self.misses} written={self.written} errors={self.errors}"


class ServePolicy:
    """Answers lookups from the store, with Inductor's own behaviour as the fallback."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stats = HookStats()
        self._store: Any = None
        self._disabled = False
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="autotune-cache")
        self._logged_misses: set[str] = set()  # request keys

    # --- store access, bounded and never raising ---------------------------------
    def _call(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(store)`` with the lookup timeout; on any failure disable the cache."""
        if self._disabled:
            return None
        try:
            future = self._pool.submit(lambda: fn(self._open()))
            return future.result(timeout=self.settings.lookup_timeout)
        except Exception as exc:
            self._disable(exc)
            return None

    def _open(self) -> Any:
        with self._lock:
            if self._store is None:
                from cache.store import Store

                self._store = Store(self.settings.cache, read_only=self.settings.read_only,
                                    connect_timeout=self.settings.lookup_timeout)
            return self._store

    def _disable(self, exc: BaseException) -> None:
        self.stats.errors += 1
        if not self._disabled:
            self._disabled = True
            reason = "timed out" if isinstance(exc, concurrent.futures.TimeoutError) else f"{type(exc).__name__}: {exc}"
            message = f"autotune: kernel cache unavailable ({reason}); compiling as plain max-autotune"
            log.warning(message)

    # --- the lookup ----------------------------------------------------------------
    def lookup(self, request: ObservedRequest, choices: list[Any], benchmark: Benchmark | None,
               default: Callable[[], Timings]) -> Timings:
        # Key and environment once per lookup: the miss path needs them again.
        plain, env = request.to_request(), self._env(request)
        try:
            answer = self._answer_from_cache(env, plain, choices)
        except Exception as exc:  # a bug here must not break the compile either
            self._disable(exc)
            answer = None
        if answer is not None:
            if benchmark is not None:
                self.stats.hits += 1
            return answer
        return self._miss(env, plain, choices, benchmark, default)

    def _env(self, request: ObservedRequest) -> Environment:
        from .env import current_environment

        device = request.inputs[0].device if request.inputs else "cpu"
        return current_environment(device)

    def _answer_from_cache(self, env: Environment, request: TuningRequest, choices: list[Any]) -> Timings | None:
        stored: TuningResult | None = self._call(lambda store: store.lookup(env, request.key))
        if stored is None or stored.status != STATUS_OK:
            return None
        times = stored.timings()
        if any(choice_hash(c) not in times for c in choices):
            return None  # a candidate the sweep never saw: the answer may be wrong
        return {c: times[choice_hash(c)] for c in choices}

    def _miss(self, env: Environment, request: TuningRequest, choices: list[Any], benchmark: Benchmark | None,
              default: Callable[[], Timings]) -> Timings:
        from torch._inductor import select_algorithm as sa

        if benchmark is not None or self.settings.on_miss != "tune":
            self._log_miss(env, request)
        on_miss = self.settings.on_miss
        if on_miss == "error" and not self._disabled:
            raise CacheMissError(
                f"autotune: the cache has no result for {shape_summary(request)} "
                f"(inputs_key {request.inputs_key}); run `autotune sweep` for this model"
            )
        if on_miss == "aten":
            aten = [c for c in choices if isinstance(c, sa.ExternKernelCaller)]
            fastest = aten[0] if aten else choices[0]
            return {c: (0.0 if c is fastest else math.inf) for c in choices}
        timings = default()
        if benchmark is not None and timings and len(timings) == len(choices):
            self._write_back(env, request, choices, timings)
        return timings

    def _log_miss(self, env: Environment, request: TuningRequest) -> None:
        if request.key in self._logged_misses:
            return  # Inductor may look the same request up twice (precompile check, then tuning)
        self._logged_misses.add(request.key)
        self.stats.misses += 1
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

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        if self._store is not None:
            try:
                self._store.close()
            except Exception:
                pass


class WarmStart:
    """The handle ``warm_start()`` returns: stats, uninstall, and a context manager."""

    def __init__(self, policy: ServePolicy) -> None:
        from torch._inductor import config

        from .env import pin_triton_toolchain

        pin_triton_toolchain()  # the same Triton backend hash as the sweep's workers
        self._policy = policy
        self._selector = install(policy)
        # The sweep chose winners without benchmarking epilogue fusions (which happen
        # in the scheduler, outside any lookup); do the same so a hit benchmarks nothing.
        self._saved_config = {"benchmark_epilogue_fusion": config.benchmark_epilogue_fusion}
        config.benchmark_epilogue_fusion = False
        self.installed = True

    @property
    def stats(self) -> HookStats:
        return self._policy.stats

    @property
    def settings(self) -> Settings:
        return self._policy.settings

    def uninstall(self) -> None:
        global _active
        if not self.installed:
            return
        from torch._inductor import config

        uninstall(self._selector)
        for key, value in self._saved_config.items():
            setattr(config, key, value)
        self._policy.close()
        self.installed = False
        if _active is self:
            _active = None

    def __enter__(self) -> WarmStart:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def __repr__(self) -> str:
        return f"WarmStart({self.stats}, installed={self.installed})"


_active: WarmStart | None = None


def warm_start(
    cache: str | None = None,
    *,
    on_miss: str = "tune",
    write_back: bool = True,
    read_only: bool = False,
    settings: Settings | None = None,
) -> WarmStart:
    """Serve every later torch.compile autotune request in this process from the cache.

    ``cache`` is a database URL (None: ``AUTOTUNE_CACHE`` or the embedded SQLite
    file). ``on_miss`` is "tune" (benchmark as usual), "aten" (take ATen without
    benchmarking) or "error" (raise, naming the request). A second call replaces
    the first. Nothing here connects to the database: the first lookup does, so
    a cache that is down costs one warning, never the job.
    """
    global _active
    base = settings or Settings.from_env()
    settings = base.replace(cache=cache, on_miss=on_miss, write_back=write_back,
                            read_only=read_only or base.read_only)
    if _active is not None:
        _active.uninstall()
    _active = WarmStart(ServePolicy(settings))
    return _active
