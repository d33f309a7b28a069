"""The plan, as capture finds each request: cached, queued for the workers, or planned (a dry run);
and the misses jobs logged, which join it with --misses."""

from __future__ import annotations

from typing import Any

from autotune.cache.records import Environment, TuningRequest

from .context import SweepContext
from .plan import CACHED
from .report import STATUS_CACHED, Outcome


class Planner:
    """Decides each request found (the strategy's verdict) and files it in the report or the queue."""

    def __init__(self, ctx: SweepContext) -> None:
        self.ctx = ctx

    def found(self, request: TuningRequest, env: Environment | None, overrides: dict[str, Any], model: str) -> int:
        """Plan one request as capture finds it in ``model``: cached, queued (streamed to
        workers), or planned (dry run). 1 if it is new to this sweep."""
        ctx = self.ctx
        decision = ctx.strategy.verdict(request, env)
        if decision is None:  # found before: if this sweep queued it, this model's pass waits for it too
            if request.key in ctx.queued_keys:
                ctx.readiness.needs(model, request.key, pending=ctx.readiness.waits_on(request.key))
            return 0
        ctx.found_in.setdefault(request.key, model)
        if decision == CACHED:
            ctx.report.outcomes.append(Outcome(request, STATUS_CACHED, model=model))
        elif ctx.queue is None:
            ctx.report.outcomes.append(Outcome(request, "planned", model=model))
        else:
            self._queue(request, env, overrides, model)
        return 1

    def _queue(self, request: TuningRequest, env: Environment | None, overrides: dict[str, Any], model: str) -> None:
        from autotune.workers.jobs import TuneJob
        from autotune.workers.search import search_overrides

        ctx = self.ctx
        assert ctx.queue is not None
        ctx.mark("first_request_queued")
        ctx.queued_keys.add(request.key)
        ctx.readiness.needs(model, request.key)
        searched = {**overrides, **search_overrides(ctx.settings.search, ctx.settings.budget_s)}
        ctx.queue.put(TuneJob(request, env, ctx.settings.mode, searched, ctx.device, ctx.report.sweep_id),
                      priority=ctx.strategy.priority(model))

    def plan_misses(self) -> None:
        """A dry run with --misses: the logged misses join the plan."""
        for job in self._miss_jobs():
            if self.ctx.strategy.takes_miss(job):
                self.ctx.report.outcomes.append(Outcome(job.request, "planned"))

    def queue_misses(self) -> None:
        """With --misses, the logged misses the strategy takes join the queue."""
        assert self.ctx.queue is not None
        if not self.ctx.options.misses:
            return
        for job in self._miss_jobs():
            if self.ctx.strategy.takes_miss(job):
                self.ctx.queue.put(job)

    def _miss_jobs(self) -> list[Any]:
        jobs = self.ctx.strategy.miss_jobs(self.ctx.report.sweep_id)
        self.ctx.report.malformed_rows += [str(error) for error in jobs.malformed]
        return jobs
