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
from typing import TYPE_CHECKING, Any, Protocol

from cache.records import (
    STATUS_OK,
    Environment,
    TuningRequest,
    TuningResult,
)

from inductor_glue.capture import CaptureResult, capture_model
from inductor_glue.modelfile import ModelFile, load_model_file, parse_config_overrides
from .plan import Plan, make_plan, shape_summary
from .pointwise import PointwiseProcess, PointwiseReport, PointwiseSpec
from .settings import Settings

if TYPE_CHECKING:  # Ray is imported only by sweeps that tune
    from workers.pool import PoolStarter

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
    # From the sweep's start until Ray, the actors and their warm children were ready
    # (0.0 when nothing was tuned); it overlaps the capture.
    startup_seconds: float = 0.0
    # From the pool being ready until the last GEMM result arrived.
    tuning_seconds: float = 0.0
    dry_run: bool = False
    pointwise: PointwiseReport | None = None  # GPU sweeps: the pointwise/reduction pass

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
                "startup_seconds": round(self.startup_seconds, 3),
                "tuning_seconds": round(self.tuning_seconds, 3),
                "wall_seconds": round(self.wall_seconds, 3),
            },
            "pointwise": self.pointwise.to_json() if self.pointwise else None,
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
    from inductor_glue.env import default_device

    return default_device()


def _load(options: SweepOptions, settings: Settings, device: str) -> tuple[ModelFile, dict[str, Any]]:
    """The model file and capture arguments: every bad-input error surfaces here."""
    assert options.model_path is not None
    model = load_model_file(options.model_path, options.entry)
    kwargs: dict[str, Any] = dict(
        batch_sizes=options.batch_sizes,
        mode=settings.mode,
        inductor_config=parse_config_overrides(options.inductor_config),
        train=options.train,
        device=device,
    )
    return model, kwargs


def _captures_here(device: str) -> bool:
    """False: this host lacks the GPU, so capture runs as a Ray task on one that has it."""
    import torch

    return device == "cpu" or torch.cuda.is_available()


@dataclass
class _BuiltOnce(ModelFile):
    """A model file whose first build already ran, and whose result capture reuses.

    Building before the pool starts makes a failing entry (bad input, exit 2)
    fail before Ray starts, at no cost: capture takes the built model as is.
    """

    first: tuple[int | None, tuple[Any, tuple[Any, ...]]] | None = None

    @classmethod
    def of(cls, model: ModelFile, batch_size: int | None) -> _BuiltOnce:
        built = cls(model.path, model.entry, model.factory, model.config_overrides)
        built.first = (batch_size, model.build(batch_size))  # shares config_overrides
        return built

    def build(self, batch_size: int | None) -> tuple[Any, tuple[Any, ...]]:
        if self.first is not None and self.first[0] == batch_size:
            result, self.first = self.first[1], None
            return result
        return super().build(batch_size)


def _start_pool(store: Any, device: str, settings: Settings, began: float, jobs: int | None = None) -> PoolStarter:
    """Start Ray and the pool in the background; before capture the job count is not
    known (``jobs`` None), so the pool gets every actor the settings allow."""
    from workers.pool import PoolStarter

    # CUDA: --gpus, or None for every GPU Ray sees (counted once Ray is up).
    actors = settings.gpus if device == "cuda" else settings.workers
    return PoolStarter(settings.address, store, device, actors, settings.request_timeout, began, jobs)


@dataclass
class _Captured:
    jobs: list[Any]
    starter: PoolStarter | None
    kwargs: dict[str, Any]  # capture's arguments: the pointwise pass compiles the same way
    local: bool


def _capture_jobs(options: SweepOptions, settings: Settings, device: str, store: Any, report: SweepReport,
                  began: float, progress: Progress) -> _Captured:
    """Capture and plan. A sweep that will tune starts its pool first, so that Ray's,
    the actors' and the children's start-up overlap the capture (the remote capture
    needs Ray and a GPU first, so there the pool waits)."""
    from workers.jobs import TuneJob

    model, kwargs = _load(options, settings, device)  # bad input fails here, before any Ray start
    local = _captures_here(device)
    starter = None
    if local and not options.dry_run and options.batch_sizes:
        model = _BuiltOnce.of(model, options.batch_sizes[0])
        starter = _start_pool(store, device, settings, began)
    progress.stage(f"capturing {options.model_path} ({settings.mode}, {device})")
    try:
        captured = capture_model(model, **kwargs) if local else _remote_capture(options, settings, kwargs)
        report.env, report.capture_seconds = captured.env, captured.seconds
        cached_keys = store.cached_request_keys(captured.env) if captured.env else set()
    except BaseException:
        if starter is not None:
            starter.close()
        raise
    plan: Plan = make_plan(captured.requests, cached_keys, force=options.force)
    report.outcomes += [Outcome(r, STATUS_CACHED) for r in plan.cached]
    jobs = [TuneJob(r, captured.env, settings.mode, captured.config_overrides, device, report.sweep_id)
            for r in plan.to_tune]
    return _Captured(jobs, starter, kwargs, local)


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
    from workers.jobs import TuneJob

    from inductor_glue.env import current_environment

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

    progress = progress or _Silent()
    started = time.perf_counter()
    device = _device(settings)
    sweep_id = uuid.uuid4().hex[:12]
    store = Store(settings.cache, read_only=settings.read_only)
    report = SweepReport(sweep_id=sweep_id, env=None, device=device, dry_run=options.dry_run)

    jobs: list[Any] = []
    starter: PoolStarter | None = None
    captured: _Captured | None = None
    pointwise: PointwiseProcess | None = None
    if options.model_path is not None:
        captured = _capture_jobs(options, settings, device, store, report, started, progress)
        jobs, starter = captured.jobs, captured.starter
    try:
        if options.misses:
            known = {job.request.key for job in jobs}
            jobs += [j for j in _miss_jobs(store, device, settings, sweep_id) if j.request.key not in known]
        if options.dry_run or not jobs:
            report.outcomes += [Outcome(job.request, "planned") for job in jobs]
            if not options.dry_run and captured is not None and _publishes(captured, settings):
                pointwise = _pointwise_process(captured, options, settings, device)  # artifacts only
        else:
            starter = starter or _start_pool(store, device, settings, started, len(jobs))
            if captured is not None and _wants_pointwise(captured, settings, device):
                pointwise = _pointwise_process(captured, options, settings, device)
            _tune(jobs, starter, device, settings, progress, report)
    except BaseException:
        if pointwise is not None:
            pointwise.close()
        raise
    finally:
        if starter is not None:  # also when nothing is left to tune: the early pool goes unused
            starter.close()
    if pointwise is not None:
        what = "tuning pointwise/reduction kernels" if device == "cuda" else "compiling the model end to end"
        signed = ", publishing signed artifacts" if settings.signing_key else ""
        progress.stage(f"{what}{signed} (one compile and run with the new winners)")
        report.pointwise = pointwise.run(settings.request_timeout)
    report.wall_seconds = time.perf_counter() - started
    return report


def _pointwise_process(captured: _Captured, options: SweepOptions, settings: Settings,
                       device: str) -> PointwiseProcess:
    kwargs = captured.kwargs
    spec = PointwiseSpec(str(options.model_path), options.entry, list(kwargs["batch_sizes"]), kwargs["mode"],
                         kwargs["inductor_config"], kwargs["train"], settings.cache, device,
                         signing_key=settings.signing_key)
    return PointwiseProcess(spec)


def _wants_pointwise(captured: _Captured, settings: Settings, device: str) -> bool:
    """The end-to-end pass, when there are GEMMs to tune: GPUs tune pointwise kernels
    in it, and with a signing key it publishes the compiled artifacts (CPU too). A
    host without the device (remote capture) cannot run the model."""
    tunes_pointwise = device == "cuda" and settings.kernel_configs
    return (tunes_pointwise or _publishes(captured, settings)) and captured.local and not settings.read_only


def _publishes(captured: _Captured, settings: Settings) -> bool:
    """A signing key asks for the artifacts even when every GEMM was cached already:
    what is stored stays (written once), what is missing is published."""
    return bool(settings.signing_key and settings.artifacts) and captured.local and not settings.read_only


def _tune(jobs: list[Any], starter: PoolStarter, device: str, settings: Settings, progress: Progress,
          report: SweepReport) -> None:
    progress.stage("starting Ray" + (f" at {settings.address}" if settings.address else " locally"))
    pool = starter.pool()  # waits for the start if it is still going; raises its WorkerError
    # The pool was sized before the job count was known; the extra actors just stay idle.
    actors = max(1, min(len(pool.slots), len(jobs)))
    progress.start(len(jobs), f"tuning on {actors} {'GPU' if device == 'cuda' else 'CPU'} worker(s)")
    tuning_began = time.perf_counter()
    for result in pool.run(jobs):
        outcome = Outcome(result.request, result.status, result)
        report.outcomes.append(outcome)
        progress.advance(outcome)
    report.tuning_seconds = time.perf_counter() - tuning_began
    report.startup_seconds = starter.ready_seconds or 0.0
