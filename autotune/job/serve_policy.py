"""How the warm-start hook answers Inductor's lookups: from the store (through the prefetch, or
the store client: the node's share or the database, each call bounded by a timeout), with
Inductor's own behaviour as the fallback. It keeps the decisions (what to serve, what counts as a
miss); reading and writing the store is its client's (store_client.py). ``autotune/job/hook.py``
installs it into Inductor and counts its work (hook_stats.py)."""

from __future__ import annotations

import contextlib
import logging
import math
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

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
from autotune.settings import Settings
from autotune.shapes import shape_summary

from .hook_stats import MISSES_LISTED, CacheMissError, HookStats, missed_entry
from .store_client import StoreClient

if TYPE_CHECKING:
    from .nearest import NearestIndex
    from .prefetch import Prefetch

log = logging.getLogger(__name__)

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
        # Every read and write of the store goes through it; the policy decides what to ask.
        self.store = StoreClient(settings, self.stats, defer_writes=defer_writes)
        # The sweep's end-to-end pass: hits are timed in this process and stored as verdicts.
        self.time_in_graph = time_in_graph
        self.served = 0  # stored answers given (compile_retry.py: did this graph use the cache?)
        self._aten_only = False  # answering every lookup with ATen: a graph's compile again
        # Pointwise/reduction kernels Inductor tuned in this process (saved, not served), by key.
        self.tuned_keys: set[str] = set()
        self._configs_saved: set[str] = set()  # keys stored so far (read and written on the writer thread only)
        self._verdicts: set[str] = set()  # request keys timed here
        self._logged_misses: set[str] = set()  # request keys
        self._warned_winners: set[str] = set()  # request keys whose winner was not generated
        self._warned_timings: set[str] = set()  # request keys whose stored timings serve no choice
        self._pins: dict[str, PinIndex | None] = {}  # device type -> stored winners
        self._results: dict[str, list[TuningResult]] = {}  # environment key -> its stored results
        self._nearest: dict[str, NearestIndex] = {}  # environment key -> its stored winners by shape
        self._served_nearest: set[str] = set()  # request keys
        self._decisions: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}  # (device, prefix) -> key -> value
        self.fusion_device: str | None = None  # the GPU whose fusion verdicts are served (WarmStart)
        self.prefetch: Prefetch | None = None  # what the store holds for this process, read ahead (WarmStart)

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
            self.store.disable(exc)
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
            self.store.malformed_row(stored)
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
        if self.prefetch is not None and not self.store.disabled:
            held = self.prefetch.result(env.key, key)
            if held is not None:
                return held
        return self.store.call(lambda store: or_malformed(lambda: store.lookup(env, key)))

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
                self.store.write_later(lambda store: store.put_result(found.result))
        return timings

    def _miss(self, env: Environment, request: TuningRequest, choices: list[Any], benchmark: Benchmark | None,
              default: Callable[[], Timings]) -> Timings:
        if benchmark is not None or self.settings.on_miss != "tune":
            self._log_miss(env, request)
        on_miss = self.settings.on_miss
        if on_miss == "error" and not self.store.disabled:
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
        """The nearest swept shape's kind of kernel, without benchmarking (see autotune/job/nearest.py)."""
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
            if held is not None and not self.store.disabled:
                self._results[env.key] = held
            else:
                self._results[env.key] = self.store.set_aside(self.store.call(lambda store: store.results_for_env(env))) or []
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
        self.store.call(lambda store: store.record_miss(env, request, host=socket.gethostname()))

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
        self.store.call(lambda store: store.put_result(result))
        if not self.store.disabled:
            self.stats.written += 1

    # --- pinning: which Triton configs are generated at all ------------------------
    def allow_template(self, pin: Pin) -> bool | Pin:
        """Generate a Triton config unless a stored result says it lost; in the place of the
        first that lost, its family's stored winner where this compile's config list lacks it
        (an exhaustive search's winner: ``PinIndex.instead``)."""
        if not self.settings.pin or self.store.disabled:
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
        configs = self.store.set_aside(self.store.call(lambda store: store.kernel_configs(env, kernel_configs.PREFIX)))
        if configs:
            try:
                self.stats.kernel_configs_loaded += kernel_configs.materialize(configs)
            except OSError as exc:
                self.store.disable(exc)

    def save_kernel_config(self, device: str, key: str, value: dict[str, Any]) -> None:
        """Copy one config Inductor just tuned into the store, without waiting for it."""
        from autotune.inductor_glue.env import kernel_config_environment

        self.tuned_keys.add(key)
        if self.store.disabled or not self.settings.write_back or self.settings.read_only:
            return
        env = kernel_config_environment(device)

        def put(store: protocols.Store) -> None:
            store.put_kernel_configs(env, {key: value})  # coordinate descent's config replaces autotuning's
            if key not in self._configs_saved:
                self._configs_saved.add(key)
                self.stats.kernel_configs_saved += 1
            if len(self.stats.saved_keys) < 64 and key not in self.stats.saved_keys:
                self.stats.saved_keys.append(key)

        self.store.write_later(put)

    # --- decisions Inductor takes by timing: fusion and padding verdicts ---------------
    def decisions(self, device: str, prefix: str) -> dict[str, dict[str, Any]]:
        """Every stored decision for device whose key starts with prefix (key -> value), read
        once per process. Filed with the pointwise configs: data, per device and versions."""
        from autotune.inductor_glue.env import kernel_config_environment

        if (device, prefix) not in self._decisions:
            env = kernel_config_environment(device)
            stored = self.store.set_aside(self.store.call(lambda store: store.kernel_configs(env, prefix)))
            self._decisions[device, prefix] = dict(stored or {})
        return self._decisions[device, prefix]

    def save_decision(self, device: str, prefix: str, key: str, value: dict[str, Any], counter: str | None) -> None:
        """Keep a decision Inductor just reached by timing, without waiting for the store;
        ``counter`` names the HookStats field that counts it once stored (None: counted already)."""
        from autotune.inductor_glue.env import kernel_config_environment

        self.decisions(device, prefix)[key] = value
        if self.store.disabled or not self.settings.write_back or self.settings.read_only:
            return
        env = kernel_config_environment(device)

        def put(store: protocols.Store) -> None:
            store.put_kernel_configs(env, {key: value})
            if counter is not None:
                setattr(self.stats, counter, getattr(self.stats, counter) + 1)

        self.store.write_later(put)
    def start_prefetch(self, trusted: TrustedKeys, device_kind: str) -> None:
        """Read ahead, on a daemon thread, what this process's compiles will ask the store for."""
        from .prefetch import Prefetch

        self.prefetch = Prefetch(open_store=self.store.open_patiently, disable=self.store.disable, stats=self.stats,
                                 device_kind=device_kind, device_name=artifact_device, trusted=trusted,
                                 max_bytes=self.settings.max_artifact_bytes, timeout=self.settings.lookup_timeout,
                                 fault=self.settings.fault_inject)
        self.prefetch.start()

    def close(self) -> None:
        self.store.closing()
        if self.prefetch is not None:
            self.prefetch.close()
        self.store.close()


def artifact_device() -> str:
    """The device name artifacts are filed under (for ls and prune; keys carry their own)."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
