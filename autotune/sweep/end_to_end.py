"""The sweep's last step: one end-to-end compile and run with the new winners.

On GPUs it tunes the pointwise/reduction kernels once, for everyone; with a
signing key (GPU or CPU) it also publishes the compiled artifacts of that
compile (FX graphs, AOTAutograd entries, C++ kernels, Dynamo's package),
signed, so a fresh node loads them instead of compiling.

Which pointwise kernels a model has depends on which GEMMs won (a winning
Triton template absorbs its epilogue), so a model's pass runs once its own
GEMM requests are answered (autotune/sweep/pass_readiness.py), beside the tuning of
other models' requests, its timings taking turns with theirs on the GPU
(inductor_glue/gpu_lock.py): one compile with the warm-start hook (every GEMM a
hit) and one run, in which Inductor tunes each pointwise/reduction kernel as
max-autotune does, and the hook copies each winning config into the cache. A job on a fresh node then
compiles with those configs and tunes nothing.

It runs in its own fresh process (``python -m autotune.sweep.end_to_end``), as a job
would: in the sweep's process, which has compiled the model once already for
capture, some kernels came out with different source (so different keys) on a
GPU. The process starts while the GEMMs are tuned (imports, CUDA, the model),
then waits for the word to go.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from autotune.inductor_glue.capture import (
    Session,
    _run_once,
    build_session,
    compile_sessions,
    fresh_inductor,
    marked_calls,
    session_variants,
    tune_only_shard,
)
from autotune.inductor_glue.distributed import DistributedSpec, job_process_group, wrap
from autotune.inductor_glue.env import reprobe_vec_isa
from autotune.inductor_glue.modelfile import ModelFile
from autotune.settings import Settings
from autotune.workers.faults import inject_fault

from .pass_readiness import ModelReadiness
from .pass_spec import EndToEndSpec

log = logging.getLogger(__name__)

# How long a pass told to stop (SIGTERM) has to store what it tuned and report, before it is
# killed. Its writes wait for the end of a compile (the GIL, see serve_policy.py), and a sweep cut at
# its deadline lost them all: a CNN's training pass runs for minutes, most of them tuning
# hundreds of kernels.
STOP_GRACE_S = 30.0


class PassStopped(BaseException):
    """The pass was told to stop (SIGTERM or SIGINT): what it tuned so far is stored, nothing published.
    A BaseException, so that no ``except Exception`` on the way (Inductor's autotuning has
    several) takes it for a failed candidate."""


def _stop_on_signals() -> None:
    """SIGTERM (a deadline, a scheduler) or SIGINT (Ctrl-C at the sweep's terminal) raises
    PassStopped in the main thread, once: another, while the pass stores what it has, is
    ignored. Ctrl-C used to raise KeyboardInterrupt, which published a cut graph's artifacts."""
    import signal

    def stop(signum: int, frame: Any) -> None:
        for other in (signal.SIGTERM, signal.SIGINT):
            signal.signal(other, signal.SIG_IGN)
        raise PassStopped(f"signal {signum}")

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)


# Fusion and padding verdicts (inductor_glue/fusion.py, padding.py): HookStats counts them
# under the same names.
_VERDICT_COUNTS = ("fusion_verdicts_saved", "fusion_verdicts_served", "pad_decisions_saved", "pad_decisions_served")


@dataclass
class EndToEndReport:
    saved: int = 0  # kernel configs copied into the cache
    loaded: int = 0  # already there from an earlier sweep or job
    gemm_hits: int = 0
    gemm_misses: int = 0
    artifacts_published: int = 0  # signed compiled artifacts stored (with a signing key)
    republished: int = 0  # publishing compiles run again: the first tuned kernels after compiling them
    packages_refused: int = 0  # models Dynamo could not package (their graphs still travel)
    # Template fusions Inductor settled by benchmarking, stored; and ones served from the store.
    fusion_verdicts_saved: int = 0
    fusion_verdicts_served: int = 0
    pad_decisions_saved: int = 0
    pad_decisions_served: int = 0
    verdict_log: list[str] = field(default_factory=list)  # the hook's, per compile in order
    seconds: float = 0.0
    error: str | None = None
    saved_keys: list[str] = field(default_factory=list)
    missed: list[dict[str, Any]] = field(default_factory=list)  # the first GEMM misses (hook_stats.missed_entry)
    verdicts: list[dict[str, Any]] = field(default_factory=list)  # GEMMs timed in the graph (in_graph.py)
    # Each compile's kind and seconds, in order (where the pass's time goes).
    passes: list[dict[str, Any]] = field(default_factory=list)
    phases: list[dict[str, float]] = field(default_factory=list)  # per compile: longest_phases
    # The process's own start (imports, CUDA, the model), then its wait for the word to go:
    # a wait near 0 means the pass was not ready when the GEMMs were.
    startup_seconds: float = 0.0
    idle_seconds: float = 0.0
    ready_at: float | None = None  # epoch seconds when the process was ready (startup_seconds from it)
    # The passes that failed, each against its model: {"model", "shard", "error"} (merge_reports).
    failed: list[dict[str, Any]] = field(default_factory=list)
    requeued: int = 0  # passes run again in a fresh process after theirs was killed
    skipped: list[str] = field(default_factory=list)  # models whose pass had nothing to do

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def add(self, stats: Any) -> None:
        """Count one pass's hook stats in."""
        self.saved += stats.kernel_configs_saved
        self.loaded += stats.kernel_configs_loaded
        self.gemm_hits += stats.hits
        self.gemm_misses += stats.misses
        self.artifacts_published += stats.artifacts_published
        self.packages_refused += stats.packages_refused
        for name in _VERDICT_COUNTS:  # the hook's stats name them alike
            setattr(self, name, getattr(self, name) + getattr(stats, name))
        self.verdict_log += stats.verdict_log
        self.saved_keys += [k for k in stats.saved_keys if k not in self.saved_keys]
        self.missed += stats.missed
        self.verdicts += stats.verdicts


@dataclass(frozen=True)
class Pass:
    """One end-to-end compile of the pass."""

    settings: Settings
    time_in_graph: bool = False  # time each served GEMM here and store the verdict (in_graph.py)
    # A publishing compile that tunes a kernel withholds its artifacts and runs once more.
    may_republish: bool = True

    @property
    def publishes(self) -> bool:
        return bool(self.settings.signing_key)


def plan_passes(settings: Settings, device: str, time_in_graph: bool) -> list[Pass]:
    """The compiles to make. The first times the GEMMs in the graph when asked (on GPUs,
    where Inductor's fusion benchmarks weigh those timings against fresh ones).

    On a GPU with a signing key there are two. A compiled graph keeps its kernels'
    autotuners as they were built, with every heuristic config when the kernels were not
    tuned yet, and a node that loads it would tune them all again at their first run; and
    its GEMM choices must be the ones the verdicts give, as a job's are. So the first pass
    times and tunes, and stores the configs and verdicts (publishing nothing), and the
    second compiles as a job would, everything served, and publishes that.
    """
    device_tunes = device == "cuda" and settings.kernel_configs
    if not settings.signing_key or not (device_tunes or time_in_graph):
        return [Pass(settings, time_in_graph)]
    return [Pass(dataclasses.replace(settings, signing_key=None), time_in_graph), Pass(settings)]


def follow_up(current: Pass, verdict_changed: bool, withheld: bool) -> Pass | None:
    """The compile to insert after ``current``, if any.

    - A timing compile whose verdicts changed a winner: a served compile (publishing
      nothing), since a changed winner changes the kernels around it, whose configs must
      be tuned before the publishing compile builds them.
    - A publishing compile that withheld its artifacts: the same compile once more. Its
      kernels' sources can differ from the timing compile's (seen on a GPU: a training
      step's publishing compile tuned backward kernels, which its published graphs held
      untuned, and a job loading them tuned them again at its first call). They are
      stored now, so the second compile is served throughout.
    """
    if current.time_in_graph and verdict_changed:
        return Pass(current.settings)
    if withheld:
        return Pass(current.settings, may_republish=False)
    return None


def tune_pointwise(
    model: ModelFile,
    settings: Settings,
    *,
    batch_sizes: tuple[int | None, ...],
    mode: str,
    inductor_config: dict[str, Any] | None,
    train: bool,
    device: str,
    time_in_graph: bool = False,
    dynamic: bool = False,
    distributed: DistributedSpec | None = None,
) -> EndToEndReport:
    """Compile and run ``model`` with the hook installed, as capture did: once per batch
    size, and in the dynamic graphs capture compiled (``compile_sessions``: a dynamic
    kernel's source differs from its static twin's, so it has its own tuned config).
    Never raises.

    ``time_in_graph``: the first compile times each served GEMM in this process and stores
    the verdict. A published graph must hold no kernel it was compiled without a tuned
    config for: ``follow_up`` adds the compiles that make sure of it."""
    report = EndToEndReport()
    started = time.perf_counter()
    try:
        for session in compile_sessions(batch_sizes, dynamic):
            passes = plan_passes(settings, device, time_in_graph)
            while passes:
                current = passes.pop(0)
                began, began_at = time.perf_counter(), time.time()
                stats, withheld = _compile_once(model, current, session, mode, inductor_config, train,
                                                device, report, distributed)
                report.passes.append({"model": str(model.path), "batch_sizes": list(session.sizes),
                                      "dynamic": session.dynamic,
                                      "time_in_graph": current.time_in_graph,
                                      "publishes": current.publishes, "kernels_tuned": stats.kernel_configs_saved,
                                      "gemm_hits": stats.hits, "gemm_misses": stats.misses,
                                      "began_at": round(began_at, 3), "seconds": round(time.perf_counter() - began, 3)})
                after = follow_up(current, any(v["changed"] for v in stats.verdicts), withheld)
                if after is not None:
                    report.republished += int(withheld)
                    passes.insert(0, after)
    except PassStopped:  # its compile stored what it tuned; a later sweep's pass goes on from there
        report.error = (f"stopped after {time.perf_counter() - started:.0f} s; the {report.saved} kernel "
                        "configs tuned so far are stored")
        log.warning("the pass was stopped: %s", report.error)
    except Exception as exc:  # the GEMM results are stored already; this step is a bonus
        log.warning("tuning pointwise kernels failed: %s", exc, exc_info=True)
        report.error = f"{type(exc).__name__}: {exc}"
    report.seconds = time.perf_counter() - started
    return report


def _compile_once(model: ModelFile, current: Pass, session: Session, mode: str,
                  inductor_config: dict[str, Any] | None, train: bool, device: str,
                  report: EndToEndReport, distributed: DistributedSpec | None = None) -> tuple[Any, bool]:
    """One compile and run of the model, its hook stats counted into ``report``. Also
    whether it withheld its artifacts: a publishing compile that tuned a kernel, whose
    graph was compiled before that kernel's config was known (when it may run again)."""
    import torch

    from autotune.inductor_glue.timing import kernel_bound_timing
    from autotune.job.hook import warm_start_for_pass

    module, inputs, later = build_session(model, session)
    overrides = {**model.config_overrides, **(inductor_config or {})}
    # Fresh Inductor dirs: every kernel is compiled (and tuned) here, none reused.
    withheld = False
    with fresh_inductor(overrides), warm_start_for_pass(current.settings,
                                                        time_in_graph=current.time_in_graph) as handle:
        if device == "cpu" and current.publishes:
            reprobe_vec_isa()  # the ISA probes' builds go through the tier too: a job fetches them
        before = compile_phase_totals()
        try:
            # Every GPU timing of the pass is kernel-bound (inductor_glue/timing.py): its
            # pointwise autotuning and coordinate descent, whose winners jobs replay, its
            # fusion benchmarks and its GEMM verdicts. A pointwise kernel runs in a few
            # microseconds, less than its launch from Python: timed with the launch, its
            # configs look alike, more so on a CPU busy with other compiles.
            with kernel_bound_timing(device):
                for index, (dims, duck) in enumerate(session_variants(session, model, inputs)):
                    if index:  # the twin's inputs would pass the first graph's guards: compile it afresh
                        torch._dynamo.reset()
                    _run_end_to_end(model, module, (inputs, *later), mode, train, device, dims, duck, distributed)
            if device == "cuda":
                torch.cuda.synchronize()
            if current.publishes and current.may_republish and handle.kernels_tuned:
                dropped = handle.withhold_artifacts()
                withheld = True
                log.info("the publishing compile tuned %d kernel configs after compiling them: "
                         "%d artifacts withheld, compiling once more", handle.kernels_tuned, dropped)
        except PassStopped:  # a graph cut short publishes nothing; its data writes are kept
            handle.withhold_artifacts()
            raise
        finally:  # what a failed pass did store still counts
            handle.flush()
            report.add(handle.stats)
            report.phases.append(longest_phases(before, compile_phase_totals()))
    return handle.stats, withheld


def compile_phase_totals() -> dict[str, float]:
    """Seconds so far in each phase torch times (``dynamo_timed``: tracing, lowering,
    codegen, async compiles, runtime autotuning), summed over calls."""
    from torch._dynamo.utils import compilation_time_metrics

    return {name: sum(times) for name, times in compilation_time_metrics.items()}


def longest_phases(before: dict[str, float], after: dict[str, float], top: int = 15) -> dict[str, float]:
    """The ``top`` phases that took longest between two ``compile_phase_totals`` (nested
    phases each count in full, so they overlap; they show where time went, not a sum)."""
    spent = {name: seconds - before.get(name, 0.0) for name, seconds in after.items()}
    longest = sorted(((name, round(s, 3)) for name, s in spent.items() if s >= 0.05), key=lambda item: -item[1])
    return dict(longest[:top])


def _run_end_to_end(model: ModelFile, module: Any, calls: tuple[tuple[Any, ...], ...], mode: str, train: bool,
                    device: str, dynamic_dims: Any = None, duck: bool = False,
                    distributed: DistributedSpec | None = None) -> None:
    """Calls as a job makes them, into one compiled model (``_run_once``'s dynamic
    arguments). With --train and a model file that defines ``train_step(model, optimizer,
    inputs)`` (and optionally ``make_optimizer(module)``), whole training steps, the
    optimizer's step compiled too: its graphs are then tuned and published like the model's."""
    import sys

    import torch

    mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    if device == "cuda" and mark_step is not None:
        # max-autotune records CUDA graphs; without a step boundary, a training step's
        # later graphs (backward, the compiled optimizer) may find the forward's outputs
        # overwritten (seen on a GPU with examples/lm_train.py). A job marks its steps too.
        mark_step()
    source = sys.modules.get(getattr(model.factory, "__module__", ""), None)
    train_step = getattr(source, "train_step", None)
    if not (train and callable(train_step) and isinstance(module, torch.nn.Module)):
        _run_once(module, calls[0], mode, train, device, calls[1:], dynamic_dims=dynamic_dims, duck=duck,
                  distributed=distributed)
        return
    with job_process_group(distributed):
        module = wrap(module.to(device).train(True), distributed, device)
        make_optimizer = getattr(source, "make_optimizer", None)
        optimizer = make_optimizer(module) if callable(make_optimizer) else torch.optim.AdamW(module.parameters())
        optimizer.step = torch.compile(optimizer.step, mode=mode)  # type: ignore[method-assign]
        compiled = torch.compile(module, mode=mode, dynamic=True if duck else None)
        for inputs in marked_calls(calls, device, dynamic_dims, duck):
            if mark_step is not None and device == "cuda":
                mark_step()
            train_step(compiled, optimizer, inputs)


# ------------------------------------------------------------------ spread over GPUs


@dataclass(frozen=True)
class Shard:
    """One process of the pass: model ``model`` (an index), kernels of share ``rank`` of ``count``."""

    model: int
    rank: int = 0
    count: int = 1


def plan_lanes(models: int, gpus: int, costs: Sequence[float] | None = None) -> list[list[Shard]]:
    """Split the pass over ``gpus`` lanes: one GPU each, run side by side; a lane runs its
    shards one after another (two benchmarks sharing a GPU would disturb each other).

    Once the GEMM winners are stored, each pointwise/reduction kernel is tuned on its
    own, so the work splits freely. With no more GPUs than models, each lane takes whole
    models, the longest first: each model in turn, by ``costs`` (a model's expected pass
    time, or a proxy; equal if not given) from the largest, goes to the lane with the least
    work so far, which keeps the longest pass from starting last. With more GPUs than models,
    each model's kernels are split into shares, the spare GPUs going to the costliest models.
    """
    if models <= 0:
        return []
    gpus = max(1, gpus)
    weight = list(costs) if costs is not None and len(costs) == models else [1.0] * models
    longest_first = sorted(range(models), key=lambda model: -weight[model])  # stable: ties keep their order
    if gpus <= models:
        lanes: list[list[Shard]] = [[] for _ in range(gpus)]
        load = [0.0] * gpus
        for model in longest_first:
            lane = min(range(gpus), key=lambda index: load[index])
            lanes[lane].append(Shard(model))
            load[lane] += weight[model]
        return lanes
    counts = [gpus // models] * models
    for model in longest_first[:gpus % models]:
        counts[model] += 1
    return [[Shard(model, rank, counts[model])] for model in range(models) for rank in range(counts[model])]


def rank_copies(specs: list[EndToEndSpec], gpus: int) -> list[EndToEndSpec]:
    """The passes a distributed GPU job's other local ranks need: rank r compiles on cuda:r, and
    the device index is part of the FX-graph key (its inputs' devices) and of every generated
    kernel's source (so of its tuned config's file name). A pass on cuda:0 serves rank 0 alone;
    each further device index up to the job's world size, and this host's GPUs, gets a pass of
    its own, which compiles and publishes as that rank will (its GEMMs are the stored winners;
    no in-graph timing, which the cuda:0 pass does)."""
    copies = []
    for spec in specs:
        if spec.device != "cuda" or not spec.distributed or spec.device_index:
            continue
        ranks = min(int(spec.distributed.get("world_size") or 1), max(1, gpus))
        copies += [dataclasses.replace(spec, device_index=index, gpu=None, shard=[0, 1], time_in_graph=False)
                   for index in range(1, ranks)]
    return copies


def pass_lanes(models: int, gpus: int, per_gpu: int, splits: bool) -> int:
    """How many lanes the passes run in. More models than GPUs: up to ``per_gpu`` on each GPU,
    whole models only (never more lanes than models). Otherwise a GPU each, sharing models out
    where they may be split (``plan_lanes``), else one lane per model."""
    if models > gpus:
        return min(models, gpus * max(1, per_gpu))
    return gpus if splits else min(gpus, models)


def lane_gpus(lanes: int, gpus: int | None = None) -> list[str | None]:
    """The device each lane pins its processes to, within the sweep's own CUDA_VISIBLE_DEVICES
    (the passes' lanes, and capture's: autotune/sweep/capture_lanes.py): lane i on GPU i mod ``gpus``
    (default: a GPU per lane)."""
    if lanes <= 1:
        return [None]
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    gpus = max(1, gpus or lanes)
    return [visible[i % gpus] if i % gpus < len(visible) else str(i % gpus) for i in range(lanes)]


def merge_reports(reports: list[EndToEndReport], seconds: float) -> EndToEndReport:
    merged = EndToEndReport(seconds=seconds)
    for report in reports:
        for name in ("saved", "loaded", "gemm_hits", "gemm_misses", "artifacts_published", "packages_refused",
                     "republished", "requeued", *_VERDICT_COUNTS):
            setattr(merged, name, getattr(merged, name) + getattr(report, name))
        merged.saved_keys += [k for k in report.saved_keys if k not in merged.saved_keys]
        merged.verdicts += report.verdicts
        merged.missed += report.missed
        merged.verdict_log += report.verdict_log
        merged.passes += report.passes
        merged.phases += report.phases
        merged.failed += report.failed
        merged.skipped += report.skipped
    # The lane that was ready last, and waited least, says whether start-up held the pass up.
    merged.startup_seconds = max((r.startup_seconds for r in reports), default=0.0)
    merged.idle_seconds = min((r.idle_seconds for r in reports), default=0.0)
    errors = [r.error for r in reports if r.error]
    merged.error = "; ".join(errors) if errors else None
    return merged


class EndToEndPass:
    """Every model's end-to-end pass, spread over this host's GPUs.

    The first process of each lane starts at once (imports, CUDA, the model) and
    waits for the GEMM winners; ``run`` lets them go. With a signing key a model is
    never split: its publishing compile needs every one of its kernels tuned first.
    """

    def __init__(self, specs: list[EndToEndSpec], gpus: int = 1, costs: Sequence[float] | None = None,
                 cost_of: Callable[[str], float] | None = None, per_gpu: int = 1) -> None:
        """``costs``: each spec's expected pass time, or a proxy (the sweep gives each model's
        GEMM lookups), for ``plan_lanes`` to start the longest first. ``cost_of``: the same for
        a model file, asked when a lane picks among ready passes (a pass planned before capture
        knows its models' costs only as each is captured). ``per_gpu``: lanes each GPU runs
        when there are more models than GPUs (--passes-per-gpu), each lane whole models."""
        splits = not any(spec.signing_key for spec in specs)
        copies = rank_copies(specs, gpus)
        gpus = max(1, gpus - len(copies))  # the other ranks' passes take GPUs of their own
        self.lanes = plan_lanes(len(specs), pass_lanes(len(specs), gpus, per_gpu, splits), costs)
        self.gpu_ids = lane_gpus(len(self.lanes), gpus)
        self.units = [[dataclasses.replace(specs[s.model], shard=[s.rank, s.count], gpu=self.gpu_ids[i])
                       for s in lane] for i, lane in enumerate(self.lanes)]
        self.units += [[copy] for copy in copies]  # each its own lane, side by side
        self.first = [EndToEndProcess(lane[0]) for lane in self.units]
        self._waiting_first: list[EndToEndProcess | None] = list(self.first)  # not yet taken by its lane
        # The passes after each lane's first, longest first: a lane that is free takes the first
        # of them whose model's GEMMs are answered, whichever lane plan_lanes dealt it to.
        weight = list(costs) if costs is not None and len(costs) == len(specs) else [1.0] * len(specs)
        later = [(weight[shard.model], unit) for shards, units in zip(self.lanes, self.units)
                 for shard, unit in zip(shards[1:], units[1:])]
        self._later = [unit for _, unit in sorted(later, key=lambda pair: -pair[0])]
        self._cost_of = cost_of
        self.skipped: list[str] = []  # model files whose pass had nothing to do
        self._taking = threading.Lock()
        self._closed = False  # close(): a lane takes nothing more
        self.started: list[PassProcess] = []  # the later passes' processes, for close()
        # Lanes added while the pass runs (add_lanes: another node's GPUs), and their reports.
        self._extra: list[threading.Thread] = []
        self._extra_reports: list[EndToEndReport] = []
        self._finished = False  # every planned lane ended: a lane added now would find nothing
        self._running = threading.Event()  # run() began: the added lanes have its arguments
        self._run_args: tuple[float, Callable[[str], None] | None, ModelReadiness | None] = (0.0, None, None)

    @property
    def size(self) -> int:
        """How many processes the pass runs: a model each, or a share of one."""
        return sum(len(lane) for lane in self.units)

    def run(self, timeout: float, on_done: Callable[[str], None] | None = None,
            readiness: ModelReadiness | None = None) -> EndToEndReport:
        """Run every lane side by side; ``on_done`` gets each process's model file as it ends
        (the sweep's progress). With ``readiness`` a pass starts once its model's GEMMs are
        answered, while other requests are still being tuned; without, at once. Never raises."""
        import concurrent.futures

        started = time.perf_counter()
        self._run_args = (timeout, on_done, readiness)
        self._running.set()
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(self.units))) as pool:
            lanes = list(pool.map(lambda i: self._run_lane(i, timeout, on_done, readiness), range(len(self.units))))
        with self._taking:  # nothing is left to take: a lane added from now on starts no pass
            self._finished = True
            extra = list(self._extra)
        for thread in extra:  # each ends with the pass it is running
            thread.join()
        merged = merge_reports([r for lane in lanes for r in lane] + self._extra_reports, time.perf_counter() - started)
        merged.skipped = list(self.skipped)
        return merged

    def add_lanes(self, makers: Sequence[Callable[[EndToEndSpec], PassProcess]]) -> int:
        """More lanes while the pass runs, each starting its passes with its maker (a pass on
        another node's GPU: autotune/sweep/remote_passes.py); they take the passes no lane has begun.
        How many were added (none once every planned lane has ended)."""
        with self._taking:
            if self._finished or self._closed:
                return 0
            for make in makers:
                thread = threading.Thread(target=self._run_extra_lane, args=(make,), name="autotune-pass-lane",
                                          daemon=True)
                self._extra.append(thread)
                thread.start()
        return len(makers)

    def _run_extra_lane(self, make: Callable[[EndToEndSpec], PassProcess]) -> None:
        self._running.wait()
        timeout, on_done, readiness = self._run_args
        reports = self._run_lane(None, timeout, on_done, readiness, make)
        with self._taking:
            self._extra_reports.extend(reports)

    def _run_lane(self, index: int | None, timeout: float, on_done: Callable[[str], None] | None,
                  readiness: ModelReadiness | None,
                  make: Callable[[EndToEndSpec], PassProcess] | None = None) -> list[EndToEndReport]:
        """The lane's passes one after another: its first (started early), then whichever later
        pass is ready first (an added lane, ``index`` None, has no first and starts its passes
        with ``make``). A pass whose process was SIGKILLed by someone else (the OOM killer), or
        that another node could not run (``rerun_here``: its node lost, or a model file that
        needs files beside it), runs once more in a fresh process on this host; one that fails
        is recorded against its model, and the lane goes on to the next (an added lane whose
        node was lost ends)."""
        reports = []
        while (taken := self._take(index, readiness, on_done, make)) is not None:
            spec, process = taken
            report = process.run(timeout)
            if process.rerun_here:
                log.warning("the end-to-end pass of %s was killed or failed elsewhere (%s); running it again here",
                            spec.model_path, report.error)
                with self._taking:
                    if self._closed:
                        break
                    again = EndToEndProcess(spec if index is not None else dataclasses.replace(spec, gpu=None))
                    self.started.append(again)
                report = again.run(timeout)
                report.requeued += 1
            if report.error:
                report.failed.append({"model": spec.model_path, "shard": list(spec.shard), "error": report.error})
            reports.append(report)
            if on_done is not None:
                on_done(spec.model_path)
            if process.lost:
                break
        return reports

    def _take(self, index: int | None, readiness: ModelReadiness | None, on_done: Callable[[str], None] | None,
              make: Callable[[EndToEndSpec], PassProcess] | None = None) -> tuple[EndToEndSpec, PassProcess] | None:
        """The lane's next pass: its own first while that is ready, else the costliest ready
        later one (a rank's copy takes its own only); waits while none is. A model whose pass is
        skipped is dropped. None: nothing is left."""
        shared = index is None or index < len(self.lanes)  # the rank copies' lanes keep to their own device
        while True:
            with self._taking:
                if self._closed:
                    return None
                first = self._waiting_first[index] if index is not None else None
                own = [self.units[index][0]] if index is not None and first is not None else []
                candidates = own + (self._later if shared else [])
                if not candidates:
                    return None
                ready = [i for i, spec in enumerate(candidates)
                         if readiness is None or readiness.ready(spec.model_path)]
                skipped = [i for i in ready if readiness is not None and readiness.skipped(candidates[i].model_path)]
                if skipped:
                    self._drop(index, skipped[0] - len(own), candidates[skipped[0]])
                elif ready and own and ready[0] == 0:
                    assert first is not None and index is not None
                    self._waiting_first[index] = None
                    return own[0], first
                elif ready:
                    chosen = max(ready, key=lambda i: self._cost(candidates[i]))  # ties: the first
                    gpu = self.gpu_ids[index] if index is not None else None  # an added lane's node gives it one
                    spec = dataclasses.replace(self._later.pop(chosen - len(own)), gpu=gpu)
                    process = (make or EndToEndProcess)(spec)
                    self.started.append(process)
                    return spec, process
            if skipped:
                if on_done is not None:
                    on_done(candidates[skipped[0]].model_path)
                continue
            assert readiness is not None
            readiness.first_ready([spec.model_path for spec in candidates], timeout=1.0)

    def _drop(self, index: int | None, later: int, spec: EndToEndSpec) -> None:
        """Leave out a skipped model's pass (the lock held): ``later`` is its place among the later
        passes, or negative for the lane's own first, whose waiting process then ends."""
        if later < 0 and index is not None:
            first = self._waiting_first[index]
            self._waiting_first[index] = None
            if first is not None:
                first.close()
        else:
            self._later.pop(later)
        self.skipped.append(spec.model_path)
        log.info("no end-to-end pass for %s: every GEMM was cached and its last pass finished", spec.model_path)

    def _cost(self, spec: EndToEndSpec) -> float:
        return self._cost_of(spec.model_path) if self._cost_of is not None else 0.0

    def close(self) -> None:
        """Stop every pass: those running, those waiting for the word, and those not begun."""
        with self._taking:
            self._later.clear()
            self._closed = True
        for process in [*self.first, *self.started]:
            process.close()


# ------------------------------------------------------------------ the process

_RESULT = "POINTWISE "


class PassProcess(Protocol):
    """A pass's process: here (EndToEndProcess), or on another node (remote_passes.py)."""

    @property
    def rerun_here(self) -> bool:
        """Its pass is to run again in a fresh process on the sweep's host."""

    @property
    def lost(self) -> bool:
        """Where it ran is gone: its lane takes nothing more."""

    def run(self, timeout: float) -> EndToEndReport: ...

    def close(self) -> None: ...


class EndToEndProcess:
    """The fresh process: started early, told to go once the GEMM winners are stored."""

    def __init__(self, spec: EndToEndSpec) -> None:
        from autotune.workers.environment import clean_environment

        env = clean_environment()
        if spec.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = spec.gpu
        self.spawned_at = time.time()
        self._stopped = False  # sent SIGTERM by us (its timeout), or killed by us
        self.proc = subprocess.Popen([sys.executable, "-m", "autotune.sweep.end_to_end", spec.to_json()],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)

    def run(self, timeout: float, grace: float = STOP_GRACE_S) -> EndToEndReport:
        """Go, wait for the report (at most ``timeout`` s); past it, tell the process to stop
        and give it ``grace`` s to store what it tuned and report. Never raises."""
        started = time.perf_counter()
        try:
            stdout, _ = self.proc.communicate(input="go\n", timeout=timeout)
        except subprocess.TimeoutExpired:
            report = self._stop(grace)
            report.error = f"timed out after {timeout:.0f} s" + (f" ({report.error})" if report.error else "")
            report.seconds = time.perf_counter() - started
            return report
        except (OSError, ValueError) as exc:  # it died while starting: a closed pipe
            self.close()
            return EndToEndReport(error=f"the process died: {exc}", seconds=time.perf_counter() - started)
        return self._report(stdout) or EndToEndReport(
            error=f"the process exited {self.proc.returncode} without a report", seconds=time.perf_counter() - started)

    @property
    def killed(self) -> bool:
        """Ended by a SIGKILL that did not come from us (the OOM killer, a node going away). A
        SIGINT or SIGTERM is someone stopping the sweep: never a reason to run the pass again."""
        return self.proc.returncode == -signal.SIGKILL and not self._stopped

    @property
    def rerun_here(self) -> bool:
        """Killed by someone else (the OOM killer): it runs once more."""
        return self.killed

    @property
    def lost(self) -> bool:
        return False  # this host is the sweep's own

    def _stop(self, grace: float) -> EndToEndReport:
        """SIGTERM, then the report the process writes once it has stored what it tuned; killed
        if it has none within ``grace`` s."""
        self._stopped = True
        try:
            self.proc.terminate()
            stdout, _ = self.proc.communicate(timeout=grace)
        except (subprocess.TimeoutExpired, OSError, ValueError):
            self.close()
            return EndToEndReport(error=f"killed: no report {grace:.0f} s after SIGTERM")
        return self._report(stdout) or EndToEndReport(error=f"exited {self.proc.returncode} without a report")

    def _report(self, stdout: str) -> EndToEndReport | None:
        return report_from(stdout, self.spawned_at)

    def close(self) -> None:
        if self.proc.poll() is None:
            self._stopped = True
            self.proc.kill()
        self.proc.wait()


def report_from(stdout: str, spawned_at: float) -> EndToEndReport | None:
    """The report a pass process printed last, its start-up counted from ``spawned_at``."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(_RESULT):
            report = EndToEndReport(**json.loads(line[len(_RESULT):]))
            if report.ready_at is not None:
                report.startup_seconds = round(report.ready_at - spawned_at, 3)
            return report
    return None


def _serve(spec: EndToEndSpec, go: IO[str]) -> EndToEndReport:
    import torch

    from autotune.inductor_glue.env import pin_triton_toolchain
    from autotune.inductor_glue.modelfile import load_model_file

    pin_triton_toolchain()
    model = load_model_file(spec.model_path, spec.entry)
    if spec.device == "cuda":
        torch.cuda.set_device(spec.device_index)  # "cuda" is then cuda:<index>, as in that rank
        torch.cuda.init()
    ready, ready_at = time.perf_counter(), time.time()
    if go.readline().strip() != "go":  # the sweep ended without storing winners
        return EndToEndReport(error="cancelled")
    idle = time.perf_counter() - ready
    settings = Settings.from_env(cache=spec.cache, signing_key=spec.signing_key)
    inject_fault(settings.fault_inject, f"pass:{Path(spec.model_path).stem}")
    _leave_mark(spec, settings, finished=False)  # its GEMMs are stored: a cut pass may resume beside capture
    # A share of a model's kernels compiles the whole model in each of several processes,
    # which must all weigh the same GEMM timings: those stored, not each its own.
    time_in_graph = spec.time_in_graph
    if time_in_graph is None:
        time_in_graph = settings.time_in_graph and spec.device == "cuda" and spec.shard[1] == 1
    with tune_only_shard(*spec.shard):
        report = tune_pointwise(model, settings, batch_sizes=tuple(spec.batch_sizes), mode=spec.mode,
                                inductor_config=spec.inductor_config, train=spec.train, device=spec.device,
                                time_in_graph=time_in_graph, dynamic=spec.dynamic,
                                distributed=DistributedSpec.from_json(spec.distributed))
    report.ready_at, report.idle_seconds = ready_at, round(idle, 3)
    if report.error is None:
        _leave_mark(spec, settings, finished=True)
    return report


def _leave_mark(spec: EndToEndSpec, settings: Settings, finished: bool) -> None:
    """Tell later sweeps this pass began, or is done (``pass_marks``); a read-only cache takes no
    mark, nor does another rank's copy of a pass (``rank_copies``: the cuda:0 pass marks the model)."""
    if settings.read_only or spec.device_index:
        return
    from autotune.cache.store import Store
    from autotune.inductor_glue.env import kernel_config_environment

    from . import pass_marks

    try:
        store = Store(settings.cache)
    except Exception:  # the hook has logged why already; the next sweep runs the pass again
        log.warning("could not open the cache to mark the pass", exc_info=True)
        return
    try:
        mark = pass_marks.mark_finished if finished else pass_marks.mark_started
        mark(store, kernel_config_environment(spec.device), spec)
    finally:
        store.close()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    spec = EndToEndSpec(**json.loads(argv[0]))
    _stop_on_signals()
    try:
        report = _serve(spec, sys.stdin)
    except PassStopped:  # before the pass began (loading the model, waiting for the word)
        report = EndToEndReport(error="stopped before the pass began")
    except Exception as exc:  # a model that fails to load here loaded fine in capture: report, do not crash
        report = EndToEndReport(error=f"{type(exc).__name__}: {exc}")
    sys.stdout.write(_RESULT + json.dumps(report.to_json()) + "\n")
    sys.stdout.flush()
    os._exit(0)  # compile workers and CUDA teardown are not worth waiting for


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
