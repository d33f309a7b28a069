"""The end-to-end pass, as the sweep runs it: a pass a cut sweep left, resumed beside capture; on
GPUs the pass begun beside capture and tuning (each model's once its GEMMs are answered); else the
pass after tuning, or the one still owed by a sweep that tuned nothing; the cluster's other nodes
joining it once tuning is over.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from autotune.inductor_glue.modelfile import ModelFile

from .context import SweepContext
from .pass_readiness import ModelReadiness
from .pass_spec import EndToEndSpec
from .report import ModelCapture
from .strategy import capture_cost, pass_costs
from .tuning_run import joins_cluster

if TYPE_CHECKING:  # the pass imports Inductor's compile stack: only for a pass that runs
    from .end_to_end import EndToEndPass, EndToEndReport
    from .resumed_pass import ResumedPass

log = logging.getLogger(__name__)


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


def _both(first: EndToEndReport, second: EndToEndReport) -> EndToEndReport:
    from .end_to_end import merge_reports

    return merge_reports([first, second], first.seconds + second.seconds)


class PassRun:
    """One sweep's end-to-end passes: which run, when, and their reports in the sweep's."""

    def __init__(self, ctx: SweepContext) -> None:
        self.ctx = ctx
        self.end_to_end: EndToEndPass | None = None
        self.resumed: ResumedPass | None = None  # a cut pass, started again beside capture
        self.beside: _PassesBeside | None = None  # the pass, run while tuning goes on
        self._specs: list[EndToEndSpec] = []  # the pass begun beside capture's (start_beside)

    def resume_cut(self, models: list[ModelFile]) -> None:
        """The passes a cut sweep of these models left begun and unfinished, started now
        (``resumed_pass``), where the strategy looks for them (``SweepStrategy.resumes_cut_pass``)."""
        ctx = self.ctx
        if not ctx.strategy.resumes_cut_pass(models):
            return
        from autotune.inductor_glue.env import kernel_config_environment

        from .resumed_pass import start_if_cut

        specs = ctx.strategy.pass_specs(models)
        self.resumed = start_if_cut(ctx.store, kernel_config_environment(ctx.device), specs,
                                    ctx.strategy.local_gpus(), ctx.settings.request_timeout)
        if self.resumed is not None:
            ctx.mark("resumed_pass_go")
            ctx.progress.stage(f"going on with {len(self.resumed.digests)} end-to-end pass(es) a cut sweep left, "
                               "beside capture")

    def start_beside(self, models: list[ModelFile]) -> None:
        """On GPUs, start the end-to-end pass before capture, on a thread: each model's pass begins
        once its capture is complete and its GEMMs are answered, beside the capture and tuning of
        the others (their timings take turns on the GPU). Not behind a resumed pass, which runs
        first; on a CPU, a pass's compile would slow the timings beside it, so it runs after."""
        ctx = self.ctx
        if ctx.device != "cuda" or self.resumed is not None or not models:
            return
        if not ctx.strategy.wants_pass():
            return
        from .end_to_end import EndToEndPass

        self._specs = ctx.strategy.pass_specs(models)
        self.end_to_end = EndToEndPass(self._specs, ctx.strategy.local_gpus(),
                                       [float(spec.train) + 1 for spec in self._specs], self._cost,
                                       ctx.strategy.passes_per_gpu())
        ctx.mark("pointwise_go")
        self.beside = _PassesBeside(self.end_to_end, ctx.settings.request_timeout, ctx.progress.advance,
                                    ctx.readiness)

    def _cost(self, path: str) -> float:
        """A captured model's expected pass time, by proxy (``capture_cost``)."""
        return capture_cost(next((e for e in self.ctx.report.models if e.path == path), None))

    def captured(self, entry: ModelCapture) -> None:
        """Capture of ``entry``'s model is complete: its pass, begun beside capture, may go once its
        GEMMs are answered, or is left out when it has nothing to do (no new winner for it, no
        artifacts to publish, and its last pass finished)."""
        readiness = self.ctx.readiness
        if self.beside is not None and \
                self.ctx.strategy.skips_pass(entry.path, readiness.found_new(entry.path), self._specs):
            readiness.skip(entry.path)
        else:
            readiness.captured(entry.path)

    def after_tuning(self, models: list[ModelFile]) -> int:
        """Tuning starts: the pass run after it, where the strategy wants one and none began beside
        capture (on a CPU; on GPUs where none began). How many passes run beside tuning."""
        ctx = self.ctx
        if self.end_to_end is None and ctx.strategy.wants_pass():
            from .end_to_end import EndToEndPass

            self.end_to_end = EndToEndPass(ctx.strategy.pass_specs(models), ctx.strategy.local_gpus(),
                                           pass_costs(models, ctx.report.models),
                                           per_gpu=ctx.strategy.passes_per_gpu())
        return self.end_to_end.size if self.beside is not None and self.end_to_end is not None else 0

    def still_owed(self, models: list[ModelFile]) -> None:
        """The end-to-end pass of a sweep that tuned no GEMM, for the passes its strategy says are
        owed (``SweepStrategy.owed_passes``), if any."""
        ctx = self.ctx
        if self.end_to_end is not None or not models:
            return
        replayed = {entry.path for entry in ctx.report.models if entry.reused_from}
        covered = self.resumed.covers if self.resumed is not None else None  # begun before capture
        specs = ctx.strategy.owed_passes(models, replayed, covered)
        if not specs:
            return
        if not ctx.strategy.publishes():
            log.info("every GEMM was cached, but %d model(s) have no finished end-to-end pass: running it",
                     len(specs))
        from .end_to_end import EndToEndPass

        self.end_to_end = EndToEndPass(specs, ctx.strategy.local_gpus(), per_gpu=ctx.strategy.passes_per_gpu())

    def close(self) -> None:
        """The sweep failed: no pass goes on."""
        for running in (self.end_to_end, self.resumed):
            if running is not None:
                running.close()

    def finish(self) -> None:
        """After tuning: the resumed pass first, then the pass begun beside tuning or the pass run
        now, their reports in the sweep's."""
        ctx = self.ctx
        if self.resumed is not None:  # before any later pass: two on one GPU would skew each other's timings
            ctx.progress.stage("finishing the end-to-end pass a cut sweep left (begun before capture)")
            ctx.report.pointwise = self.resumed.join()
            ctx.mark("resumed_pass_done")
        if self.end_to_end is not None and ctx.report.store_error is not None:
            self.end_to_end.close()  # it would write to a cache that refuses writes
            if self.beside is not None:
                self.beside.join()
            self.end_to_end = None
        if self.end_to_end is None:
            return
        if self.beside is not None:
            log.info("tuning done; waiting for the end-to-end passes begun beside it")
            self._add_remote_lanes()
            later = self.beside.join()
        else:
            later = self._run_now(self.end_to_end)
        ctx.mark("pointwise_done")
        pointwise = ctx.report.pointwise
        ctx.report.pointwise = later if pointwise is None else _both(pointwise, later)

    def _run_now(self, passes: EndToEndPass) -> EndToEndReport:
        ctx = self.ctx
        what = "tuning pointwise/reduction kernels" if ctx.device == "cuda" else "compiling the model end to end"
        signed = ", publishing signed artifacts" if ctx.settings.signing_key else ""
        ctx.progress.start(passes.size, f"end-to-end pass: {what}{signed}")
        ctx.mark("pointwise_go")
        self._add_remote_lanes()
        return passes.run(ctx.settings.request_timeout, on_done=ctx.progress.advance)

    def _add_remote_lanes(self) -> None:
        """On a cluster (--address), once tuning is over and its actors are gone, the other nodes'
        GPUs (on a CPU cluster, the other nodes) join the end-to-end pass (autotune/sweep/remote_passes.py)."""
        if self.end_to_end is None or not joins_cluster(self.ctx.settings):
            return
        import ray

        if not ray.is_initialized():
            return
        from .remote_passes import makers, remote_lanes

        lanes = remote_lanes(self.ctx.device, self.ctx.strategy.passes_per_gpu())
        if lanes and self.end_to_end.add_lanes(makers(lanes)):
            log.info("the end-to-end passes also run on %d lane(s) of the cluster's other nodes", len(lanes))
