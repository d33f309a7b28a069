"""Tune one request with Inductor's exhaustive GEMM/conv search space, within a time budget.

A sweep asks for it with ``--search exhaustive`` (``Settings.search``): the job it sends
carries the search and the budget among its config overrides (``search_overrides``), and
``tune_request`` hands such a job here. It is tuned as every request is (workers/tune.py),
with three differences:

- Inductor's config holds the exhaustive search space (inductor_glue/search_space.py says
  what that adds on each device, and what it leaves as the job has it).
- Compiling and benchmarking stop once the request's budget is spent (``BudgetedPolicy``):
  ATen's choices are timed first, always, then the templates a batch at a time; those left
  when the budget runs out are recorded untimed (``timeout``, with the reason), and the best
  so far wins.
- The stored row is filed under the job's environment (computed with the job's search
  space, so that the job's lookup finds it) and marked ``search="exhaustive"``.

Serving: a winner the default search space also offers is served by the job as any winner,
with no benchmark. A winner only the exhaustive space offers (a block size, stage or warp
count outside the default list) is a config the job's compile never generates on its own:
the stored row keeps the winner's generate() arguments (``pinning.PIN_ARGS``), and the hook
generates it in the place of the first config of its template that lost
(``PinIndex.instead``), once per lowering, its source and hash the worker's. Where that cannot
be done (hook pinning off, a template the job does not use), the job serves the fastest of
the configs it does generate, by the exhaustive run's timings, still with no benchmark
(autotune/job/serve_policy.py counts it as ``winner_not_generated``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autotune.cache.records import CandidateResult, Environment, TuningResult
from autotune.inductor_glue import pinning, search_space
from autotune.inductor_glue.inductor import Benchmark, ObservedRequest, Timings, choice_hash, choice_kind

from .jobs import TuneJob
from .tune import TunePolicy, tune_with

log = logging.getLogger(__name__)

SEARCH_DEFAULT = "default"
SEARCH_EXHAUSTIVE = "exhaustive"
# Keys of a job's config overrides that are this module's, never Inductor's: ``tune_request``
# takes them out before the compile.
SEARCH_KEY = "autotune.search"
BUDGET_KEY = "autotune.budget_s"


def search_overrides(search: str, budget_s: float | None) -> dict[str, Any]:
    """What a sweep adds to each job's config overrides for ``search`` (nothing for the default)."""
    if search == SEARCH_DEFAULT:
        return {}
    return {SEARCH_KEY: search, BUDGET_KEY: budget_s}


def searched(job: TuneJob) -> bool:
    """Whether ``job`` asks for a search other than the default."""
    return job.config_overrides.get(SEARCH_KEY, SEARCH_DEFAULT) != SEARCH_DEFAULT


def cached_keys(store: Any, env: Environment, search: str) -> set[str]:
    """Keys of the requests a sweep with ``search`` may skip: those stored ok for ``env``, and
    for the exhaustive search only those it found (a default row is searched again, and its
    winner replaced in the same row)."""
    if search == SEARCH_DEFAULT:
        return set(store.cached_request_keys(env))
    return {r.request.key for r in store.results_for_env(env) if r.provenance.search == search}


@dataclass
class BudgetedPolicy(TunePolicy):
    """``TunePolicy`` that stops compiling and timing new candidates once ``budget_s`` is
    spent, and files the request under the job's environment (``job_values``: the job's
    search space).

    With a budget, Inductor's own precompile step is skipped: it compiles every candidate of
    the request before any is timed, which for the exhaustive space takes minutes. Instead
    each batch is compiled here (in parallel, as Inductor does) just before it is timed, so
    the budget bounds both. ATen's choices come first, then the configs the capture rendered,
    then the rest in the order of their hashes: a spread over the space, not its smallest
    tiles first."""

    job_values: dict[str, Any] = field(default_factory=dict)
    budget_s: float | None = None
    first: frozenset[str] = frozenset()  # choice hashes timed before the rest (the capture's)
    spent_s: float = 0.0
    over_budget: set[str] = field(default_factory=set)  # choice hashes left untimed
    timed_once: set[str] = field(default_factory=set)  # choice hashes the budget let through
    uncompiled: set[str] = field(default_factory=set)  # choice hashes whose compile raised

    def lookup(self, request: ObservedRequest, choices: list[Any], benchmark: Benchmark | None,
               default: Any) -> Timings:
        if self.env is None:
            from autotune.inductor_glue.env import current_environment

            with search_space.as_the_job_has_it(self.job_values):
                self.env = current_environment(self.device)
        if benchmark is None:
            answer = super().lookup(request, choices, None, default)
            # Inductor's precompile check: every choice "known" means it compiles none up front.
            return {c: 0.0 for c in choices} if self.budget_s is not None else answer
        budgeted = self._budgeted(benchmark) if self.budget_s is not None else benchmark
        return super().lookup(request, choices, budgeted, default)

    def _budgeted(self, benchmark: Benchmark) -> Benchmark:
        def run(choices: list[Any]) -> Timings:
            # A later timing round (workers/tune.py times every candidate several times), or a
            # compile again after a wrong winner, times exactly what the first one timed: the
            # budget picks the candidates once.
            timings: Timings = {c: math.inf for c in choices if choice_hash(c) in self.untimed}
            timings.update(self._timed(benchmark, [c for c in choices if choice_hash(c) in self.timed_once]))
            new = [c for c in choices if choice_hash(c) not in self.timed_once | self.untimed]
            timings.update(self._first_round(benchmark, new))
            return timings

        return run

    @property
    def untimed(self) -> set[str]:
        return self.over_budget | self.uncompiled

    def _first_round(self, benchmark: Benchmark, choices: list[Any]) -> Timings:
        aten = [c for c in choices if choice_kind(c) == "aten"]
        timings = self._timed(benchmark, aten)  # always: the fallback and the reference
        self.timed_once.update(choice_hash(c) for c in aten)
        rest = sorted((c for c in choices if choice_kind(c) != "aten"),
                      key=lambda c: (choice_hash(c) not in self.first, choice_hash(c)))
        size = _batch_size()
        for start in range(0, len(rest), size):
            batch = rest[start:start + size]
            if self._spent():
                self.over_budget.update(choice_hash(c) for c in batch)
                timings.update({c: math.inf for c in batch})
            else:
                timings.update(self._compiled_and_timed(benchmark, batch))
        return timings

    def _compiled_and_timed(self, benchmark: Benchmark, batch: list[Any]) -> Timings:
        began = time.perf_counter()
        try:
            broken = _precompile(batch)
        finally:
            self.spent_s += time.perf_counter() - began
        self.uncompiled.update(choice_hash(c) for c in broken)
        compiled = [c for c in batch if c not in broken]
        self.timed_once.update(choice_hash(c) for c in compiled)
        return {**{c: math.inf for c in broken}, **self._timed(benchmark, compiled)}

    def _timed(self, benchmark: Benchmark, choices: list[Any]) -> Timings:
        if not choices:
            return {}
        began = time.perf_counter()
        try:
            return dict(benchmark(choices))
        finally:
            self.spent_s += time.perf_counter() - began

    def _spent(self) -> bool:
        return self.budget_s is not None and self.spent_s >= self.budget_s


def _batch_size() -> int:
    """Candidates compiled and timed per step: one per compile thread, as Inductor compiles them."""
    from torch._inductor import config

    return max(1, int(getattr(config, "compile_threads", 1) or 1))


def _precompile(batch: list[Any]) -> set[Any]:
    """Compile ``batch`` in parallel threads; the choices whose compile raised (a candidate
    failure is data: Inductor's benchmark then times it as failed, here it is not timed)."""
    from concurrent.futures import ThreadPoolExecutor

    def compile_one(choice: Any) -> bool:
        try:
            precompile = getattr(choice, "precompile", None)
            if precompile is not None:
                precompile()
            return True
        except Exception as exc:  # noqa: BLE001 - a config that cannot compile is a result
            log.info("candidate %s did not compile: %s", getattr(choice, "name", choice), exc)
            return False

    with ThreadPoolExecutor(max_workers=len(batch)) as pool:
        compiled = list(pool.map(compile_one, batch))
    return {choice for choice, ok in zip(batch, compiled) if not ok}


def tune_searched(job: TuneJob, tune: Callable[[TuneJob, TunePolicy], TuningResult] = tune_with) -> TuningResult:
    """Tune ``job`` with the search its overrides name; the result marked with that search."""
    overrides = dict(job.config_overrides)
    search = str(overrides.pop(SEARCH_KEY, SEARCH_DEFAULT))
    budget = overrides.pop(BUDGET_KEY, None)
    budget_s = float(budget) if budget is not None else None
    if search != SEARCH_EXHAUSTIVE:
        raise ValueError(f"unknown search {search!r}")
    values = search_space.job_values(overrides)
    patched = dataclasses.replace(job, config_overrides={**overrides, **search_space.exhaustive_config(job.device)})
    log.info("exhaustive search of %s: %s", job.request.op, search_space.what_it_adds(job.device))
    policy = BudgetedPolicy(device=job.device, job_values=values, budget_s=budget_s,
                            first=frozenset(job.request.choice_hashes))
    result = tune(patched, policy)
    return _marked(result, policy, budget_s)


def _marked(result: TuningResult, policy: BudgetedPolicy, budget_s: float | None) -> TuningResult:
    """The result as stored: the candidates the budget left untimed say so, and the row names
    the exhaustive search (with the job's request, overrides and all, as the sweep sent it)."""
    reason = f"not timed: the exhaustive search's budget of {budget_s} s per request ran out"
    candidates = tuple(_untimed(c, reason) if c.choice_hash in policy.over_budget and c.time_ms is None else c
                       for c in result.candidates)
    candidates = tuple(_with_arguments(c, policy) if c.choice_hash == result.winner_hash else c for c in candidates)
    provenance = dataclasses.replace(result.provenance, search=SEARCH_EXHAUSTIVE)
    return dataclasses.replace(result, candidates=candidates, provenance=provenance)


def _with_arguments(winner: CandidateResult, policy: BudgetedPolicy) -> CandidateResult:
    """The winner with its generate() arguments (``pinning.PIN_ARGS``): the default config list
    of the job's compile may lack it, and the hook generates it from them in a lost config's
    place (``PinIndex.instead``), with no benchmark."""
    choice = next((timed[0] for bucket in policy.times.values() for h, timed in bucket.items()
                   if h == winner.choice_hash), None)
    arguments = pinning.pin_args(choice) if choice is not None else {}
    if not arguments:
        return winner
    return dataclasses.replace(winner, params={**winner.params, pinning.PIN_ARGS: arguments})


def _untimed(candidate: CandidateResult, reason: str) -> CandidateResult:
    return dataclasses.replace(candidate, failure_kind="timeout", failure_message=reason)
