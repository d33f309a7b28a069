"""The warm start's prefetch: the cache's work done while the script builds its model.

``warm_start()`` starts one daemon thread that opens the store, reads every stored
winner of this device and torch version, and fetches and verifies every artifact signed
by a trusted key for this device and torch version, holding them in memory. A compile's
lookup then asks the prefetch first:

- a request or artifact it holds is served from memory, with no query;
- one it has not reached yet is waited for, bounded by the lookup timeout, and only that
  one (artifacts are fetched one by one, each announced as it is ready);
- one it does not hold falls through to the database, as without a prefetch.

What it holds is bounded by what it reads, never by what a row says of itself: a row's
``size`` and ``signer`` columns are plain data anyone with write access sets. Rows are chosen by
the environment (device, torch version, kinds a compile asks for) and by the keys this job
trusts; each payload's length is read by the database before the payload is
(``octet_length``/``length``), and one longer than what is left of ``MAX_PREFETCH_BYTES`` (or
than AUTOTUNE_MAX_ARTIFACT_BYTES) is left to the database. The budget counts the bytes actually
read, the dropped ones included, so junk rows cost at most that much I/O. Each payload's
signature is checked on this thread before it is kept: one that fails is dropped at once (only
its verdict is kept, for the artifact tier to count when torch asks for it), and the drops cost
one warning with their count.

The thread never raises into the job and never holds up exit (a daemon, asked at exit to end
at its next step and never joined: autotune/job/exit_wait.py): a store error disables
the cache with the hook's one warning, any other failure costs one warning and leaves every
lookup to the database. It only reads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.cache.errors import CacheError
from autotune.cache.records import (
    ARTIFACT_AOT_AUTOGRAD,
    ARTIFACT_CPP_KERNEL,
    ARTIFACT_DYNAMO,
    ARTIFACT_FX_GRAPH,
    ARTIFACT_TRITON_MODULE,
    STATUS_OK,
    TuningResult,
)
from autotune.cache.signing import OK

from . import exit_wait

if TYPE_CHECKING:
    from autotune.cache import protocols
    from autotune.cache.records import ArtifactInfo
    from autotune.cache.signing import TrustedKeys

    from .hook_stats import HookStats

log = logging.getLogger(__name__)

# Fetched in the order they are asked for, Triton's native modules first: a few kilobytes each, and
# one not fetched yet when asked for is built, not waited for (autotune/job/triton_modules.py). Then
# Dynamo's package before tracing, the AOTAutograd and FX graph entries before lowering, C++
# libraries when a graph is loaded or built.
KIND_ORDER = (ARTIFACT_TRITON_MODULE, ARTIFACT_DYNAMO, ARTIFACT_AOT_AUTOGRAD, ARTIFACT_FX_GRAPH, ARTIFACT_CPP_KERNEL)
# The most payload bytes held in memory; artifacts past it are fetched on demand, as without
# a prefetch (a team's cache may hold many models for one device).
MAX_PREFETCH_BYTES = 1024 * 1024 * 1024
# Fault injection (AUTOTUNE_FAULT_INJECT), for tests only: "prefetch:hold" starts the
# prefetch when a compile first asks it for something, so that compile races it;
# "prefetch:hang" never starts it, so that exit can be shown not to wait for it.
FAULT_HOLD = "prefetch:hold"
FAULT_HANG = "prefetch:hang"


@dataclass(frozen=True)
class HeldArtifact:
    """An artifact the prefetch fetched and checked: the signature's verdict, and the payload
    only when that verdict is OK (a payload that fails is never held)."""

    payload: bytes
    verdict: str
    signer: str | None

    @property
    def trusted(self) -> bool:
        return self.verdict == OK


class Prefetch:
    """One background read of what this process's compiles will ask the store for.

    It reaches the store through the job's store client (store_client.py): ``open_store`` is its
    ``open_patiently`` and ``disable`` its ``disable``, taken as plain callables so that a test
    can hand it any store."""

    def __init__(self, *, open_store: Callable[[], protocols.Store], disable: Callable[[BaseException], None],
                 stats: HookStats, device_kind: str, device_name: Callable[[], str], trusted: TrustedKeys,
                 max_bytes: int, timeout: float, fault: str = "") -> None:
        self._open_store, self._disable, self.stats = open_store, disable, stats
        # The GPU's name is read on the thread: it starts CUDA, which the job's thread need not wait for.
        self._device_kind, self._device_name = device_kind, device_name
        self._artifact_device = ""  # the device name artifacts are filed under ("cpu" on CPU)
        self._trusted, self._max_bytes, self._timeout, self._fault = trusted, max_bytes, timeout, fault
        self._rows: dict[tuple[str, str], TuningResult] = {}  # (env key, request key) -> stored result
        self._rows_by_env: dict[str, list[TuningResult]] = {}  # env key -> its results of status ok
        self._torch_version = ""
        self._rows_held = False  # True once every row of this device and torch version is in memory
        self._rows_clean = False  # and none of them failed validation
        self._rows_ready = threading.Event()
        self._listed: set[tuple[str, str]] = set()  # (kind, key) the prefetch will fetch
        self._artifacts: dict[tuple[str, str], HeldArtifact | None] = {}  # None: fetched, not held
        self._artifacts_listed = threading.Event()
        self._artifact_ready = threading.Condition()
        self._asked = threading.Event()  # a compile asked for something (FAULT_HOLD waits for it)
        self._done = threading.Event()
        self._closed = False
        self._abandoned = False  # a wait timed out: later lookups no longer wait for the prefetch
        self.bytes_read = 0  # payload bytes read from the store, kept or not (MAX_PREFETCH_BYTES)
        self.bytes_held = 0  # payload bytes kept: verified ones only
        self.dropped: dict[str, int] = {}  # verdict -> artifacts read whose signature failed
        self._wait_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="autotune-prefetch", daemon=True)

    def start(self) -> None:
        self._thread.start()
        exit_wait.stop_at_exit(self._thread, stop=self.close)  # it ends at its next step; exit never waits

    def close(self) -> None:
        """Drop what is held; the thread, if still running, stops at its next step."""
        self._closed = True
        with self._artifact_ready:
            self._artifacts.clear()
            self._artifact_ready.notify_all()
        self._rows.clear()
        self._rows_by_env.clear()
        self._release_waiters()

    def wait_done(self, timeout: float) -> bool:
        """Whether the prefetch ended within ``timeout`` s (tests and benchmarks)."""
        return self._done.wait(timeout)

    # --- what compiles ask ---------------------------------------------------------
    def result(self, env_key: str, request_key: str) -> TuningResult | None:
        """The stored result of a request, if the prefetch holds it (after waiting for the rows)."""
        self._wait(self._rows_ready, self._timeout)
        return self._rows.get((env_key, request_key)) if self._rows_held else None

    def env_results(self, env_key: str, device_kind: str) -> list[TuningResult] | None:
        """Every stored ok result of an environment, or None when the prefetch did not read
        that environment's device (the caller asks the database)."""
        self._wait(self._rows_ready, self._timeout)
        if not self._rows_held or not self._rows_clean or device_kind != self._device_kind:
            return None  # a malformed row is left to the store's listing, which names it
        return list(self._rows_by_env.get(env_key, ()))

    def artifact(self, kind: str, key: str) -> HeldArtifact | None:
        """The artifact under (kind, key) once fetched and checked, waiting only for it; None when
        the prefetch does not hold it (the caller fetches it from the database)."""
        self._wait(self._artifacts_listed, self._timeout)
        wanted = (kind, key)
        if wanted not in self._listed:
            return None
        with self._artifact_ready:
            if wanted not in self._artifacts and not self._abandoned and not self._on_prefetch_thread():
                self._count_wait(lambda: self._artifact_ready.wait_for(
                    lambda: wanted in self._artifacts or self._done.is_set(), self._timeout))
            return self._artifacts.get(wanted)

    def settled(self, kind: str, key: str) -> bool:
        """Whether ``artifact(kind, key)`` would answer now, without waiting for the prefetch."""
        if self._done.is_set() or self._abandoned:
            return True
        if not self._artifacts_listed.is_set():
            return False
        return (kind, key) not in self._listed or (kind, key) in self._artifacts

    # --- waiting -------------------------------------------------------------------------
    def _on_prefetch_thread(self) -> bool:
        return threading.current_thread() is self._thread  # it never waits for itself

    def _wait(self, event: threading.Event, timeout: float) -> None:
        if event.is_set() or self._abandoned or self._on_prefetch_thread():
            return
        self._count_wait(lambda: event.wait(timeout))

    def _count_wait(self, wait: Callable[[], bool]) -> None:
        """Wait, counted in the stats; a wait that times out ends all waiting for the prefetch
        (a stalled prefetch costs one lookup timeout, not one per lookup)."""
        self._asked.set()
        began = time.perf_counter()
        ready = False
        try:
            ready = wait()
        finally:
            with self._wait_lock:
                self.stats.prefetch_waits += 1
                self.stats.prefetch_wait_s += time.perf_counter() - began
                if not ready:
                    self._abandoned = True

    def _release_waiters(self) -> None:
        self._rows_ready.set()
        self._artifacts_listed.set()
        self._done.set()
        with self._artifact_ready:
            self._artifact_ready.notify_all()

    # --- the background work --------------------------------------------------------------
    def _run(self) -> None:
        began = time.perf_counter()
        try:
            if self._fault == FAULT_HANG:
                threading.Event().wait()
            if self._fault == FAULT_HOLD:
                self._asked.wait()
            # Closed by an uninstall or at exit: nothing is left to read for. At exit this thread
            # is mostly in _open_store, waiting for the store's imports (which the exit joins).
            if self._closed:
                return
            store = self._open_store()
            if self._closed:
                return
            self._read_rows(store)
            self._fetch_artifacts(store)
        except CacheError as exc:  # the database is down or refused us: as a failed lookup would
            if not self._closed:  # an uninstall closed the store under it: nothing failed
                self._disable(exc)
        except Exception as exc:  # noqa: BLE001 - a bug here must cost one warning, never the job
            if not self._closed:
                log.warning("autotune: the prefetch failed (%s: %s); lookups go to the database",
                            type(exc).__name__, exc)
        finally:
            self.stats.prefetch_s = time.perf_counter() - began
            self._release_waiters()

    def _read_rows(self, store: protocols.Store) -> None:
        import torch

        self._torch_version = torch.__version__
        self._artifact_device = self._device_name()
        listing = store.list_results(device=self._artifact_device if self._device_kind == "cuda" else "cpu")
        for _, result in listing:
            env = result.env
            if env.device_kind != self._device_kind or env.torch_version != self._torch_version:
                continue
            self._rows[env.key, result.request.key] = result
            if result.status == STATUS_OK:
                self._rows_by_env.setdefault(env.key, []).append(result)
        # Malformed rows are left to the store: a lookup of one, or a listing with one, reads it
        # again there and warns once for each, as without a prefetch.
        self._rows_clean = not listing.malformed
        self.stats.prefetched_rows = len(self._rows)
        self._rows_held = not self._closed
        self._rows_ready.set()

    def _fetch_artifacts(self, store: protocols.Store) -> None:
        wanted = self._artifacts_to_fetch(store) if self._trusted else []
        self._listed = {(info.kind, info.key) for info in wanted}
        self._artifacts_listed.set()
        try:
            for info in wanted:
                if self._closed:
                    return
                held = self._fetch_one(store, info)
                with self._artifact_ready:
                    self._artifacts[info.kind, info.key] = held
                    self._artifact_ready.notify_all()
                if held is not None and held.trusted:
                    self.stats.prefetched_artifacts += 1
        finally:
            self._warn_dropped()

    def _artifacts_to_fetch(self, store: protocols.Store) -> list[ArtifactInfo]:
        """Artifacts of this device and torch version whose row names a trusted key, in the order
        compiles ask for them. The row's signer only narrows the listing (the signature is checked
        on the payload), and its size only skips a row that says it is too large: the budget is
        kept on the bytes read (``_fetch_one``)."""
        infos: list[ArtifactInfo] = []
        for signer in self._trusted.fingerprints:
            listing = store.artifacts(device=self._artifact_device, signer=signer, limit=None)
            infos += [i for i in listing
                      if i.torch_version == self._torch_version and i.kind in KIND_ORDER and i.size <= self._max_bytes]
        infos.sort(key=lambda i: (KIND_ORDER.index(i.kind), i.id))
        return infos

    def _fetch_one(self, store: protocols.Store, info: ArtifactInfo) -> HeldArtifact | None:
        """The artifact, checked; None for one that is gone, malformed or longer than what is
        left of the budget (the database reads its length first and leaves such a payload
        unread); a lookup of it goes to the database, which says why."""
        from autotune.cache.errors import MalformedRow

        left = MAX_PREFETCH_BYTES - self.bytes_read
        if left <= 0:
            return None
        try:
            stored = store.get_artifact(info.kind, info.key, min(self._max_bytes, left))
        except MalformedRow:
            return None
        if stored is None:
            return None
        self.bytes_read += len(stored.payload)
        verdict = self._trusted.verify(info.kind, info.key, stored.payload, stored.signature, stored.public_key)
        if verdict != OK:  # dropped here: only the verdict is kept, for the tier to count
            self.dropped[verdict] = self.dropped.get(verdict, 0) + 1
            return HeldArtifact(b"", verdict, stored.signer)
        self.bytes_held += len(stored.payload)
        return HeldArtifact(stored.payload, verdict, stored.signer)

    def _warn_dropped(self) -> None:
        """One warning for every artifact whose signature failed, with their count."""
        if not self.dropped or self._closed:
            return
        verdicts = ", ".join(f"{n} {verdict.replace('_', ' ')}" for verdict, n in sorted(self.dropped.items()))
        log.warning("autotune: rejected %d stored artifacts whose signature did not verify (%s); they are "
                    "compiled instead. List them with `autotune cache ls --artifacts`; trust their signer with "
                    "AUTOTUNE_TRUSTED_KEYS if you mean to", sum(self.dropped.values()), verdicts)
