"""The sweep's queue: capture -> plan -> **queue** -> workers -> cache.

Jobs go in as capture finds them (from every model of the sweep, de-duplicated)
and the pool takes them out as actors free up. Each job is leased in the cache
database (``cache/leases.py``) before it goes out, so sweeps that share a
database split the work instead of repeating it: a job another live sweep holds
waits and is asked for again; one that sweep finished meanwhile is skipped; one
whose holder died (lease expired) is taken over.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field

from autotune.cache.errors import CacheError, one_line
from autotune.cache.leases import CLAIMED, DONE, Heartbeat, LeaseKey, Leases
from autotune.cache.records import TuningResult
from autotune.workers.jobs import TuneJob

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0  # how often a job leased by another sweep is asked for again


def lease_key(job: TuneJob) -> LeaseKey:
    return (job.expected_env.key if job.expected_env else "", job.request.key)


@dataclass
class SweepQueue:
    """Thread-safe: capture puts from the main thread, the pool takes from its own."""

    leases: Leases | None = None  # None: no other sweep to coordinate with (read-only, or off)
    retry_seconds: float = RETRY_SECONDS
    # Hand nothing out before close(): on CPU a benchmark running beside the capture's
    # compile times the contention, not the kernel (GPU benchmarks time the GPU).
    hold_until_closed: bool = False
    elsewhere: list[TuneJob] = field(default_factory=list)  # done by another sweep meanwhile

    def __post_init__(self) -> None:
        # (-priority, order, job): the highest priority first, and in the order put among equals.
        self._pending: list[tuple[float, int, TuneJob]] = []
        self._order = itertools.count()
        self._waiting: list[tuple[float, TuneJob]] = []  # (when to ask again, job)
        self._keys: set[LeaseKey] = set()
        self._closed = False
        self._lock = threading.Lock()
        self._heartbeat = Heartbeat(self.leases) if self.leases is not None else None

    def put(self, job: TuneJob, priority: float = 0.0) -> bool:
        """Add a job unless the same request (same environment) is queued already. Jobs of a
        higher ``priority`` go out first: the sweep gives a training step's requests more, as
        its end-to-end pass, which waits for them, is the longest chain of the sweep."""
        key = lease_key(job)
        with self._lock:
            if key in self._keys:
                return False
            self._keys.add(key)
            heapq.heappush(self._pending, (-priority, next(self._order), job))
            return True

    def close(self) -> None:
        """No more jobs will be put (capture is over)."""
        with self._lock:
            self._closed = True

    def __len__(self) -> int:
        return len(self._keys)

    # ------------------------------------------------------------ JobSource

    def take(self) -> TuneJob | None:
        with self._lock:
            if self.hold_until_closed and not self._closed:
                return None
            now = time.monotonic()
            due = [job for when, job in self._waiting if when <= now]
            self._waiting = [(when, job) for when, job in self._waiting if when > now]
            for i, job in enumerate(due):
                if self._claim(job, now):
                    self._waiting += [(now, rest) for rest in due[i + 1:]]
                    return job
            while self._pending:
                job = heapq.heappop(self._pending)[2]
                if self._claim(job, now):
                    return job
            return None

    def exhausted(self) -> bool:
        with self._lock:
            return self._closed and not self._pending and not self._waiting

    def left(self) -> list[TuneJob]:
        """Jobs never handed out (a sweep that stopped early reports them as not run)."""
        with self._lock:
            return [job for _, _, job in sorted(self._pending)] + [job for _, job in self._waiting]

    def finished(self, job: TuneJob, result: TuningResult) -> None:
        if self.leases is not None:
            try:
                self.leases.release(lease_key(job), result.status)
            except Exception as exc:  # the result is stored; the lease just expires later
                log.warning("could not release the lease on %s (%s); it expires by itself", job.request.op,
                            one_line(exc))
                log.debug("lease release failed", exc_info=True)

    def retry(self, job: TuneJob) -> None:
        with self._lock:  # first of all: still leased by this sweep (the heartbeat keeps it)
            heapq.heappush(self._pending, (-float("inf"), next(self._order), job))

    def stop(self) -> None:
        """At the sweep's end: stop renewing, and give back anything still held."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self.leases is not None and self.leases.held:
            try:
                self.leases.release_all()
            except Exception as exc:
                log.warning("could not give back the sweep's leases (%s); they expire by themselves", one_line(exc))
                log.debug("lease release failed", exc_info=True)

    def _claim(self, job: TuneJob, now: float) -> bool:
        """Lease the job (lock held); a job leased elsewhere waits, one done elsewhere is dropped."""
        if self.leases is None:
            return True
        try:
            state = self.leases.claim(lease_key(job))
        except CacheError as error:  # tune it anyway: its result's write will say what is wrong
            log.warning("could not lease %s (%s); tuning it without a lease", job.request.op, error)
            return True
        if state == CLAIMED:
            return True
        if state == DONE:
            self.elsewhere.append(job)
        else:
            self._waiting.append((now + self.retry_seconds, job))
        return False
