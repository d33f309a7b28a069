"""The sweep driver: model files -> capture -> plan -> queue -> workers -> cache.

Several model files make one sweep: each is captured in turn, and every request
found goes to one queue as soon as capture finds it (the Ray pool starts during
capture and tunes while capture goes on), de-duplicated across models. The
queue leases each request in the cache database, so concurrent sweeps split the
work (see ``queue.py``). A model whose capture a sweep stored before, for the same file,
options and setup, is not captured again: its requests are replayed (``capture_reuse.py``),
and a sweep that replays every model starts Ray only if a request is left to tune.

It returns a ``SweepReport`` (plain data, report.py) and reports progress through a small
callback interface, so the CLI owns all printing.
"""

from __future__ import annotations

import ast
import logging
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.inductor_glue.modelfile import ModelFile, may_bind
from autotune.settings import Settings

from .capture_run import CaptureRun
from .context import SweepContext
from .pass_run import PassRun
from .planning import Planner
from .report import Progress, Silent, SweepOptions, SweepReport
from .strategy import SweepStrategy, captures_may_be_reused
from .tuning_run import TuningRun, joins_cluster

if TYPE_CHECKING:  # Ray only with sweeps that tune
    from autotune.workers.spares import Spares

log = logging.getLogger(__name__)


def _device(settings: Settings) -> str:
    if settings.device:
        return settings.device
    from autotune.inductor_glue.env import default_device

    return default_device()


def _captures_here(device: str) -> bool:
    """False: this host lacks the GPU, so capture runs as a Ray task on one that has it."""
    import torch

    return device == "cpu" or torch.cuda.is_available()


class _Sweep:
    """One sweep: its shared state (``SweepContext``) and the parts that run it, capture
    (capture_run.py), the plan (planning.py), tuning (tuning_run.py) and the end-to-end pass
    (pass_run.py); ``run_sweep`` drives it through its steps in order."""

    def __init__(self, options: SweepOptions, settings: Settings, progress: Progress, store: Any,
                 spares: Spares | None = None, may_reuse: bool = False) -> None:
        """``may_reuse``: every model has a stored capture of its source and options
        (``capture_reuse.may_exist``), so nothing starts before the records are read."""
        started = time.perf_counter()
        device = _device(settings)
        report = SweepReport(sweep_id=uuid.uuid4().hex[:12], env=None, device=device, dry_run=options.dry_run)
        strategy = SweepStrategy(options, settings, device, _captures_here(device), store)
        self.ctx = SweepContext(options, settings, progress, store, device, strategy, report, started)
        self.planner = Planner(self.ctx)
        self.passes = PassRun(self.ctx)
        self.captures = CaptureRun(self.ctx, self.planner, self.passes.captured, may_reuse)
        self.tuning = TuningRun(self.ctx, spares)

    def load(self) -> list[ModelFile]:
        """Every model file, before any Ray start: bad input fails here (exit 2); then, where
        this sweep tunes (if at all: not where every model's capture is replayed), Ray's checks."""
        models = self.captures.load()
        if not self.ctx.options.dry_run and not self.captures.all_replayed(models):
            self.tuning.check_ray()  # a wrong --address fails in seconds, before capture
        return models

    def start(self, models: list[ModelFile]) -> None:
        """Before capture: the queue and (capturing here) the pool, a cut sweep's pass resumed,
        and on GPUs the pass begun beside capture. Where every model's capture is replayed, the
        pool starts only if a request is left to tune (``tune``)."""
        ctx = self.ctx
        pool_now = ctx.strategy.local and bool(ctx.options.model_paths) and not self.captures.all_replayed(models)
        self.tuning.start(pool_now)
        self.passes.resume_cut(models)
        self.passes.start_beside(models)

    def tune(self, models: list[ModelFile]) -> None:
        assert self.ctx.queue is not None
        self.planner.queue_misses()
        self.tuning.tune(lambda: self.passes.after_tuning(models))

    def close(self) -> None:
        self.ctx.readiness.release()  # no pass waits on a sweep that ended
        self.captures.close()
        self.tuning.close()


def run_sweep(options: SweepOptions, settings: Settings, progress: Progress | None = None) -> SweepReport:
    """Capture every model, plan the union, tune the rest on Ray, store each result.

    Raises on bad input only: a model file (ModelFileError), a Ray that is missing or cannot
    be reached (WorkerError), a cache that cannot be reached or written (CacheError).
    """
    progress = progress or Silent()
    progress.stage("starting up: the cache, the model files" + ("" if options.dry_run else ", Ray and its workers"))
    store = _checked_store(options, settings)
    may_reuse = captures_may_be_reused(options, store)
    local_ray = not may_reuse and _start_local_ray_soon(options, settings)
    spares = _start_spares(settings) if local_ray else None
    try:
        sweep = _Sweep(options, settings, progress, store, spares, may_reuse)
    except BaseException:
        if local_ray:
            _undo_early_start(None, spares)
        raise
    try:
        _run_steps(sweep)
    except BaseException:
        sweep.passes.close()
        if local_ray:
            _undo_early_start(sweep, None)  # its spares: sweep.close()
        raise
    finally:
        sweep.close()
    sweep.passes.finish()
    sweep.ctx.report.wall_seconds = time.perf_counter() - sweep.ctx.started
    return sweep.ctx.report


def _run_steps(sweep: _Sweep) -> None:
    """Load, start, capture, tune (or plan, in a dry run): the sweep up to its passes' end."""
    options = sweep.ctx.options
    sweep.captures.prestart()
    models = sweep.load()
    sweep.ctx.mark("models_loaded")
    if not options.dry_run:
        sweep.start(models)
    sweep.captures.capture(models)
    sweep.ctx.mark("capture_done")
    if not options.dry_run:
        sweep.tune(models)
        sweep.passes.still_owed(models)
    elif options.misses:
        sweep.planner.plan_misses()


def _checked_store(options: SweepOptions, settings: Settings) -> Any:
    """The cache, reached and (unless this sweep writes nothing) shown to take writes, before
    Ray starts or anything is loaded: a cache that is down or refuses writes is one line in
    seconds (CacheError), not an error after the capture."""
    from autotune.cache.store import Store

    store = Store(settings.cache, read_only=settings.read_only)
    if options.dry_run or settings.read_only:
        store.connect()
    else:
        store.check_writable()
    return store


def _start_local_ray_soon(options: SweepOptions, settings: Settings) -> bool:
    """A sweep that tunes on a local Ray starts it first of all, before torch, the cache and
    the model files load. A model file that cannot be one starts none; one that fails to load
    stops the sweep, which shuts this Ray down again (``_undo_early_start``). Joining a cluster
    (--address, RAY_ADDRESS) takes a second and waits for the address check. True when it did."""
    if options.dry_run or joins_cluster(settings) or not options.model_paths:
        return False
    if not all(_may_define(path, options.entry) for path in options.model_paths):
        return False  # bad input: the load says so in a moment, with no Ray started for nothing
    from autotune.workers.pool import start_ray_soon

    start_ray_soon()
    return True


def _may_define(path: str, entry: str) -> bool:
    """A Python file that compiles and may bind ``entry`` at its top level: the checks a model
    file can pass before torch is imported."""
    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return False
    return path.endswith(".py") and any(may_bind(node, entry) for node in tree.body)


def _undo_early_start(sweep: _Sweep | None, spares: Spares | None) -> None:
    """A sweep that failed before its pool existed (bad input, a cache that is down) leaves
    no Ray and no spare behind it."""
    if spares is not None:
        spares.close()
    if sweep is None or sweep.tuning.starter is None:
        from autotune.workers.pool import undo_ray_started_soon

        undo_ray_started_soon()


def spare_count(settings: Settings, gpus_here: int) -> int:
    """Spare children for a local sweep: one per lane its actors will have (a CPU actor has one)."""
    if settings.device == "cpu" or gpus_here == 0:
        return settings.workers
    return min(gpus_here, settings.gpus or gpus_here) * settings.jobs_per_gpu


def _start_spares(settings: Settings) -> Spares | None:
    """Tuning children started now, before Ray is up, for the local actors to adopt (spares.py)."""
    from autotune.workers import spares

    if not spares.supported():
        return None
    try:
        return spares.Spares(spare_count(settings, spares.gpus_on_this_host()))
    except OSError:  # no spares: each actor starts its children, as before
        log.debug("could not start spare tuning processes", exc_info=True)
        return None
