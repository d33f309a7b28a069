"""The sweep driver: model.py -> capture -> plan -> workers -> cache.

It returns a ``SweepReport`` (plain data) and reports progress through a small
callback interface, so the CLI owns all printing.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cache.records import (
    STATUS_OK,
    Environment,
    TuningRequest,
    TuningResult,
)

from .capture import CaptureResult, capture_model
from .modelfile import load_model_file, parse_config_overrides
from .plan import Plan, make_plan, shape_summary
from .settings import Settings

log = logging.getLogger(__name__)

STATUS_CACHED = "cached"


@dataclass
class SweepOptions:
    model_path: str | None
    entry: str = "example"
    batch_sizes: tuple[int | None, ...] = (None,)
    inductor_config: tuple[str, ...] = ()
    train: bool = False
    force: bool = False
    dry_run: bool = False
    misses: bool = False


@dataclass
class Outcome:
    """One request's row in the closing table."""

    request: TuningRequest
    status: str  # "cached", or a TuningResult status
    result: TuningResult | None = None

    def to_json(self) -> dict[str, Any]:
        winner = self.result.winner if self.result else None
        return {
            "op": self.request.op,
            "shapes": shape_summary(self.request),
            "request_key": self.request.key,
            "status": self.status,
            "winner": winner.name if winner else None,
            "winner_params": winner.params if winner else None,
            "winner_ms": winner.time_ms if winner else None,
            "aten_ms": self.result.aten_time_ms if self.result else None,
            "speedup_over_aten": self.result.speedup_over_aten if self.result else None,
            "candidates": len(self.result.candidates) if self.result else None,
            "error": self.result.error if self.result else None,
            "tuning_seconds": self.result.provenance.tuning_seconds if self.result else None,
        }


@dataclass
class SweepReport:
    sweep_id: str
    env: Environment | None
    device: str
    outcomes: list[Outcome] = field(default_factory=list)
    capture_seconds: float = 0.0
    wall_seconds: float = 0.0
    dry_run: bool = False

    def count(self, *statuses: str) -> int:
        return sum(1 for o in self.outcomes if o.status in statuses)

    @property
    def found(self) -> int:
        return len(self.outcomes)

    @property
    def cached(self) -> int:
        return self.count(STATUS_CACHED)

    @property
    def tuned(self) -> int:
        return self.count(STATUS_OK)

    @property
    def failed(self) -> int:
        return self.found - self.cached - self.tuned - self.count("planned")

    def to_json(self) -> dict[str, Any]:
        return {
            "sweep_id": self.sweep_id,
            "device": self.device,
            "device_name": self.env.device_name if self.env else None,
            "environment": self.env.to_json() if self.env else None,
            "dry_run": self.dry_run,
            "totals": {
                "found": self.found,
                "cached": self.cached,
                "tuned": self.tuned,
                "failed": self.failed,
                "capture_seconds": round(self.capture_seconds, 3),
                "wall_seconds": round(self.wall_seconds, 3),
            },
            "requests": [o.to_json() for o in self.outcomes],
        }


class Progress(Protocol):
    def start(self, total: int, description: str) -> None: ...
    def advance(self, outcome: Outcome) -> None: ...
    def stage(self, message: str) -> None: ...


class _Silent:
    def start(self, total: int, description: str) -> None:
        pass

    def advance(self, outcome: Outcome) -> None:
        pass

    def stage(self, message: str) -> None:
        log.info(message)


def _device(settings: Settings) -> str:
    if settings.device:
        return settings.device
    from .env import default_device

    return default_device()


def _capture(options: SweepOptions, settings: Settings, device: str) -> CaptureResult:
    """Capture here, or as a Ray task on a GPU worker when this host has no GPU."""
    assert options.model_path is not None
    model = load_model_file(options.model_path, options.entry)  # contract errors surface here
    kwargs: dict[str, Any] = dict(
        batch_sizes=options.batch_sizes,
        mode=settings.mode,
        inductor_config=parse_config_overrides(options.inductor_config),
        train=options.train,
        device=device,
    )
    import torch

    if device == "cpu" or torch.cuda.is_available():
        return capture_model(model, **kwargs)
    return _remote_capture(options, settings, kwargs)


def _remote_capture(options: SweepOptions, settings: Settings, kwargs: dict[str, Any]) -> CaptureResult:
    import ray

    from workers.actor import remote_capture
    from workers.pool import start_ray

    start_ray(settings.address)
    path = Path(options.model_path or "")
    task = ray.remote(num_gpus=1)(remote_capture)
    data = ray.get(task.remote(path.read_text(), path.name, {**kwargs, "entry": options.entry}))
    return CaptureResult(
        env=Environment.from_json(data["env"]) if data["env"] else None,
        requests=[TuningRequest.from_json(r) for r in data["requests"]],
        config_overrides=data["config_overrides"],
        mode=data["mode"],
        device=data["device"],
        seconds=data["seconds"],
        total_lookups=data["total_lookups"],
    )


def _miss_jobs(store: Any, device: str, settings: Settings, sweep_id: str) -> list[Any]:
    """Jobs for every logged miss from a machine like this one (any config)."""
    from workers.tune import TuneJob

    from .env import current_environment

    here = current_environment(device)
    jobs = []
    for miss in store.misses(None):
        env = miss.env
        same_machine = (env.device_kind, env.device_name, env.torch_version, env.triton_version,
                        env.cuda_version, env.system_hash) == (
            here.device_kind, here.device_name, here.torch_version, here.triton_version,
            here.cuda_version, here.system_hash)
        if not same_machine:
            continue
        config = {k: v for k, v in env.config.items() if not (isinstance(v, str) and v.startswith("<"))}
        jobs.append(TuneJob(miss.request, env, settings.mode, config, device, sweep_id))
    return jobs


def run_sweep(options: SweepOptions, settings: Settings, progress: Progress | None = None) -> SweepReport:
    """Capture, plan, tune the rest on Ray, store each result. Raises on bad input only."""
    from cache.store import Store
    from workers.tune import TuneJob

    progress = progress or _Silent()
    started = time.perf_counter()
    device = _device(settings)
    sweep_id = uuid.uuid4().hex[:12]
    store = Store(settings.cache, read_only=settings.read_only)
    report = SweepReport(sweep_id=sweep_id, env=None, device=device, dry_run=options.dry_run)

    jobs: list[TuneJob] = []
    if options.model_path is not None:
        progress.stage(f"capturing {options.model_path} ({settings.mode}, {device})")
        captured = _capture(options, settings, device)
        report.env, report.capture_seconds = captured.env, captured.seconds
        cached_keys = store.cached_request_keys(captured.env) if captured.env else set()
        plan: Plan = make_plan(captured.requests, cached_keys, force=options.force)
        report.outcomes += [Outcome(r, STATUS_CACHED) for r in plan.cached]
        jobs += [TuneJob(r, captured.env, settings.mode, captured.config_overrides, device, sweep_id)
                 for r in plan.to_tune]
    if options.misses:
        known = {job.request.key for job in jobs}
        jobs += [j for j in _miss_jobs(store, device, settings, sweep_id) if j.request.key not in known]

    if options.dry_run or not jobs:
        report.outcomes += [Outcome(job.request, "planned") for job in jobs]
        report.wall_seconds = time.perf_counter() - started
        return report

    _tune(jobs, store, device, settings, progress, report)
    report.wall_seconds = time.perf_counter() - started
    return report


def _tune(jobs: list[Any], store: Any, device: str, settings: Settings, progress: Progress,
          report: SweepReport) -> None:
    from workers.pool import TuningPool, gpu_count, start_ray

    progress.stage("starting Ray" + (f" at {settings.address}" if settings.address else " locally"))
    start_ray(settings.address)
    if device == "cuda":
        actors = settings.gpus or gpu_count()
    else:
        actors = settings.workers
    actors = max(1, min(actors, len(jobs)))
    pool = TuningPool(store, device, actors, settings.request_timeout)
    try:
        progress.start(len(jobs), f"tuning on {actors} {'GPU' if device == 'cuda' else 'CPU'} worker(s)")
        for result in pool.run(jobs):
            outcome = Outcome(result.request, result.status, result)
            report.outcomes.append(outcome)
            progress.advance(outcome)
    finally:
        pool.shutdown()
