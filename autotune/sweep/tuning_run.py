"""Tuning, as the sweep runs it: the queue, Ray's pool started in the background (before capture,
so that its start-up overlaps capture), a feeder thread from the queue to the pool, and the
results taken into the report as they arrive.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from autotune.cache.records import TuningResult
from autotune.settings import Settings

from .context import SweepContext
from .report import STATUS_ELSEWHERE, STATUS_NOT_RUN, Outcome

if TYPE_CHECKING:  # Ray only with sweeps that tune
    from autotune.workers.pool import PoolStarter, TuningPool
    from autotune.workers.spares import Spares

    from .queue import SweepQueue


def joins_cluster(settings: Settings) -> bool:
    """The sweep tunes on a Ray cluster it joins (--address, RAY_ADDRESS), not a local one."""
    return bool(settings.address or os.environ.get("RAY_ADDRESS"))


def _start_pool(store: Any, device: str, settings: Settings, began: float, jobs: int | None = None,
                spares: str | None = None) -> PoolStarter:
    """Start Ray and the pool in the background; before capture the job count is not
    known (``jobs`` None), so the pool gets every actor the settings allow."""
    from autotune.workers.pool import PoolStarter

    # CUDA: --gpus, or None for every GPU Ray sees (counted once Ray is up). CPU benchmarks
    # would time each other's compiles, so a CPU actor holds one job at a time.
    actors = settings.gpus if device == "cuda" else settings.workers
    lanes = settings.jobs_per_gpu if device == "cuda" else 1
    return PoolStarter(settings.address, store, device, actors, settings.request_timeout, began, jobs, lanes, spares,
                       fault=settings.fault_inject, log_path=settings.log)


class _Dispatcher:
    """Feeds the queue to the pool in a thread, while capture still fills the queue."""

    def __init__(self, starter: PoolStarter, queue: SweepQueue, on_answer: Callable[[str], None]) -> None:
        """``on_answer`` gets each request key as its result arrives, on this thread: a pass
        waiting for that model's GEMMs may start while capture is still going on."""
        import queue as queue_module

        self.starter, self.queue, self.on_answer = starter, queue, on_answer
        self.results: queue_module.Queue[TuningResult | None] = queue_module.Queue()
        self.pool: TuningPool | None = None
        self.error: BaseException | None = None
        self.began: float | None = None
        threading.Thread(target=self._run, name="autotune-dispatch", daemon=True).start()

    def _run(self) -> None:
        try:
            self.pool = self.starter.pool()  # raises what the start raised (e.g. WorkerError)
            self.began = time.perf_counter()
            for result in self.pool.run(self.queue):
                self.results.put(result)
                self.on_answer(result.request.key)
        except BaseException as exc:  # handed to the sweep's thread by outcomes()
            self.error = exc
        finally:
            self.results.put(None)

    def outcomes(self) -> Iterator[Outcome]:
        while (result := self.results.get()) is not None:
            node = self.pool.placements.get(result.request.key) if self.pool else None
            stored = self.pool is None or result.request.key not in self.pool.unstored
            yield Outcome(result.request, result.status, result, node, stored=stored)
        if self.error is not None:
            raise self.error


class TuningRun:
    """One sweep's queue and pool: started early, fed while capture goes on, closed with the sweep."""

    def __init__(self, ctx: SweepContext, spares: Spares | None = None) -> None:
        self.ctx, self.spares = ctx, spares
        self.starter: PoolStarter | None = None
        self.dispatcher: _Dispatcher | None = None

    def check_ray(self) -> None:
        """Before capture: Ray is there, and a wrong --address fails in seconds."""
        from autotune.workers.cluster import check_address
        from autotune.workers.pool import require_ray

        require_ray()  # imported by now by Ray's early start, if that began
        check_address(self.ctx.settings.address)

    def start(self, pool_now: bool) -> None:
        """The queue, and (``pool_now``) the pool and its feeder, started before capture so that
        Ray's, the actors' and the children's start-up overlap it."""
        from .queue import SweepQueue

        ctx = self.ctx
        leases = None if ctx.settings.read_only else ctx.store.leases(seconds=ctx.settings.lease_seconds)
        ctx.queue = SweepQueue(leases, hold_until_closed=ctx.device != "cuda")
        if pool_now:
            self.ensure_pool()

    def ensure_pool(self) -> None:
        if self.dispatcher is None:
            assert self.ctx.queue is not None
            spares = self.spares.directory if self.spares is not None else None
            self.starter = _start_pool(self.ctx.store, self.ctx.device, self.ctx.settings, self.ctx.started,
                                       spares=spares)
            self.dispatcher = _Dispatcher(self.starter, self.ctx.queue, self.ctx.readiness.answered)

    def tune(self, passes_beside: Callable[[], int]) -> None:
        """Close the queue and take every result into the report. ``passes_beside``, called once
        the pool is starting, readies the end-to-end pass and says how many of its passes run
        beside tuning (they count in the progress too)."""
        queue = self.ctx.queue
        assert queue is not None
        queue.close()
        if len(queue) == 0:
            return
        self.ensure_pool()
        passes = passes_beside()
        self._start_progress(len(queue), passes)
        assert self.dispatcher is not None
        try:
            for outcome in self.dispatcher.outcomes():
                self.ctx.mark("first_result")
                outcome.model = self.ctx.found_in.get(outcome.request.key)
                self.ctx.report.outcomes.append(outcome)
                self.ctx.progress.advance(outcome)
        finally:
            self.ctx.readiness.release()  # however tuning ended, no pass waits for it any longer
        self.ctx.mark("last_result")
        self._report(queue)

    def _start_progress(self, requests: int, passes: int) -> None:
        ctx = self.ctx
        assert self.starter is not None
        where = f" at {ctx.settings.address}" if ctx.settings.address else " locally"
        lanes = f", {ctx.settings.jobs_per_gpu} at once per GPU" if ctx.device == "cuda" else ""
        ctx.progress.stage(f"starting the workers for {requests} request(s) on Ray{where}{lanes}")
        pool = self.starter.pool()  # waits for the start if it is still going; raises its WorkerError
        kind = "GPU" if ctx.device == "cuda" else "CPU"
        description = f"tuning {requests} request(s) on {max(1, min(len(pool.slots), requests))} {kind} worker(s)"
        if passes:
            description += f", and {passes} end-to-end pass(es) as their models' GEMMs are answered"
        ctx.progress.start(requests + passes, description)

    def _report(self, queue: SweepQueue) -> None:
        """Tuning's times, milestones and counts in the report, and what it left to do."""
        assert self.dispatcher is not None and self.starter is not None
        report, found_in, pool = self.ctx.report, self.ctx.found_in, self.dispatcher.pool
        began = self.dispatcher.began or time.perf_counter()
        report.tuning_seconds = time.perf_counter() - began
        report.startup_seconds = self.starter.ready_seconds or 0.0
        for milestone, seconds in dict(self.starter.milestones).items():  # a copy: its thread may still write
            report.mark(milestone, seconds)
        report.requeued = pool.requeued if pool else 0
        report.adopted = pool.adopted if pool else 0
        report.outcomes += [Outcome(job.request, STATUS_ELSEWHERE, model=found_in.get(job.request.key))
                            for job in queue.elsewhere]
        report.store_error = pool.store_error if pool else None
        if report.store_error is not None:
            # Stopped at the first result the cache refused: what was not started stays to do.
            report.outcomes += [Outcome(job.request, STATUS_NOT_RUN, model=found_in.get(job.request.key))
                                for job in queue.left()]

    def close(self) -> None:
        if self.ctx.queue is not None:
            self.ctx.queue.close()
            self.ctx.queue.stop()
        if self.starter is not None:  # also when nothing is left to tune: the early pool goes unused
            self.starter.close()
        if self.spares is not None:  # those no actor claimed
            self.spares.close()
