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
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.cache.records import (
    Environment,
    TuningRequest,
    TuningResult,
)
from autotune.inductor_glue.modelfile import ModelFile, ModelFileError, load_model_file, may_bind
from autotune.settings import Settings

from .pass_readiness import ModelReadiness
from .pass_spec import EndToEndSpec
from .plan import CACHED
from .report import (
    STATUS_CACHED,
    STATUS_ELSEWHERE,
    STATUS_NOT_RUN,
    ModelCapture,
    Outcome,
    Progress,
    Silent,
    SweepOptions,
    SweepReport,
)
from .strategy import SweepStrategy, capture_cost, captures_may_be_reused, pass_costs

if TYPE_CHECKING:  # torch comes with capture, Ray only with sweeps that tune: both after Ray's start
    from autotune.inductor_glue.capture import CaptureResult
    from autotune.workers.pool import PoolStarter, TuningPool
    from autotune.workers.spares import Spares

    from .capture_lanes import LaneProcess
    from .capture_reuse import Record
    from .end_to_end import EndToEndPass, EndToEndReport
    from .queue import SweepQueue
    from .resumed_pass import ResumedPass

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


@dataclass
class _BuiltOnce(ModelFile):
    """A model file whose first build already ran, and whose result capture reuses.

    Building before the pool starts makes a failing entry (bad input, exit 2)
    fail before Ray starts, at no cost: capture takes the built model as is.
    """

    first: tuple[int | None, tuple[Any, tuple[Any, ...]]] | None = None

    @classmethod
    def of(cls, model: ModelFile, batch_size: int | None) -> _BuiltOnce:
        built = cls(model.path, model.entry, model.factory, model.config_overrides, dynamic_dims=model.dynamic_dims,
                    trains=model.trains)
        built.first = (batch_size, model.build(batch_size))  # shares config_overrides
        return built

    def build(self, batch_size: int | None) -> tuple[Any, tuple[Any, ...]]:
        if self.first is not None and self.first[0] == batch_size:
            result, self.first = self.first[1], None
            return result
        return super().build(batch_size)


def _load(path: str, options: SweepOptions, local: bool, build: bool = True) -> ModelFile:
    """A model file, built once where it is captured here (``build``): every bad-input error
    surfaces now. Without ``build`` (captured in processes of their own, which build it side by
    side) only importing it and finding its entry are checked here."""
    model = load_model_file(path, options.entry)
    if local and build and options.batch_sizes:
        model = _BuiltOnce.of(model, options.batch_sizes[0])
    return model


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


def _remote_capture(path: str, options: SweepOptions, settings: Settings, kwargs: dict[str, Any],
                    store: Any) -> tuple[CaptureResult, Environment | None]:
    """Capture on a GPU node of the cluster: the model file travels alone (its own imports
    must be installed there). Also the environment its padding verdicts are filed under."""
    import ray

    from autotune.inductor_glue.capture import CaptureResult
    from autotune.workers.actor import remote_capture
    from autotune.workers.errors import WorkerError
    from autotune.workers.pool import gpu_count, start_ray

    start_ray(settings.address)
    if gpu_count() < 1:
        raise WorkerError("this host has no GPU to capture on and the Ray cluster has none either; "
                          "join a cluster with GPUs (--address), or pass --device cpu")
    task = ray.remote(num_gpus=1)(remote_capture)
    data = ray.get(task.remote(Path(path).read_text(), Path(path).name, {**kwargs, "entry": options.entry}, store))
    captured = CaptureResult(
        env=Environment.from_json(data["env"]) if data["env"] else None,
        requests=[TuningRequest.from_json(r) for r in data["requests"]],
        config_overrides=data["config_overrides"],
        mode=data["mode"],
        device=data["device"],
        seconds=data["seconds"],
        total_lookups=data["total_lookups"],
        pad_decisions=data.get("pad_decisions") or {},
    )
    return captured, Environment.from_json(data["pad_env"]) if data.get("pad_env") else None


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


class _Sweep:
    """One sweep's state: models, plan, queue, pool; ``run_sweep`` drives it."""

    def __init__(self, options: SweepOptions, settings: Settings, progress: Progress, store: Any,
                 spares: Spares | None = None, may_reuse: bool = False) -> None:
        """``may_reuse``: every model has a stored capture of its source and options
        (``capture_reuse.may_exist``), so nothing starts before the records are read."""
        self.options, self.settings, self.progress = options, settings, progress
        self.may_reuse = may_reuse
        self.spares = spares
        self.started = time.perf_counter()
        self.device = _device(settings)
        self.report = SweepReport(sweep_id=uuid.uuid4().hex[:12], env=None, device=self.device,
                                  dry_run=options.dry_run)
        self.store = store
        # What to tune and which passes are owed; this class runs what it decides.
        self.strategy = SweepStrategy(options, settings, self.device, _captures_here(self.device), store)
        self.queue: SweepQueue | None = None
        self.starter: PoolStarter | None = None
        self.dispatcher: _Dispatcher | None = None
        self.end_to_end: EndToEndPass | None = None
        self.resumed: ResumedPass | None = None  # a cut pass, started again beside capture
        self.found_in: dict[str, str] = {}  # request key -> the first model whose capture found it
        self._pass_specs: list[EndToEndSpec] = []  # the early pass's (start_passes)
        self.readiness = ModelReadiness()  # which models' passes may start (their GEMMs answered)
        self.queued_keys: set[str] = set()  # request keys this sweep queued
        self.passes_beside: _PassesBeside | None = None  # the pass, run while tuning goes on
        self.capture_processes: list[LaneProcess] = []  # capture's, started with the sweep (prestart_captures)
        self.capture_keys: dict[str, str] = {}  # model path -> its capture's record key (capture_reuse)
        self.records: dict[str, Record] = {}  # model path -> the stored capture this sweep replays
        self.streamed: dict[str, list[tuple[TuningRequest, Environment | None]]] = {}  # what capture found

    def mark(self, milestone: str) -> None:
        self.report.mark(milestone, time.perf_counter() - self.started)

    # ------------------------------------------------------------------ capture

    def prestart_captures(self) -> None:
        """Capture's processes, when models are to be captured side by side, started now: their
        imports overlap this process's (the model files, Ray's start) instead of following them."""
        lanes = self.strategy.capture_lanes(len(self.options.model_paths))
        if lanes > 1 and not self.may_reuse:  # a model whose capture is replayed needs no process
            from .capture_lanes import prestart

            self.capture_processes = prestart(lanes, cuda=self.device == "cuda")

    def load(self) -> list[ModelFile]:
        """Every model file, before any Ray start: bad input fails here (exit 2). Models captured in
        processes of their own are built there, side by side, and a build that fails there fails
        again in this process's own capture (exit 2 too, after Ray's start)."""
        paths = self.options.model_paths
        build = self.strategy.capture_lanes(len(paths)) == 1
        models = [_load(path, self.options, self.strategy.local, build) for path in paths]
        self._look_up_captures(models)
        if not self.options.dry_run and not self._all_replayed(models):  # Ray is needed to tune, if at all
            from autotune.workers.cluster import check_address
            from autotune.workers.pool import require_ray

            require_ray()  # imported by now by Ray's early start, if that began
            check_address(self.settings.address)  # a wrong --address fails in seconds, before capture
        return models

    def start_tuning(self, models: list[ModelFile]) -> None:
        """The queue, and (capturing here) the pool and its feeder, started before capture
        so that Ray's, the actors' and the children's start-up overlap it. Where every model's
        capture is replayed, the pool starts only if a request is left to tune (``tune``)."""
        from .queue import SweepQueue

        leases = None if self.settings.read_only else self.store.leases(seconds=self.settings.lease_seconds)
        self.queue = SweepQueue(leases, hold_until_closed=self.device != "cuda")
        if self.strategy.local and self.options.model_paths and not self._all_replayed(models):
            self.ensure_pool()

    def ensure_pool(self) -> None:
        if self.dispatcher is None:
            assert self.queue is not None
            spares = self.spares.directory if self.spares is not None else None
            self.starter = _start_pool(self.store, self.device, self.settings, self.started, spares=spares)
            self.dispatcher = _Dispatcher(self.starter, self.queue, self.readiness.answered)

    def capture(self, models: list[ModelFile]) -> None:
        models = [model for model in self.strategy.capture_order(models) if not self._replay(model)]
        lanes = self.strategy.capture_lanes(len(models))
        if lanes > 1:
            models = self._capture_side_by_side(models, lanes)  # those left: their process failed
        for model in models:
            entry = next((e for e in self.report.models if e.path == str(model.path)), None)
            if entry is None:
                entry = ModelCapture(str(model.path))
                self.report.models.append(entry)
            self.progress.stage(f"capturing {model.path} ({self.settings.mode}, {self.device})")
            self._capture_here(model, entry)

    def _capture_here(self, model: ModelFile, entry: ModelCapture) -> None:
        """Capture ``model`` in this process (or, without the device here, on a Ray worker)."""

        streamed = self.streamed[entry.path] = []

        def found(request: TuningRequest, env: Environment | None) -> None:
            overrides = {**model.config_overrides, **self.strategy.kwargs["inductor_config"]}
            streamed.append((request, env))
            entry.new += self._found(request, env, overrides, entry.path)

        if self.strategy.local:
            from autotune.inductor_glue.capture import capture_model

            captured = capture_model(model, on_request=found, pad_decisions=self._pad_decisions(),
                                     **self.strategy.kwargs_for(model))
            self._store_pad_decisions(captured.pad_decisions)
            self._keep_capture(entry.path, captured.total_lookups, captured.seconds)
        else:
            captured, pad_env = _remote_capture(str(model.path), self.options, self.settings,
                                                self.strategy.kwargs_for(model), self.store)
            self._store_pad_decisions(captured.pad_decisions, pad_env)
            for request in captured.requests:
                entry.new += self._found(request, captured.env, captured.config_overrides, entry.path)
        self._record_capture(entry, captured.env, len(captured.requests), captured.total_lookups, captured.seconds)

    def _capture_side_by_side(self, models: list[ModelFile], lanes: int) -> list[ModelFile]:
        """Capture ``models`` in processes of their own, ``lanes`` at a time (autotune/sweep/capture_lanes.py),
        planning each request as it comes; the models whose process failed, to capture here."""
        from .capture_lanes import CaptureSpec, capture_side_by_side

        entries = {str(model.path): ModelCapture(str(model.path)) for model in models}
        self.report.models += entries.values()
        by_path = {str(model.path): model for model in models}
        self.progress.stage(f"capturing {len(models)} models, {lanes} at a time ({self.settings.mode}, {self.device})")
        specs = []
        for path, model in by_path.items():
            kwargs = {**self.strategy.kwargs_for(model), "batch_sizes": list(self.strategy.kwargs["batch_sizes"])}
            kwargs.pop("distributed", None)  # JSON for the process; capture side by side is never --ddp/--fsdp
            specs.append(CaptureSpec(path, self.options.entry, kwargs, self._pad_decisions()))
        failed: list[ModelFile] = []
        started, self.capture_processes = self.capture_processes, []
        with contextlib.closing(capture_side_by_side(specs, lanes, started)) as captures:  # no process outlives it
            for found in captures:
                model, entry = by_path[found.model_path], entries[found.model_path]
                if found.request is not None:
                    overrides = {**model.config_overrides, **self.strategy.kwargs["inductor_config"]}
                    self.streamed.setdefault(found.model_path, []).append((found.request, found.env))
                    entry.new += self._found(found.request, found.env, overrides, entry.path)
                elif found.bad_input is not None:
                    raise ModelFileError(found.bad_input)
                elif found.result is None:
                    failed.append(model)
                else:
                    self._captured_elsewhere(entry, found.result)
        return failed

    def _captured_elsewhere(self, entry: ModelCapture, result: dict[str, Any]) -> None:
        self._store_pad_decisions(result["pad_decisions"])
        env = Environment.from_json(result["env"]) if result["env"] else None
        self._keep_capture(entry.path, result["total_lookups"], result["seconds"])
        self._record_capture(entry, env, result["requests"], result["total_lookups"], result["seconds"])

    # ------------------------------------------------------------------ stored captures

    def _look_up_captures(self, models: list[ModelFile]) -> None:
        """Each model's capture key (capturing here only), and the stored capture under it
        unless --force asks for a fresh one (autotune/sweep/capture_reuse.py)."""
        if not self.strategy.local:
            return
        from . import capture_reuse

        for model in models:
            path = str(model.path)
            source = capture_reuse.source_digest(path, self.options)
            key = capture_reuse.record_key(source, capture_reuse.setup_digest(model, self.strategy.kwargs_for(model)))
            self.capture_keys[path] = key
            record = None if self.options.force else capture_reuse.find(self.store, key)
            if record is not None:
                self.records[path] = record
        self.mark("captures_looked_up")

    def _all_replayed(self, models: list[ModelFile]) -> bool:
        return bool(models) and all(str(model.path) in self.records for model in models)

    def _replay(self, model: ModelFile) -> bool:
        """Plan ``model``'s requests from its stored capture, in the order capture found them,
        as capture would have; False where it has none."""
        record = self.records.get(str(model.path))
        if record is None:
            return False
        entry = ModelCapture(str(model.path), reused_from=record.at)
        self.report.models.append(entry)
        self.progress.stage(f"reusing the capture of {model.path} from {record.at}")
        overrides = {**model.config_overrides, **self.strategy.kwargs["inductor_config"]}
        for request, env in record.found:
            entry.new += self._found(request, env, overrides, entry.path)
        env = next((env for _, env in record.found if env is not None), None)
        self._record_capture(entry, env, len(record.found), record.lookups, 0.0)
        return True

    def _keep_capture(self, path: str, lookups: int, seconds: float) -> None:
        """Store what capture of ``path`` streamed, for a later sweep to replay; not from a dry
        run or a read-only sweep (they write nothing), nor a capture elsewhere (no key)."""
        key = self.capture_keys.get(path)
        if key is None or self.options.dry_run or self.settings.read_only:
            return
        from . import capture_reuse

        found = self.streamed.get(path, [])
        env = next((env for _, env in found if env is not None), None)
        if env is None:  # no request: filed with the pass marks (the ISA is probed by now)
            from autotune.inductor_glue.env import kernel_config_environment

            env = kernel_config_environment(self.device)
        capture_reuse.save(self.store, env, key, path, capture_reuse.Record.now(found, lookups, seconds))

    def _record_capture(self, entry: ModelCapture, env: Environment | None, requests: int, lookups: int,
                        seconds: float) -> None:
        """What capture of ``entry``'s model found, in the report; then its pass may be decided."""
        self.report.env = self.report.env or env
        entry.requests, entry.lookups, entry.seconds = requests, lookups, seconds
        self.report.capture_seconds += seconds
        self._captured(entry)

    def _captured(self, entry: ModelCapture) -> None:
        """Capture of ``entry``'s model is complete: its pass, begun beside capture, may go once its
        GEMMs are answered, or is left out when it has nothing to do (no new winner for it, no
        artifacts to publish, and its last pass finished)."""
        if self.passes_beside is not None and \
                self.strategy.skips_pass(entry.path, self.readiness.found_new(entry.path), self._pass_specs):
            self.readiness.skip(entry.path)
        else:
            self.readiness.captured(entry.path)

    def start_passes(self, models: list[ModelFile]) -> None:
        """On GPUs, start the end-to-end pass before capture, on a thread: each model's pass begins
        once its capture is complete and its GEMMs are answered, beside the capture and tuning of
        the others (their timings take turns on the GPU). Not behind a resumed pass, which runs
        first; on a CPU, a pass's compile would slow the timings beside it, so it runs after."""
        if self.device != "cuda" or self.resumed is not None or not models:
            return
        if not self.strategy.wants_pass():
            return
        from .end_to_end import EndToEndPass

        self._pass_specs = self.strategy.pass_specs(models)
        self.end_to_end = EndToEndPass(self._pass_specs, self.strategy.local_gpus(),
                                       [float(spec.train) + 1 for spec in self._pass_specs], self._pass_cost,
                                       self.strategy.passes_per_gpu())
        self.mark("pointwise_go")
        self.passes_beside = _PassesBeside(self.end_to_end, self.settings.request_timeout, self.progress.advance,
                                           self.readiness)

    def _pass_cost(self, path: str) -> float:
        """A captured model's expected pass time, by proxy (``capture_cost``)."""
        return capture_cost(next((e for e in self.report.models if e.path == path), None))

    def _pad_decisions(self) -> dict[str, dict[str, Any]]:
        """Padding verdicts stored by earlier sweeps or jobs on this kind of GPU (none on a CPU,
        where Inductor does not time them): capture pads as they did."""
        from autotune.inductor_glue import padding

        return padding.stored_decisions(self.store, padding.filed_under(self.device))

    def _store_pad_decisions(self, decisions: dict[str, dict[str, Any]], env: Environment | None = None) -> None:
        """Store the padding verdicts capture timed, before the pass and the jobs need them,
        under ``env`` (a remote capture's GPU) or this host's device."""
        if decisions and not self.settings.read_only and not self.options.dry_run:  # a dry run writes nothing
            from autotune.inductor_glue import padding

            target = env or padding.filed_under(self.device)
            if target is not None:  # None: a CPU, where Inductor times no padding
                self.store.put_kernel_configs(target, decisions)

    def _found(self, request: TuningRequest, env: Environment | None, overrides: dict[str, Any],
               model: str) -> int:
        """Plan one request as capture finds it in ``model``: cached, queued (streamed to
        workers), or planned (dry run). 1 if it is new to this sweep."""
        from autotune.workers.jobs import TuneJob
        from autotune.workers.search import search_overrides

        decision = self.strategy.verdict(request, env)
        if decision is None:  # found before: if this sweep queued it, this model's pass waits for it too
            if request.key in self.queued_keys:
                self.readiness.needs(model, request.key, pending=self.readiness.waits_on(request.key))
            return 0
        self.found_in.setdefault(request.key, model)
        if decision == CACHED:
            self.report.outcomes.append(Outcome(request, STATUS_CACHED, model=model))
        elif self.queue is None:
            self.report.outcomes.append(Outcome(request, "planned", model=model))
        else:
            self.mark("first_request_queued")
            self.queued_keys.add(request.key)
            self.readiness.needs(model, request.key)
            searched = {**overrides, **search_overrides(self.settings.search, self.settings.budget_s)}
            self.queue.put(TuneJob(request, env, self.settings.mode, searched, self.device,
                                   self.report.sweep_id), priority=self.strategy.priority(model))
        return 1

    def plan_misses(self) -> None:
        """A dry run with --misses: the logged misses join the plan."""
        for job in self._miss_jobs():
            if self.strategy.takes_miss(job):
                self.report.outcomes.append(Outcome(job.request, "planned"))

    def _miss_jobs(self) -> list[Any]:
        jobs = self.strategy.miss_jobs(self.report.sweep_id)
        self.report.malformed_rows += [str(error) for error in jobs.malformed]
        return jobs

    # ------------------------------------------------------------------ tuning

    def tune(self, models: list[ModelFile]) -> None:
        assert self.queue is not None
        if self.options.misses:
            for job in self._miss_jobs():
                if self.strategy.takes_miss(job):
                    self.queue.put(job)
        self.queue.close()
        if len(self.queue) == 0:
            return
        self.ensure_pool()
        if self.end_to_end is None and self.strategy.wants_pass():
            self.end_to_end = self._end_to_end_pass(models)
        assert self.dispatcher is not None and self.starter is not None
        where = f" at {self.settings.address}" if self.settings.address else " locally"
        lanes = f", {self.settings.jobs_per_gpu} at once per GPU" if self.device == "cuda" else ""
        self.progress.stage(f"starting the workers for {len(self.queue)} request(s) on Ray{where}{lanes}")
        pool = self.starter.pool()  # waits for the start if it is still going; raises its WorkerError
        kind = "GPU" if self.device == "cuda" else "CPU"
        description = (f"tuning {len(self.queue)} request(s) on "
                       f"{max(1, min(len(pool.slots), len(self.queue)))} {kind} worker(s)")
        passes = self.end_to_end.size if self.passes_beside is not None and self.end_to_end is not None else 0
        if passes:
            description += f", and {passes} end-to-end pass(es) as their models' GEMMs are answered"
        self.progress.start(len(self.queue) + passes, description)
        try:
            for outcome in self.dispatcher.outcomes():
                self.mark("first_result")
                outcome.model = self.found_in.get(outcome.request.key)
                self.report.outcomes.append(outcome)
                self.progress.advance(outcome)
        finally:
            self.readiness.release()  # however tuning ended, no pass waits for it any longer
        self.mark("last_result")
        began = self.dispatcher.began or time.perf_counter()
        self.report.tuning_seconds = time.perf_counter() - began
        self.report.startup_seconds = self.starter.ready_seconds or 0.0
        for milestone, seconds in dict(self.starter.milestones).items():  # a copy: its thread may still write
            self.report.mark(milestone, seconds)
        self.report.requeued = self.dispatcher.pool.requeued if self.dispatcher.pool else 0
        self.report.adopted = self.dispatcher.pool.adopted if self.dispatcher.pool else 0
        self.report.outcomes += [Outcome(job.request, STATUS_ELSEWHERE, model=self.found_in.get(job.request.key))
                                 for job in self.queue.elsewhere]
        self.report.store_error = self.dispatcher.pool.store_error if self.dispatcher.pool else None
        if self.report.store_error is not None:
            # Stopped at the first result the cache refused: what was not started stays to do.
            self.report.outcomes += [Outcome(job.request, STATUS_NOT_RUN, model=self.found_in.get(job.request.key))
                                     for job in self.queue.left()]

    def _end_to_end_pass(self, models: list[ModelFile]) -> EndToEndPass:
        """The pass run after tuning (on a CPU; on GPUs where none began beside capture)."""
        from .end_to_end import EndToEndPass

        return EndToEndPass(self.strategy.pass_specs(models), self.strategy.local_gpus(),
                            pass_costs(models, self.report.models), per_gpu=self.strategy.passes_per_gpu())

    def close(self) -> None:
        self.readiness.release()  # no pass waits on a sweep that ended
        for process in self.capture_processes:  # started, never used (the sweep stopped before capture)
            process.kill()
        if self.queue is not None:
            self.queue.close()
            self.queue.stop()
        if self.starter is not None:  # also when nothing is left to tune: the early pool goes unused
            self.starter.close()
        if self.spares is not None:  # those no actor claimed
            self.spares.close()


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
        sweep.prestart_captures()
        models = sweep.load()
        sweep.mark("models_loaded")
        if not options.dry_run:
            sweep.start_tuning(models)
            sweep.resumed = _resume_cut_pass(sweep, models)
            sweep.start_passes(models)
        sweep.capture(models)
        sweep.mark("capture_done")
        if not options.dry_run:
            sweep.tune(models)
        elif options.misses:
            sweep.plan_misses()
        if sweep.end_to_end is None and not options.dry_run and models:
            sweep.end_to_end = _pass_still_owed(sweep, models)
    except BaseException:
        for running in (sweep.end_to_end, sweep.resumed):
            if running is not None:
                running.close()
        if local_ray:
            _undo_early_start(sweep, None)  # its spares: sweep.close()
        raise
    finally:
        sweep.close()
    report = sweep.report
    if sweep.resumed is not None:  # before any later pass: two on one GPU would skew each other's timings
        sweep.progress.stage("finishing the end-to-end pass a cut sweep left (begun before capture)")
        report.pointwise = sweep.resumed.join()
        sweep.mark("resumed_pass_done")
    if sweep.end_to_end is not None and report.store_error is not None:
        sweep.end_to_end.close()  # it would write to a cache that refuses writes
        if sweep.passes_beside is not None:
            sweep.passes_beside.join()
        sweep.end_to_end = None
    if sweep.passes_beside is not None and sweep.end_to_end is not None:
        log.info("tuning done; waiting for the end-to-end passes begun beside it")
        _add_remote_lanes(sweep)
        later = sweep.passes_beside.join()
        sweep.mark("pointwise_done")
        report.pointwise = later if report.pointwise is None else _both(report.pointwise, later)
    elif sweep.end_to_end is not None:
        what = "tuning pointwise/reduction kernels" if sweep.device == "cuda" else "compiling the model end to end"
        signed = ", publishing signed artifacts" if settings.signing_key else ""
        sweep.progress.start(sweep.end_to_end.size, f"end-to-end pass: {what}{signed}")
        sweep.mark("pointwise_go")
        _add_remote_lanes(sweep)
        later = sweep.end_to_end.run(settings.request_timeout, on_done=sweep.progress.advance)
        sweep.mark("pointwise_done")
        report.pointwise = later if report.pointwise is None else _both(report.pointwise, later)
    report.wall_seconds = time.perf_counter() - sweep.started
    return report


def _joins_cluster(settings: Settings) -> bool:
    """The sweep tunes on a Ray cluster it joins (--address, RAY_ADDRESS), not a local one."""
    return bool(settings.address or os.environ.get("RAY_ADDRESS"))


def _add_remote_lanes(sweep: _Sweep) -> None:
    """On a cluster (--address), once tuning is over and its actors are gone, the other nodes'
    GPUs (on a CPU cluster, the other nodes) join the end-to-end pass (autotune/sweep/remote_passes.py)."""
    if sweep.end_to_end is None or not _joins_cluster(sweep.settings):
        return
    import ray

    if not ray.is_initialized():
        return
    from .remote_passes import makers, remote_lanes

    lanes = remote_lanes(sweep.device, sweep.strategy.passes_per_gpu())
    if lanes and sweep.end_to_end.add_lanes(makers(lanes)):
        log.info("the end-to-end passes also run on %d lane(s) of the cluster's other nodes", len(lanes))


class _PassesBeside:
    """The end-to-end pass on a thread, while the sweep's thread takes tuning's results."""

    def __init__(self, passes: EndToEndPass, timeout: float, on_done: Any, readiness: ModelReadiness) -> None:
        self.report: EndToEndReport | None = None
        self._thread = threading.Thread(target=self._run, args=(passes, timeout, on_done, readiness),
                                        name="autotune-passes", daemon=True)
        self._thread.start()

    def _run(self, passes: EndToEndPass, timeout: float, on_done: Any, readiness: ModelReadiness) -> None:
        self.report = passes.run(timeout, on_done=on_done, readiness=readiness)  # never raises

    def join(self) -> EndToEndReport:
        from .end_to_end import EndToEndReport

        self._thread.join()
        return self.report or EndToEndReport(error="the end-to-end pass ended without a report")


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
    if options.dry_run or _joins_cluster(settings) or not options.model_paths:
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
    if sweep is None or sweep.starter is None:
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


def _resume_cut_pass(sweep: _Sweep, models: list[ModelFile]) -> ResumedPass | None:
    """The passes a cut sweep of these models left begun and unfinished, started now
    (``resumed_pass``), where the strategy looks for them (``SweepStrategy.resumes_cut_pass``)."""
    if not sweep.strategy.resumes_cut_pass(models):
        return None
    from autotune.inductor_glue.env import kernel_config_environment

    from .resumed_pass import start_if_cut

    specs = sweep.strategy.pass_specs(models)
    resumed = start_if_cut(sweep.store, kernel_config_environment(sweep.device), specs,
                           sweep.strategy.local_gpus(), sweep.settings.request_timeout)
    if resumed is not None:
        sweep.mark("resumed_pass_go")
        sweep.progress.stage(f"going on with {len(resumed.digests)} end-to-end pass(es) a cut sweep left, "
                             "beside capture")
    return resumed


def _both(first: EndToEndReport, second: EndToEndReport) -> EndToEndReport:
    from .end_to_end import merge_reports

    return merge_reports([first, second], first.seconds + second.seconds)


def _pass_still_owed(sweep: _Sweep, models: list[ModelFile]) -> EndToEndPass | None:
    """The end-to-end pass of a sweep that tuned no GEMM, for the passes its strategy says are
    owed (``SweepStrategy.owed_passes``), or None."""
    replayed = {entry.path for entry in sweep.report.models if entry.reused_from}
    covered = sweep.resumed.covers if sweep.resumed is not None else None  # begun before capture
    specs = sweep.strategy.owed_passes(models, replayed, covered)
    if not specs:
        return None
    if not sweep.strategy.publishes():
        log.info("every GEMM was cached, but %d model(s) have no finished end-to-end pass: running it",
                 len(specs))
    from .end_to_end import EndToEndPass  # imports Inductor's compile stack: only for a pass that runs

    return EndToEndPass(specs, sweep.strategy.local_gpus(), per_gpu=sweep.strategy.passes_per_gpu())
