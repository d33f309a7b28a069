"""Capture, as the sweep runs it: each model captured here, in processes of its own side by side,
on a GPU node of the cluster, or replayed from the capture a sweep stored before; every request
found goes to the plan (planning.py) as capture finds it, and capture's padding verdicts to the store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.cache.records import Environment, TuningRequest
from autotune.inductor_glue.modelfile import ModelFile, ModelFileError, load_model_file
from autotune.settings import Settings

from .context import SweepContext
from .planning import Planner
from .report import ModelCapture, SweepOptions

if TYPE_CHECKING:  # torch comes with capture, Ray with a capture elsewhere
    from autotune.inductor_glue.capture import CaptureResult

    from .capture_lanes import LaneProcess
    from .capture_reuse import Record


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


def _pad_decisions(ctx: SweepContext) -> dict[str, dict[str, Any]]:
    """Padding verdicts stored by earlier sweeps or jobs on this kind of GPU (none on a CPU,
    where Inductor does not time them): capture pads as they did."""
    from autotune.inductor_glue import padding

    return padding.stored_decisions(ctx.store, padding.filed_under(ctx.device))


def _store_pad_decisions(ctx: SweepContext, decisions: dict[str, dict[str, Any]], env: Environment | None = None) -> None:
    """Store the padding verdicts capture timed, before the pass and the jobs need them,
    under ``env`` (a remote capture's GPU) or this host's device."""
    if decisions and not ctx.settings.read_only and not ctx.options.dry_run:  # a dry run writes nothing
        from autotune.inductor_glue import padding

        target = env or padding.filed_under(ctx.device)
        if target is not None:  # None: a CPU, where Inductor times no padding
            ctx.store.put_kernel_configs(target, decisions)


class CaptureRun:
    """Every model's capture in one sweep; ``on_captured`` hears of each model whose capture is
    complete (its pass may then be decided)."""

    def __init__(self, ctx: SweepContext, planner: Planner, on_captured: Callable[[ModelCapture], None],
                 may_reuse: bool = False) -> None:
        """``may_reuse``: every model has a stored capture of its source and options
        (``capture_reuse.may_exist``), so no capture process starts before the records are read."""
        self.ctx, self.planner, self.on_captured, self.may_reuse = ctx, planner, on_captured, may_reuse
        self.processes: list[LaneProcess] = []  # started with the sweep (prestart)
        self.keys: dict[str, str] = {}  # model path -> its capture's record key (capture_reuse)
        self.records: dict[str, Record] = {}  # model path -> the stored capture this sweep replays
        self.streamed: dict[str, list[tuple[TuningRequest, Environment | None]]] = {}  # what capture found

    def prestart(self) -> None:
        """Capture's processes, when models are to be captured side by side, started now: their
        imports overlap this process's (the model files, Ray's start) instead of following them."""
        lanes = self.ctx.strategy.capture_lanes(len(self.ctx.options.model_paths))
        if lanes > 1 and not self.may_reuse:  # a model whose capture is replayed needs no process
            from .capture_lanes import prestart

            self.processes = prestart(lanes, cuda=self.ctx.device == "cuda")

    def load(self) -> list[ModelFile]:
        """Every model file: bad input fails here (exit 2). Models captured in processes of their
        own are built there, side by side, and a build that fails there fails again in this
        process's own capture (exit 2 too, after Ray's start)."""
        paths, strategy = self.ctx.options.model_paths, self.ctx.strategy
        build = strategy.capture_lanes(len(paths)) == 1
        models = [_load(path, self.ctx.options, strategy.local, build) for path in paths]
        self._look_up(models)
        return models

    def all_replayed(self, models: list[ModelFile]) -> bool:
        return bool(models) and all(str(model.path) in self.records for model in models)

    def capture(self, models: list[ModelFile]) -> None:
        ctx = self.ctx
        models = [model for model in ctx.strategy.capture_order(models) if not self._replay(model)]
        lanes = ctx.strategy.capture_lanes(len(models))
        if lanes > 1:
            models = self._side_by_side(models, lanes)  # those left: their process failed
        for model in models:
            entry = next((e for e in ctx.report.models if e.path == str(model.path)), None)
            if entry is None:
                entry = ModelCapture(str(model.path))
                ctx.report.models.append(entry)
            ctx.progress.stage(f"capturing {model.path} ({ctx.settings.mode}, {ctx.device})")
            self._here(model, entry)

    def close(self) -> None:
        for process in self.processes:  # started, never used (the sweep stopped before capture)
            process.kill()

    def _overrides(self, model: ModelFile) -> dict[str, Any]:
        return {**model.config_overrides, **self.ctx.strategy.kwargs["inductor_config"]}

    def _here(self, model: ModelFile, entry: ModelCapture) -> None:
        """Capture ``model`` in this process (or, without the device here, on a Ray worker)."""
        ctx = self.ctx
        streamed = self.streamed[entry.path] = []

        def found(request: TuningRequest, env: Environment | None) -> None:
            streamed.append((request, env))
            entry.new += self.planner.found(request, env, self._overrides(model), entry.path)

        if ctx.strategy.local:
            from autotune.inductor_glue.capture import capture_model

            captured = capture_model(model, on_request=found, pad_decisions=_pad_decisions(self.ctx),
                                     **ctx.strategy.kwargs_for(model))
            _store_pad_decisions(self.ctx, captured.pad_decisions)
            self._keep(entry.path, captured.total_lookups, captured.seconds)
        else:
            captured, pad_env = _remote_capture(str(model.path), ctx.options, ctx.settings,
                                                ctx.strategy.kwargs_for(model), ctx.store)
            _store_pad_decisions(self.ctx, captured.pad_decisions, pad_env)
            for request in captured.requests:
                entry.new += self.planner.found(request, captured.env, captured.config_overrides, entry.path)
        self._record(entry, captured.env, len(captured.requests), captured.total_lookups, captured.seconds)

    def _side_by_side(self, models: list[ModelFile], lanes: int) -> list[ModelFile]:
        """Capture ``models`` in processes of their own, ``lanes`` at a time (autotune/sweep/capture_lanes.py),
        planning each request as it comes; the models whose process failed, to capture here."""
        from .capture_lanes import capture_side_by_side

        ctx = self.ctx
        entries = {str(model.path): ModelCapture(str(model.path)) for model in models}
        ctx.report.models += entries.values()
        by_path = {str(model.path): model for model in models}
        ctx.progress.stage(f"capturing {len(models)} models, {lanes} at a time ({ctx.settings.mode}, {ctx.device})")
        specs = self._specs(by_path)
        failed: list[ModelFile] = []
        started, self.processes = self.processes, []
        with contextlib.closing(capture_side_by_side(specs, lanes, started)) as captures:
            for found in captures:  # no process outlives the loop
                model, entry = by_path[found.model_path], entries[found.model_path]
                if found.request is not None:
                    self.streamed.setdefault(found.model_path, []).append((found.request, found.env))
                    entry.new += self.planner.found(found.request, found.env, self._overrides(model), entry.path)
                elif found.bad_input is not None:
                    raise ModelFileError(found.bad_input)
                elif found.result is None:
                    failed.append(model)
                else:
                    self._captured_elsewhere(entry, found.result)
        return failed

    def _specs(self, by_path: dict[str, ModelFile]) -> list[Any]:
        """What each process of its own captures: JSON, so never --ddp/--fsdp."""
        from .capture_lanes import CaptureSpec

        specs = []
        for path, model in by_path.items():
            kwargs = {**self.ctx.strategy.kwargs_for(model), "batch_sizes": list(self.ctx.strategy.kwargs["batch_sizes"])}
            kwargs.pop("distributed", None)
            specs.append(CaptureSpec(path, self.ctx.options.entry, kwargs, _pad_decisions(self.ctx)))
        return specs

    def _captured_elsewhere(self, entry: ModelCapture, result: dict[str, Any]) -> None:
        _store_pad_decisions(self.ctx, result["pad_decisions"])
        env = Environment.from_json(result["env"]) if result["env"] else None
        self._keep(entry.path, result["total_lookups"], result["seconds"])
        self._record(entry, env, result["requests"], result["total_lookups"], result["seconds"])

    def _look_up(self, models: list[ModelFile]) -> None:
        """Each model's capture key (capturing here only), and the stored capture under it
        unless --force asks for a fresh one (autotune/sweep/capture_reuse.py)."""
        ctx = self.ctx
        if not ctx.strategy.local:
            return
        from . import capture_reuse

        for model in models:
            path = str(model.path)
            source = capture_reuse.source_digest(path, ctx.options)
            key = capture_reuse.record_key(source, capture_reuse.setup_digest(model, ctx.strategy.kwargs_for(model)))
            self.keys[path] = key
            record = None if ctx.options.force else capture_reuse.find(ctx.store, key)
            if record is not None:
                self.records[path] = record
        ctx.mark("captures_looked_up")

    def _replay(self, model: ModelFile) -> bool:
        """Plan ``model``'s requests from its stored capture, in the order capture found them,
        as capture would have; False where it has none."""
        record = self.records.get(str(model.path))
        if record is None:
            return False
        entry = ModelCapture(str(model.path), reused_from=record.at)
        self.ctx.report.models.append(entry)
        self.ctx.progress.stage(f"reusing the capture of {model.path} from {record.at}")
        overrides = self._overrides(model)
        for request, env in record.found:
            entry.new += self.planner.found(request, env, overrides, entry.path)
        env = next((env for _, env in record.found if env is not None), None)
        self._record(entry, env, len(record.found), record.lookups, 0.0)
        return True

    def _keep(self, path: str, lookups: int, seconds: float) -> None:
        """Store what capture of ``path`` streamed, for a later sweep to replay; not from a dry
        run or a read-only sweep (they write nothing), nor a capture elsewhere (no key)."""
        ctx = self.ctx
        key = self.keys.get(path)
        if key is None or ctx.options.dry_run or ctx.settings.read_only:
            return
        from . import capture_reuse

        found = self.streamed.get(path, [])
        env = next((env for _, env in found if env is not None), None)
        if env is None:  # no request: filed with the pass marks (the ISA is probed by now)
            from autotune.inductor_glue.env import kernel_config_environment

            env = kernel_config_environment(ctx.device)
        capture_reuse.save(ctx.store, env, key, path, capture_reuse.Record.now(found, lookups, seconds))

    def _record(self, entry: ModelCapture, env: Environment | None, requests: int, lookups: int,
                seconds: float) -> None:
        """What capture of ``entry``'s model found, in the report; then its pass may be decided."""
        report = self.ctx.report
        report.env = report.env or env
        entry.requests, entry.lookups, entry.seconds = requests, lookups, seconds
        report.capture_seconds += seconds
        self.on_captured(entry)
