"""Run tuning jobs on Ray actors and stream results back as they finish.

Like kernel_tuner's parallel runner: one actor per GPU (``num_gpus=1``, so each
sees its GPU as device 0), or ``workers`` actors on CPU. Each actor holds one job
at a time; a job that kills its actor, or outlives its timeout, becomes a failed
result and the (restarted) actor takes the next job.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from cache.records import TuningResult

from .actor import FAULT_ENV, TuningWorker
from .errors import WorkerError
from .tune import TuneJob, failed_result

log = logging.getLogger(__name__)


def start_ray(address: str | None) -> None:
    import ray

    if ray.is_initialized():
        return
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            configure_logging=True,
            ignore_reinit_error=True,
        )
    except Exception as exc:
        where = address or "a local Ray instance"
        raise WorkerError(f"could not start or join Ray at {where} ({exc}); check --address / RAY_ADDRESS") from exc


def gpu_count() -> int:
    import ray

    return int(ray.cluster_resources().get("GPU", 0))


@dataclass
class _Slot:
    actor: Any
    job: TuneJob | None = None
    ref: Any = None
    started: float = 0.0


class TuningPool:
    """A set of actors that tune jobs; results come back in completion order."""

    def __init__(self, store: Any | None, device: str, actors: int, timeout: float) -> None:
        import ray

        if device == "cuda":
            available = gpu_count()
            if available < 1:
                raise WorkerError("no GPU in the Ray cluster; run on a GPU host, join a GPU cluster "
                                  "with --address, or pass --device cpu")
            actors = min(actors, available)
        options: dict[str, Any] = {"max_restarts": -1, "max_task_retries": 0}
        # The fault-injection knob (tests) must reach the actor and its child.
        options.update({"num_gpus": 1} if device == "cuda" else {"num_cpus": 1})
        if FAULT_ENV in os.environ:
            options["runtime_env"] = {"env_vars": {FAULT_ENV: os.environ[FAULT_ENV]}}
        cls = ray.remote(TuningWorker).options(**options)
        self.device = device
        self.timeout = timeout
        self.store = store
        # The actor's child enforces the per-request timeout; the driver's is a backstop.
        self.slots = [_Slot(cls.remote(store, device, timeout)) for _ in range(actors)]

    def describe(self) -> list[dict[str, Any]]:
        import ray

        return ray.get([slot.actor.describe.remote() for slot in self.slots])

    def run(self, jobs: list[TuneJob], on_start: Callable[[TuneJob], None] | None = None) -> Iterator[TuningResult]:
        """Yield one result per job, as each finishes."""
        import ray

        queue = list(reversed(jobs))
        while queue or any(slot.ref is not None for slot in self.slots):
            for slot in self.slots:
                if slot.ref is None and queue:
                    slot.job = queue.pop()
                    slot.ref = slot.actor.tune.remote(slot.job.to_json())
                    slot.started = time.monotonic()
                    if on_start:
                        on_start(slot.job)
            busy = [slot.ref for slot in self.slots if slot.ref is not None]
            ready, _ = ray.wait(busy, num_returns=1, timeout=1.0)
            for slot in self.slots:
                if slot.ref is None:
                    continue
                if slot.ref in ready:
                    yield self._collect(slot)
                elif time.monotonic() - slot.started > self.timeout + 120:
                    yield self._expire(slot)

    def _collect(self, slot: _Slot) -> TuningResult:
        import ray

        job, ref, seconds = slot.job, slot.ref, time.monotonic() - slot.started
        slot.job, slot.ref = None, None
        assert job is not None
        try:
            return TuningResult.from_json(ray.get(ref))
        except ray.exceptions.RayActorError as exc:
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
        result = failed_result(job, f"no result after {self.timeout:.0f} s", "timeout", seconds)
        self._store_failure(result)
        return result

    def _store_failure(self, result: TuningResult) -> None:
        if self.store is None:
            return
        try:
            self.store.put_result(result)
        except Exception:
            log.exception("could not store the failure of %s", result.request.op)

    def shutdown(self) -> None:
        import ray

        for slot in self.slots:
            try:
                ray.kill(slot.actor, no_restart=True)
            except Exception:
                pass
