"""Run tuning jobs on Ray actors and stream results back as they finish.

Like kernel_tuner's parallel runner: one actor per GPU (``num_gpus=1``, so each
sees its GPU as device 0), or ``workers`` actors on CPU. A CPU actor holds one job
at a time; a GPU actor holds ``lanes`` (``--jobs-per-gpu``), each in a tuning child
of its own, so that one request compiles its candidates on the CPU while another's
are timed on the GPU (the timings take turns: inductor_glue/gpu_lock.py). A job that
crashes or hangs its tuning child comes back from the actor as a failed result.
Should the actor itself die (its node lost), its jobs go back to the queue for
another actor (at most MAX_JOB_RETRIES times each), and Ray restarts the actor
wherever there is room; one that stops answering is killed after the timeout, its
job recorded as failed and its other lanes' jobs re-queued.
"""

from __future__ import annotations

# Imported before start_ray_soon's thread can fork: this module registers a before-fork
# acquire and an after-fork release of its lock. Imported for the first time by the main
# thread (torch's imports) while Ray's thread was forking a process with a preexec_fn, it
# added the release between the two, and the fork printed "release unlocked lock" with a
# traceback into a sweep's output.
import concurrent.futures.thread  # noqa: F401
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from autotune.cache.records import TuningResult

from .actor import STORE_ERROR_KEY, TuningWorker, store_result
from .cluster import check_address
from .errors import WorkerError
from .jobs import TuneJob, failed_result

if TYPE_CHECKING:
    from autotune.cache.protocols import Store

log = logging.getLogger(__name__)


# Set once start_ray_soon's thread has tried; start_ray waits for it rather than race it.
_early_start: threading.Event | None = None
_early_stop = threading.Event()  # ends that thread once undo_ray_started_soon shut its Ray down
_early_owns = False  # whether that thread started Ray (not found it up)


def start_ray_soon() -> None:
    """Start a local Ray now, in the background, so that its start (several seconds on a
    GPU host) overlaps the sweep's imports of torch and the model, not follows them.

    The thread that starts Ray lives as long as Ray (see _outlive_ray). A failure here is
    left to ``start_ray``'s own call, which says it in one line.
    """
    global _early_start, _early_stop
    if _early_start is not None:
        return
    started, stop = threading.Event(), threading.Event()
    _early_start, _early_stop = started, stop

    def run() -> None:
        global _early_owns
        owns_ray = False
        try:
            owns_ray = start_ray(None)
        except Exception:
            log.debug("starting Ray early failed; the pool's own start will say why", exc_info=True)
        finally:
            _early_owns = owns_ray
            started.set()
        if owns_ray:
            _outlive_ray(stop)

    threading.Thread(target=run, name="autotune-ray-start", daemon=True).start()


def undo_ray_started_soon() -> None:
    """Shut down the Ray that ``start_ray_soon`` started, for a sweep that stopped before it
    used it (bad input, a cache that is down): the caller's process is left as it was."""
    global _early_start, _early_owns
    started, stop = _early_start, _early_stop
    if started is None:
        return
    started.wait()
    if _early_owns:
        import ray

        ray.shutdown()
    _early_start, _early_owns = None, False
    stop.set()


def require_ray() -> None:
    """Ray can be imported here, or one WorkerError line that says how to install it."""
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        raise WorkerError("Ray is not installed, and a sweep tunes on Ray: pip install 'inductor-autotune[sweep]' "
                          "(--dry-run plans without it)") from exc


def start_ray(address: str | None) -> bool:
    """Start or join Ray unless it is up; True when this call initialised it."""
    require_ray()
    import ray

    early = _early_start
    if early is not None and threading.current_thread().name != "autotune-ray-start":
        early.wait()
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    check_address(address)  # seconds, not minutes, for a wrong one
    try:
        ray.init(
            # "local": without --address or RAY_ADDRESS, a new local instance. ray.init(None)
            # would join whatever cluster `ray start` last left in /tmp/ray, alive or not.
            address=address or "local",
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            configure_logging=True,
            ignore_reinit_error=True,
        )
    except Exception as exc:
        where = address or "a local Ray instance"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise WorkerError(f"could not start or join Ray at {where} ({first}); check --address / RAY_ADDRESS") from exc
    return True


def gpu_count() -> int:
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


class JobSource(Protocol):
    """Where the pool takes jobs from: a plain list, or the sweep's queue (which streams
    jobs in while capture runs and leases each one before it is handed out)."""

    def take(self) -> TuneJob | None:
        """A job to start now, or None when none is ready right now."""

    def exhausted(self) -> bool:
        """True once no job will ever come again (``take`` returned the last one)."""

    def finished(self, job: TuneJob, result: TuningResult) -> None:
        """The job's result is stored (or its failure recorded)."""

    def retry(self, job: TuneJob) -> None:
        """The job's actor was lost (its node died): start it again elsewhere."""


class ListSource:
    """A fixed list of jobs, in order."""

    def __init__(self, jobs: list[TuneJob]) -> None:
        self._jobs = list(reversed(jobs))

    def take(self) -> TuneJob | None:
        return self._jobs.pop() if self._jobs else None

    def exhausted(self) -> bool:
        return not self._jobs

    def finished(self, job: TuneJob, result: TuningResult) -> None:
        pass

    def retry(self, job: TuneJob) -> None:
        self._jobs.append(job)


@dataclass
class _Slot:
    actor: Any
    job: TuneJob | None = None
    ref: Any = None
    started: float = 0.0
    warm_ref: Any = None  # set while the actor starts (or restarts) and warms its child
    node: str | None = None  # the Ray node the actor runs on, from its warm-up


# A job whose actor dies (its node lost) is started again this many times, then failed.
MAX_JOB_RETRIES = 2


class TuningPool:
    """A set of actors that tune jobs; results come back in completion order.

    A job goes only to an actor that is warm, so jobs that stream in early never
    queue behind one slow start while another actor is idle. An actor that dies
    (its node was lost) gives its job back to the source to run elsewhere, and is
    warmed again once Ray has restarted it, wherever there is room.
    """

    def __init__(self, store: Store | None, device: str, actors: int, timeout: float, lanes: int = 1,
                 spares: str | None = None, fault: str = "", log_path: str | None = None) -> None:
        import ray

        if device == "cuda":
            available = gpu_count()
            if available < 1:
                raise WorkerError("no GPU in the Ray cluster; run on a GPU host, join a GPU cluster "
                                  "with --address, or pass --device cpu")
            actors = min(actors, available)
        lanes = max(1, lanes)  # the sweep gives CPU actors one: CPU timings would disturb each other
        # A threaded actor: its lanes' calls run at once, each in a child of its own.
        options: dict[str, Any] = {"max_restarts": -1, "max_task_retries": 0, "max_concurrency": lanes}
        options.update({"num_gpus": 1} if device == "cuda" else {"num_cpus": 1})
        cls = ray.remote(TuningWorker).options(**options)
        self.device = device
        self.timeout = timeout
        self.store = store
        # The actor's child enforces the per-request timeout; the driver's is a backstop.
        # fault: tests of the failure path (faults.py); log_path: the sweep's log file.
        handles = [cls.remote(store, device, timeout, lanes, spares, fault, log_path) for _ in range(actors)]
        self.slots = [_Slot(actor) for actor in handles for _ in range(lanes)]  # a slot per lane
        self.placements: dict[str, str | None] = {}  # request key -> node id of the actor that tuned it
        self._attempts: dict[str, int] = {}
        self.requeued = 0  # jobs given back after their actor was lost
        self.adopted = 0  # lanes whose child was a spare the sweep started before Ray (spares.py)
        # The first error storing a result (the store already retried what a retry
        # fixes): no further job is started, and results not stored are counted.
        self.store_error: str | None = None
        self.unstored: set[str] = set()  # request keys of results that were not stored

    def warm(self) -> None:
        """Have every actor start and warm its child now."""
        for slot in self.slots:
            slot.warm_ref = slot.actor.warm.remote()

    def wait_warm(self, stop: threading.Event, on_first: Callable[[], None] | None = None) -> bool:
        """Block until every child is warm (True), or until ``stop`` is set (False);
        ``on_first`` is called once the first is.

        Polls so that ``stop`` is seen: an actor Ray cannot place would never answer.
        """
        import ray

        pending = [slot.warm_ref for slot in self.slots if slot.warm_ref is not None]
        total = len(pending)
        while pending and not stop.is_set():
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.25)
            if on_first is not None and len(pending) < total:
                on_first()
                on_first = None
        return not stop.is_set()

    def run(self, jobs: list[TuneJob] | JobSource) -> Iterator[TuningResult]:
        """Yield one result per job, as each finishes."""
        import ray

        source = ListSource(jobs) if isinstance(jobs, list) else jobs
        last_live = time.monotonic()  # when some actor was last up (not starting or restarting)
        while self._more(source) or any(slot.ref is not None for slot in self.slots):
            self._dispatch(source)
            busy = [slot.ref for slot in self.slots if slot.ref is not None]
            warming = [slot.warm_ref for slot in self.slots if slot.warm_ref is not None]
            if len(warming) < len(self.slots):
                last_live = time.monotonic()
            elif time.monotonic() - last_live > self.timeout + 120:
                yield from self._abandon(source)
                return
            if not busy and not warming:
                time.sleep(0.1)  # jobs are still being captured, or leased by another sweep
                continue
            ready, _ = ray.wait(busy + warming, num_returns=1, timeout=0.5)
            for slot in self.slots:
                if slot.warm_ref is not None and slot.warm_ref in ready:
                    self._warmed(slot)
                job = slot.job
                if slot.ref is None or job is None:
                    continue
                if slot.ref in ready:
                    result = self._collect(slot, source)
                elif time.monotonic() - slot.started > self.timeout + 120:
                    result = self._expire(slot)
                else:
                    continue
                if result is not None:
                    source.finished(job, result)
                    yield result

    def _abandon(self, source: JobSource) -> Iterator[TuningResult]:
        """No actor came back for a long time (every node lost): fail what is left."""
        log.error("no Ray worker has been up for %.0f s; failing the remaining requests", self.timeout + 120)
        while (job := source.take()) is not None:
            result = failed_result(job, "no Ray worker left in the cluster", "crash", 0.0)
            self._store_failure(result)
            source.finished(job, result)
            yield result

    def _more(self, source: JobSource) -> bool:
        """Jobs left to start. None once the cache refused a result: tuning more would be
        lost work (the sweep reports what was left as not run)."""
        return self.store_error is None and not source.exhausted()

    def _dispatch(self, source: JobSource) -> None:
        if self.store_error is not None:
            return
        for slot in self.slots:
            if slot.ref is None and slot.warm_ref is None:
                job = source.take()
                if job is None:
                    return
                slot.job = job
                slot.ref = slot.actor.tune.remote(job.to_json())
                slot.started = time.monotonic()

    def _warmed(self, slot: _Slot) -> None:
        import ray

        ref, slot.warm_ref = slot.warm_ref, None
        try:
            reply = ray.get(ref) or {}
            slot.node = reply.get("node")
            self.adopted += int(bool(reply.get("adopted")))
        except ray.exceptions.RayActorError:  # died while (re)starting: warm again once Ray restarts it
            slot.warm_ref = slot.actor.warm.remote()
        except Exception:  # a failed warm-up is not fatal: the first job starts cold
            log.debug("warming an actor failed", exc_info=True)

    def _collect(self, slot: _Slot, source: JobSource) -> TuningResult | None:
        """The finished job's result; None when the job went back to the source."""
        import ray

        job, ref, seconds = slot.job, slot.ref, time.monotonic() - slot.started
        slot.job, slot.ref = None, None
        assert job is not None
        try:
            reply = ray.get(ref)
            error = reply.pop(STORE_ERROR_KEY, None)
            result = TuningResult.from_json(reply)
            self.placements[job.request.key] = slot.node
            if error is not None:
                self._not_stored(result, error)
            return result
        except ray.exceptions.RayActorError as exc:
            attempts = self._attempts.get(job.request.key, 0) + 1
            self._attempts[job.request.key] = attempts
            slot.warm_ref = slot.actor.warm.remote()  # queued until Ray restarts it somewhere
            if attempts <= MAX_JOB_RETRIES:
                log.warning("the worker tuning %s was lost (%s); re-queued", job.request.op, type(exc).__name__)
                source.retry(job)
                self.requeued += 1
                return None
            result = failed_result(job, f"the tuning process died ({type(exc).__name__})", "crash", seconds)
        except Exception as exc:
            result = failed_result(job, f"{type(exc).__name__}: {exc}"[:2000], "crash", seconds)
        self._store_failure(result)
        return result

    def _expire(self, slot: _Slot) -> TuningResult:
        import ray

        job, seconds = slot.job, time.monotonic() - slot.started
        assert job is not None
        # Killing with restart gives the next job a fresh process; the hung task errors out.
        ray.kill(slot.actor, no_restart=False)
        slot.job, slot.ref = None, None
        slot.warm_ref = slot.actor.warm.remote()  # the restarted actor takes jobs once warm
        result = failed_result(job, f"no result after {self.timeout:.0f} s", "timeout", seconds)
        self._store_failure(result)
        return result

    def _store_failure(self, result: TuningResult) -> None:
        if self.store is None or self.store_error is not None:
            return
        error = store_result(self.store, result)
        if error is not None:
            self._not_stored(result, error)

    def _not_stored(self, result: TuningResult, error: str) -> None:
        self.unstored.add(result.request.key)
        if self.store_error is None:
            self.store_error = error

    def shutdown(self) -> None:
        import ray

        for actor in {id(slot.actor): slot.actor for slot in self.slots}.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass


def _outlive_ray(stop: threading.Event | None = None) -> None:
    """Never return (or not before ``stop`` is set, once Ray is shut down); for the thread
    that started Ray.

    Ray spawns its local processes with PR_SET_PDEATHSIG, which Linux ties to the
    spawning *thread*: were that thread to end, Ray would be killed under the
    driver. Nor may it end once Ray looks shut down: ``ray.shutdown`` marks the
    driver disconnected before it stops the driver's core worker, which must not
    see its raylet die. So the thread, a daemon, ends with the process; Ray's own
    atexit hook shuts Ray down at exit, as when it is started from the main thread.
    """
    (stop or threading.Event()).wait()


class PoolStarter:
    """Starts Ray, creates a TuningPool and warms its children, all in a thread.

    The sweep starts this before its capture, so Ray's start, the actors' start
    and the children's torch/Inductor start-up overlap the capture instead of
    following it. ``pool()`` hands the pool over (or raises what the start
    raised, e.g. a WorkerError); ``close()`` kills the actors.
    """

    def __init__(self, address: str | None, store: Store | None, device: str, actors: int | None,
                 timeout: float, began: float | None = None, most: int | None = None, lanes: int = 1,
                 spares: str | None = None, fault: str = "", log_path: str | None = None) -> None:
        # actors: None for one per GPU that Ray sees; most: the job count, where known;
        # lanes: jobs per GPU actor at once; spares: the directory of spare children (spares.py);
        # fault and log_path: as TuningPool's.
        self._args = (address, store, device, actors, most, timeout, lanes, spares)
        self._actor_args = (fault, log_path)
        self._began = time.perf_counter() if began is None else began
        self._pool: TuningPool | None = None
        self._error: BaseException | None = None
        self._created = threading.Event()
        self._stop = threading.Event()
        self._settled = threading.Event()  # the thread has left Ray calls for good
        # Seconds from ``began`` to ray_up, actors_requested, first_child_warm and
        # all_children_warm, under the names of the sweep's timeline.
        self.milestones: dict[str, float] = {}
        # A daemon thread: one that started Ray lives as long as the process (see _outlive_ray).
        threading.Thread(target=self._run, name="autotune-pool-start", daemon=True).start()

    def _run(self) -> None:
        address, store, device, actors, most, timeout, lanes, spares = self._args
        owns_ray = False
        try:
            owns_ray = start_ray(address)
            self._mark("ray_up")
            wanted = actors or gpu_count()
            count = max(1, min(wanted, most or wanted))
            lanes = max(1, min(lanes, -(-most // count))) if most else lanes  # no lane left idle for sure
            self._pool = TuningPool(store, device, count, timeout, lanes, spares, *self._actor_args)
            self._pool.warm()
            self._mark("actors_requested")
        except BaseException as exc:  # handed to the caller's thread by pool()
            self._error = exc
        finally:
            self._created.set()
        try:
            if self._pool is not None and self._pool.wait_warm(self._stop, lambda: self._mark("first_child_warm")):
                self._mark("all_children_warm")
        except Exception:  # the wait only times the start-up; jobs report their own failures
            log.debug("waiting for the warm-up failed", exc_info=True)
        finally:
            self._settled.set()
        if owns_ray:
            _outlive_ray()

    def _mark(self, milestone: str) -> None:
        self.milestones[milestone] = time.perf_counter() - self._began

    @property
    def ready_seconds(self) -> float | None:
        """From ``began`` until every child was warm (None: not yet, or never)."""
        return self.milestones.get("all_children_warm")

    def pool(self) -> TuningPool:
        """The pool, once created; raises what starting it raised."""
        self._created.wait()
        if self._error is not None:
            raise self._error
        assert self._pool is not None
        return self._pool

    def close(self) -> None:
        """Stop waiting for warm-up and kill the actors; Ray itself stays up, as before.

        Returns once the thread is out of Ray's calls, so that no Ray call of it
        overlaps Ray's shutdown at exit.
        """
        self._stop.set()
        self._settled.wait()
        if self._pool is not None:
            self._pool.shutdown()
