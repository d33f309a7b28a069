"""What a sweep tunes, and which end-to-end passes it owes: the sweep's strategy.

Decisions only, as kernel_tuner keeps its strategies apart from its runners: the order and the
lanes of capture, each captured request's verdict (cached, to tune, seen before), which logged
misses join, and which models' passes are wanted, owed or may be skipped. How the sweep runs
(Ray's pool, capture's processes, the queue, the passes' threads, the report) is the runner's
(runner.py), which asks these questions as it goes. It reads the store (cached keys, pass marks,
stored captures) and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.cache.records import Environment, Listing, TuningRequest
from autotune.inductor_glue.modelfile import ModelFile, parse_config_overrides
from autotune.settings import Settings

from .pass_spec import EndToEndSpec
from .plan import PlanStream
from .report import ModelCapture, SweepOptions

if TYPE_CHECKING:
    from autotune.workers.jobs import TuneJob


@dataclass
class SweepStrategy:
    """One sweep's decisions. ``local``: capture runs on this host (it has the device); else on a
    Ray worker, and no pass runs (this host cannot run the model)."""

    options: SweepOptions
    settings: Settings
    device: str
    local: bool
    store: Any
    kwargs: dict[str, Any] = field(init=False)  # capture's keywords, as the options and settings ask
    plan: PlanStream = field(init=False)
    cached_keys: dict[str, set[str]] = field(default_factory=dict)  # env key -> request keys stored ok
    training: set[str] = field(default_factory=set)  # model files that are training steps

    def __post_init__(self) -> None:
        self.kwargs = _capture_kwargs(self.options, self.settings, self.device)
        self.plan = PlanStream(force=self.options.force)

    # ------------------------------------------------------------------ capture

    def kwargs_for(self, model: ModelFile) -> dict[str, Any]:
        """Capture's keywords for ``model``: a file that defines train_step() is a training step's."""
        return {**self.kwargs, "train": self.kwargs["train"] or model.trains}

    def capture_order(self, models: list[ModelFile]) -> list[ModelFile]:
        """A training step's chain (its capture, its requests, then a pass over forward and
        backward kernels) is the longest (benchmarks/results/team_queue.md): captured first,
        and its requests tuned first (``priority``), its pass is not the last to begin."""
        models = sorted(models, key=lambda model: not self.kwargs_for(model)["train"])
        self.training = {str(model.path) for model in models if self.kwargs_for(model)["train"]}
        return models

    def priority(self, model: str) -> float:
        """A queued request's priority: a training step's go out first."""
        return float(model in self.training)

    def capture_lanes(self, models: int) -> int:
        """Captures at once: --capture-processes, else one per GPU here for a sweep of several
        models on GPUs (each capture times padding verdicts on its GPU). One where capture runs
        on a Ray worker, and for --ddp/--fsdp, whose capture sets up a process group."""
        if not self.local or self.options.distributed or models < 2:
            return 1
        wanted = self.settings.capture_processes
        if wanted is None:
            wanted = self.local_gpus() if self.device == "cuda" else 1
        return max(1, min(models, wanted))

    # ------------------------------------------------------------------ the plan

    def verdict(self, request: TuningRequest, env: Environment | None) -> str | None:
        """A captured request's verdict: plan.TUNE, plan.CACHED, or None for one seen before."""
        from autotune.workers.retime import without_busy_timed
        from autotune.workers.search import cached_keys

        env_key = env.key if env else ""
        if env is not None and env_key not in self.cached_keys:
            cached = cached_keys(self.store, env, self.settings.search)
            self.cached_keys[env_key] = without_busy_timed(self.store, env, cached) if self.settings.retime_busy \
                else cached
        return self.plan.add(request, env_key, self.cached_keys.get(env_key, set()))

    def miss_jobs(self, sweep_id: str) -> Listing[Any]:
        """The logged misses still to tune (``_miss_jobs``)."""
        return _miss_jobs(self.store, self.device, self.settings, sweep_id)

    def takes_miss(self, job: TuneJob) -> bool:
        """A logged miss joins the plan unless this sweep has planned its request already."""
        return self.plan.add(job.request, job.expected_env.key if job.expected_env else "", set()) is not None

    # ------------------------------------------------------------------ the end-to-end pass

    def wants_pass(self) -> bool:
        return _wants_end_to_end(self.local, self.settings, self.device)

    def publishes(self) -> bool:
        return _publishes(self.local, self.settings)

    def local_gpus(self) -> int:
        return _local_gpus(self.settings, self.device)

    def passes_per_gpu(self) -> int:
        return _passes_per_gpu(self.settings, self.device)

    def pass_specs(self, models: list[ModelFile]) -> list[EndToEndSpec]:
        return _end_to_end_specs(models, self.options, self.settings, self.device, self.kwargs)

    def pass_finished(self, path: str, specs: list[EndToEndSpec]) -> bool:
        """The last pass of the model at ``path`` finished (``pass_marks``)."""
        from autotune.inductor_glue.env import kernel_config_environment

        from . import pass_marks

        mine = [spec for spec in specs if spec.model_path == path]
        return bool(mine) and not pass_marks.unfinished(self.store, kernel_config_environment(self.device), mine)

    def skips_pass(self, path: str, found_new: bool, specs: list[EndToEndSpec]) -> bool:
        """A captured model's pass has nothing to do: no new winner for it, no artifacts to
        publish, and its last pass finished."""
        return not found_new and not self.publishes() and self.pass_finished(path, specs)

    def resumes_cut_pass(self, models: list[ModelFile]) -> bool:
        """Whether to look for the passes a cut sweep left: not with --force or --misses (their
        GEMMs are tuned anew first), nor with a signing key (a publishing pass compiles after
        every kernel of its model is tuned)."""
        options = self.options
        if options.force or options.misses or not models or self.publishes():
            return False
        return self.wants_pass()

    def owed_passes(self, models: list[ModelFile], replayed: set[str],
                    covered: Any = None) -> list[EndToEndSpec]:
        """The passes of a sweep that tuned no GEMM: with a signing key, what is not yet
        published; on a GPU, each model's whose last pass did not finish, cut after its GEMMs
        were stored (``pass_marks``), less those ``covered`` (a resumed pass) runs already."""
        publishes = self.publishes()
        if not publishes and not self.wants_pass():
            return []
        specs = self.pass_specs(models)
        if publishes:
            return self._not_yet_published(specs, replayed)
        from autotune.inductor_glue.env import kernel_config_environment

        from . import pass_marks

        specs = pass_marks.unfinished(self.store, kernel_config_environment(self.device), specs)
        return [spec for spec in specs if covered is None or not covered(spec)]

    def _not_yet_published(self, specs: list[EndToEndSpec], replayed: set[str]) -> list[EndToEndSpec]:
        """The publishing passes still owed where nothing was tuned: all but those of a model whose
        capture was replayed (``replayed``: its file and setup unchanged) and whose last pass
        finished, so that its artifacts, compiled with these same winners, are stored already. On
        a CPU only, where a pass runs only to publish: a GPU's finished pass may have been one that
        published nothing."""
        if self.device != "cpu" or not any(spec.model_path in replayed for spec in specs):
            return specs
        from autotune.inductor_glue.env import kernel_config_environment

        from . import pass_marks

        owed = pass_marks.unfinished(self.store, kernel_config_environment(self.device),
                                     [spec for spec in specs if spec.model_path in replayed])
        return [spec for spec in specs if spec.model_path not in replayed or spec in owed]


def captures_may_be_reused(options: SweepOptions, store: Any) -> bool:
    """Whether every model file has a stored capture of its bytes and these options, found
    before torch or Ray start: such a sweep starts Ray only if something is left to tune.
    Not with --force (it captures anew), nor for a file that cannot be read (the load says why)."""
    if options.force or not options.model_paths:
        return False
    from . import capture_reuse

    try:
        sources = [capture_reuse.source_digest(path, options) for path in options.model_paths]
    except OSError:
        return False
    return capture_reuse.may_exist(store, sources)


def _capture_kwargs(options: SweepOptions, settings: Settings, device: str) -> dict[str, Any]:
    return dict(batch_sizes=options.batch_sizes, mode=settings.mode,
                inductor_config=parse_config_overrides(options.inductor_config), train=options.train,
                device=device, dynamic=options.dynamic, distributed=options.distributed)


def _miss_jobs(store: Any, device: str, settings: Settings, sweep_id: str) -> Listing[Any]:
    """Jobs for every logged miss from a machine like this one (any config); the misses rows
    that failed validation are left out, in the listing's ``malformed``."""
    from autotune.inductor_glue.env import current_environment
    from autotune.workers.jobs import TuneJob
    from autotune.workers.search import search_overrides

    here = current_environment(device)
    logged = store.misses(None)
    jobs: Listing[Any] = Listing(malformed=logged.malformed)
    stored: dict[str, set[str]] = {}  # env key -> keys stored ok
    for miss in logged:
        env_key = miss.env.key
        if env_key not in stored:
            stored[env_key] = store.cached_request_keys(miss.env)
        if miss.request.key in stored[env_key]:
            continue  # answered since (a write-back role cannot clear the miss it answered)
        env = miss.env
        same_machine = (env.device_kind, env.device_name, env.torch_version, env.triton_version,
                        env.cuda_version, env.system_hash) == (
            here.device_kind, here.device_name, here.torch_version, here.triton_version,
            here.cuda_version, here.system_hash)
        if not same_machine:
            continue
        config = {k: v for k, v in env.config.items() if not (isinstance(v, str) and v.startswith("<"))}
        config.update(search_overrides(settings.search, settings.budget_s))
        jobs.append(TuneJob(miss.request, env, settings.mode, config, device, sweep_id))
    return jobs


def pass_costs(models: list[ModelFile], captured: list[ModelCapture]) -> list[float]:
    """Each model's expected pass time, by proxy: the GEMM lookups its capture made (a model
    with more GEMMs has more kernels to compile and tune); 1 for a model capture did not see."""
    entries = {entry.path: entry for entry in captured}
    return [capture_cost(entries.get(str(model.path))) for model in models]


def capture_cost(entry: ModelCapture | None) -> float:
    """A model's expected pass time, by proxy: the GEMM lookups its capture made, else its
    requests; 1 for a model capture did not see (or that made none)."""
    return float((entry.lookups or entry.requests) if entry is not None else 0) or 1.0


def _end_to_end_specs(models: list[ModelFile], options: SweepOptions, settings: Settings, device: str,
                     kwargs: dict[str, Any]) -> list[EndToEndSpec]:
    return [EndToEndSpec(str(model.path), options.entry, list(kwargs["batch_sizes"]), kwargs["mode"],
                          kwargs["inductor_config"], kwargs["train"] or model.trains, settings.cache, device,
                          signing_key=settings.signing_key, dynamic=options.dynamic,
                          distributed=options.distributed.to_json() if options.distributed else None)
            for model in models]


def _passes_per_gpu(settings: Settings, device: str) -> int:
    """Passes each GPU runs at once (--passes-per-gpu); on a CPU one, after tuning."""
    return settings.passes_per_gpu if device == "cuda" else 1


def _local_gpus(settings: Settings, device: str) -> int:
    """GPUs the pointwise pass may spread over: this host's, at most --gpus."""
    if device != "cuda":
        return 1
    import torch

    count = torch.cuda.device_count()
    return max(1, min(count, settings.gpus or count))


def _wants_end_to_end(local: bool, settings: Settings, device: str) -> bool:
    """The end-to-end pass, when there are GEMMs to tune: GPUs tune pointwise kernels
    in it, and with a signing key it publishes the compiled artifacts (CPU too). A
    host without the device (remote capture) cannot run the model."""
    tunes_pointwise = device == "cuda" and settings.kernel_configs
    return (tunes_pointwise or _publishes(local, settings)) and local and not settings.read_only


def _publishes(local: bool, settings: Settings) -> bool:
    """A signing key asks for the artifacts even when every GEMM was cached already:
    what is stored stays (written once), what is missing is published."""
    return bool(settings.signing_key and settings.artifacts) and local and not settings.read_only
