"""Tune one request in isolation, in this process, on this process's device.

The recorded request is rebuilt as a one-op graph and compiled with the same
mode and config in fresh Inductor state. Inductor itself builds and benchmarks
the candidates (the same ones max-autotune would), in several rounds; the tune
policy keeps every timing with its spread, and the noise rule (workers/noise.py)
stores ATen unless another candidate clearly beats it. The reproduced key and
candidate set are compared with the recorded ones, and the winner's output is
checked against ATen in float32. A winner with wrong numbers is recorded as such
and the next best is tried. When ATen is stored, the fastest Triton config is
checked too: the sweep's end-to-end pass may choose it in the graph
(autotune/job/in_graph.py), and nothing unchecked is ever served. The compile that
timed the candidates runs it in ATen's place (ATen's own numbers come from the
op in eager mode), so no second compile is needed for it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import socket
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from autotune.cache.records import (
    STATUS_FAILED,
    STATUS_INVALID,
    STATUS_MISMATCH,
    STATUS_OK,
    CandidateResult,
    Environment,
    Provenance,
    TuningRequest,
    TuningResult,
)
from autotune.inductor_glue import padding
from autotune.inductor_glue.capture import capture_config, fresh_inductor, no_runtime_tuning
from autotune.inductor_glue.gpu_lock import gpu_timing_turn
from autotune.inductor_glue.inductor import (
    Benchmark,
    ObservedRequest,
    Timings,
    choice_hash,
    choice_kind,
    describe_choice,
    installed,
)
from autotune.inductor_glue.pinning import fastest_template
from autotune.inductor_glue.timing import kernel_bound_timing, others_running_per_core

from .jobs import TuneJob
from .noise import TIMING_ROUNDS, Timed, choose_busy, choose_candidate, is_busy, runs_first, summarize
from .reproduce import UnsupportedRequest, graph_config, one_op_graph, tolerance
from .symbolic import symbol_numbers

log = logging.getLogger(__name__)

MAX_WINNER_RETRIES = 3


class _FailureLog(logging.Handler):
    """Collects Inductor's warnings so a failed candidate can carry the reason."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.messages.append(record.getMessage())
        except Exception:
            pass


def _failure_kind(message: str) -> str:
    lowered = message.lower()
    if "outofresources" in lowered or "out of resource" in lowered or "shared memory" in lowered:
        return "out_of_resources"
    if "timeout" in lowered or "timed out" in lowered:
        return "timeout"
    if "compil" in lowered:
        return "compile_error"
    return "benchmark_error"


@dataclass
class TunePolicy:
    """Benchmark every candidate through Inductor and keep every timing."""

    device: str
    excluded: set[str] = field(default_factory=set)  # winners found to give wrong numbers
    seen: dict[str, ObservedRequest] = field(default_factory=dict)
    times: dict[str, dict[str, tuple[Any, float]]] = field(default_factory=dict)
    env: Environment | None = None
    # Request key -> the fastest Triton config, which the graph ran in place of an ATen
    # winner so that one compile checks both (see ``_stand_in``).
    stand_ins: dict[str, str] = field(default_factory=dict)
    # Choice hash -> why it broke the compile it stood in for: never chosen again.
    unrunnable: dict[str, str] = field(default_factory=dict)
    # Request key -> choice hash -> (spread, rounds) of its timing (times holds the median).
    noise: dict[str, dict[str, tuple[float | None, int]]] = field(default_factory=dict)
    # Request key -> other processes' ready threads per core while it was timed (None: unknown).
    loads: dict[str, float | None] = field(default_factory=dict)
    # Request key -> the choice hash the rule stores, which the graph ran (unless a stand-in did).
    stored: dict[str, str] = field(default_factory=dict)

    def busy(self, key: str) -> bool:
        return is_busy(self.device, self.loads.get(key))

    def lookup(
        self, request: ObservedRequest, choices: list[Any], benchmark: Benchmark | None, default: Any
    ) -> Timings:
        from autotune.inductor_glue.env import current_environment

        if self.env is None:
            self.env = current_environment(self.device)
        key = request.to_request().key
        self.seen[key] = request
        if benchmark is None:
            return {}  # the precompile check: let Inductor compile the candidates in parallel
        medians = self._timed_in_rounds(key, choices, benchmark)
        barred = self.excluded | set(self.unrunnable)
        allowed = {c: (math.inf if choice_hash(c) in barred else t) for c, t in medians.items()}
        stored = _stored_choice(allowed, self.noise[key], self.busy(key))
        if stored is not None:
            self.stored[key] = choice_hash(stored)
        aten = stored if stored is not None and choice_kind(stored) == "aten" else None
        stand_in = _stand_in(allowed) if aten is not None else None
        if stand_in is not None:
            self.stand_ins[key] = choice_hash(stand_in)
            return {c: (0.0 if c is stand_in else math.inf) for c in allowed}
        # The graph runs what the rule stores (ATen over a faster-looking candidate, or one of the
        # fastest's equals), so that the numerical check after the compile checks the stored winner.
        return runs_first(allowed, stored)


    def _timed_in_rounds(self, key: str, choices: list[Any], benchmark: Benchmark) -> dict[Any, float]:
        """Each choice's median over ``TIMING_ROUNDS`` rounds of Inductor's benchmark, each round
        timing every choice once, so a change of load hits them alike; the spreads go to
        ``noise``, the host's load to ``loads``."""
        rounds: dict[Any, list[float]] = {}
        loads = []
        for _ in range(TIMING_ROUNDS):
            # Kernel-bound: what a job's graph pays, not this process's launches; in turn with the
            # other children timing on this GPU.
            with gpu_timing_turn(self.device), kernel_bound_timing(self.device):
                timings = benchmark(choices)
            loads.append(others_running_per_core())
            for choice, ms in timings.items():
                rounds.setdefault(choice, []).append(float(ms))
        known = [load for load in loads if load is not None]
        self.loads[key] = statistics.median(known) if known else None
        bucket, noise = self.times.setdefault(key, {}), self.noise.setdefault(key, {})
        medians = {}
        for choice, times in rounds.items():
            median, spread, repeats = summarize(times)
            bucket[choice_hash(choice)] = (choice, median)
            noise[choice_hash(choice)] = (spread, repeats)
            medians[choice] = median
        return medians


def _stored_choice(timings: dict[Any, float], noise: dict[str, tuple[float | None, int]], busy: bool) -> Any | None:
    """The choice the noise rule (workers/noise.py) stores: ATen, or a candidate that clearly beats
    it (of the fastest's equals, the same one every time); None when none has a finite time."""
    rows = [Timed(choice_hash(c), choice_kind(c) == "aten", t, noise.get(choice_hash(c), (None, 0))[0])
            for c, t in timings.items()]
    decision = choose_busy(rows, busy)
    if decision is None:
        return None
    return next(c for c in timings if choice_hash(c) == decision.winner)


def _stand_in(timings: dict[Any, float]) -> Any | None:
    """When ATen is stored, the fastest pinnable Triton config, for the graph to run instead.

    ATen's numbers need no compile to check (the op in eager mode is ATen), while the
    fastest template must be checked before the end-to-end pass may choose it in the
    graph (autotune/job/in_graph.py). Running it in this compile checks it at no extra
    compile; a second compile serving it alone cost seconds per request on a GPU.
    """
    finite = {c: t for c, t in timings.items() if math.isfinite(t)}
    described = {choice_hash(c): c for c in finite}
    fastest = fastest_template([describe_choice(c, t) for c, t in finite.items()])
    return described[fastest.choice_hash] if fastest is not None else None


def _candidates(policy: TunePolicy, key: str, failures: list[str]) -> list[CandidateResult]:
    observed = policy.seen[key]
    timed = policy.times.get(key, {})
    out = []
    for choice in observed.offered:
        h = choice_hash(choice)
        if h in policy.unrunnable:
            out.append(describe_choice(choice, None, "compile_error", policy.unrunnable[h]))
            continue
        if h in policy.excluded:
            ms = timed.get(h, (choice, None))[1]
            out.append(describe_choice(choice, None, "wrong_numerics",
                                       f"output differs from ATen (it ran in {ms} ms)"))
            continue
        ms = timed[h][1] if h in timed else None
        message = None
        if ms is None or not math.isfinite(ms):
            name = str(getattr(choice, "name", ""))
            message = next((m for m in failures if name and name in m), None) or (
                failures[-1] if failures else ("failed to compile" if h not in timed else None)
            )
            kind = _failure_kind(message or "") if h in timed else "compile_error"
            out.append(describe_choice(choice, None, kind, message))
        else:
            spread, repeats = policy.noise.get(key, {}).get(h, (None, 0))
            out.append(dataclasses.replace(describe_choice(choice, ms), spread=spread, repeats=repeats or None))
    return out


def _check_numerics(graph: Any, output: Any, request: TuningRequest) -> dict[str, Any]:
    import torch

    reference = graph.reference()
    out = output.float()
    err = (out - reference.to(out.device)).abs().max().item() if out.numel() else 0.0
    scale = max(reference.abs().max().item() if reference.numel() else 0.0, 1e-6)
    dtype = getattr(torch, request.inputs[0].dtype.removeprefix("torch.")) if request.inputs else torch.float32
    tol = tolerance(dtype, request.precision)
    passed = bool(math.isfinite(err) and err <= tol * scale)
    return {"passed": passed, "max_abs_err": err, "reference_max_abs": scale, "rtol": tol}


def _compile_and_run(job: TuneJob, policy: TunePolicy) -> tuple[Any, Any]:
    import torch

    graph = one_op_graph(job.request, job.device)
    config = {**job.config_overrides, **capture_config(), **graph_config(job.request)}
    with fresh_inductor(config), installed(policy), no_runtime_tuning(), symbol_numbers(graph.symbol_ids), \
            padding.as_recorded():
        options = _without_cudagraphs(job.mode or "default", graph.dynamic)
        compiled = torch.compile(graph.fn, dynamic=graph.dynamic, options=options)
        with torch.no_grad():
            output = compiled(*graph.inputs)
    if job.device == "cuda":
        torch.cuda.synchronize()
    return graph, output


def _without_cudagraphs(mode: str, dynamic: bool | None) -> dict[str, Any]:
    """``mode``'s Inductor options, CUDA graphs off. The one-op graph runs once, to check
    its output; every choice and kernel source is fixed before CUDA graphs come in, so
    nothing a job looks up changes. And torch 2.11's graph partition (which CUDA graphs
    bring) dropped a size symbol that only a kernel's launch used: the MLP-Mixer's token
    GEMM under ``--dynamic`` (K = (s0//16)*(s53//16)) failed with ``NameError: s0`` on a
    GPU."""
    from torch._inductor import list_mode_options

    return {**list_mode_options(mode, dynamic), "triton.cudagraphs": False}


def _compile_and_run_standing_in(job: TuneJob, policy: TunePolicy) -> tuple[Any, Any]:
    """``_compile_and_run``; a template that ran alone (it was timed) but breaks the compile
    it stands in for is recorded as failed, and the compile runs again without it, so an
    ATen winner is never lost to it. Each retry bars one more template, so this ends."""
    while True:
        try:
            return _compile_and_run(job, policy)
        except Exception as exc:
            stand_in = policy.stand_ins.pop(job.request.key, None)
            if stand_in is None:
                raise
            log.warning("the fastest template of %s failed in ATen's place: %s", job.request.op, exc)
            policy.unrunnable[stand_in] = f"failed in the graph in ATen's place: {type(exc).__name__}: {exc}"[:2000]


def _with_template_check(candidates: list[CandidateResult], fastest: CandidateResult,
                         check: dict[str, Any], validation: dict[str, Any]) -> list[CandidateResult]:
    """Record the fastest template's check; one that fails it is recorded as failed, so no
    pass or job ever chooses it."""
    validation["fastest_template"] = {"name": fastest.name, **check}
    if check["passed"]:
        return candidates
    failed = dataclasses.replace(fastest, time_ms=None, failure_kind="wrong_numerics",
                                 failure_message=f"output differs from ATen (it ran in {fastest.time_ms} ms)")
    return [failed if c is fastest else c for c in candidates]


def _eager_output(graph: Any) -> Any:
    """The op run eagerly: ATen's own output, on the same inputs."""
    import torch

    with torch.no_grad():
        return graph.fn(*graph.inputs)


def _result(job: TuneJob, env: Environment, candidates: list[CandidateResult], status: str,
            started: float, *, winner: str | None = None, validation: dict[str, Any] | None = None,
            error: str | None = None, request: TuningRequest | None = None,
            fallback_reason: str | None = None) -> TuningResult:
    return TuningResult(
        env=env,
        request=request or job.request,
        candidates=tuple(candidates),
        winner_hash=winner,
        status=status,
        validation=validation,
        error=error,
        provenance=Provenance(
            host=socket.gethostname(),
            sweep_id=job.sweep_id,
            tuning_seconds=time.perf_counter() - started,
            source="sweep",
        ),
        fallback_reason=fallback_reason,
    )


def _mismatch(job: TuneJob, policy: TunePolicy) -> str | None:
    """Why the reproduced request differs from the recorded one, or None."""
    recorded = job.request
    key = recorded.key
    if key not in policy.seen:
        seen = ", ".join(_describe(o.to_request()) for o in policy.seen.values()) or "no request"
        return f"reproduction made {seen}, not {_describe(recorded)}"
    reproduced = set(policy.seen[key].to_request().choice_hashes)
    # Capture renders one Triton config per template (see CapturePolicy), so the
    # recorded set is a sample: each of its hashes must come out the same here.
    missing = set(recorded.choice_hashes) - reproduced
    if missing:
        return (f"candidate set differs: {len(missing)} of {len(recorded.choice_hashes)} recorded candidates "
                f"were not reproduced (their kernel source differs)")
    if job.expected_env is not None and policy.env is not None and policy.env.key != job.expected_env.key:
        return (f"environment differs from capture: {policy.env.device_name} / config "
                f"{policy.env.config_fingerprint} vs {job.expected_env.device_name} / "
                f"{job.expected_env.config_fingerprint}")
    return None


def _describe(request: TuningRequest) -> str:
    """Op and inputs_key, and the symbolic sizes, which inputs_key (hints only) leaves out."""
    exprs = [e for layout in request.inputs for e in layout.exprs]
    return f"{request.op} {request.inputs_key}" + (f" with sizes {', '.join(exprs)}" if exprs else "")


def _with_every_candidate(request: TuningRequest, candidates: list[CandidateResult]) -> TuningRequest:
    """The request as stored: the capture's sample of choice hashes becomes the full set."""
    return dataclasses.replace(request, choice_hashes=tuple(sorted({c.choice_hash for c in candidates})))


def _match_threads(job: TuneJob) -> None:
    """Use the capture's CPU thread count (Ray caps actors at num_cpus threads)."""
    from autotune.inductor_glue.env import cpu_threads

    threads = cpu_threads(job.expected_env) if job.expected_env else None
    if job.device == "cpu" and threads:
        import torch

        torch.set_num_threads(threads)


def tune_with(job: TuneJob, policy: TunePolicy) -> TuningResult:
    """Tune ``job.request`` here with ``policy`` timing the candidates; failures come back as
    a result, never raised (workers/entry.py picks the policy)."""
    from autotune.inductor_glue.env import current_environment, pin_triton_toolchain

    started = time.perf_counter()
    pin_triton_toolchain()
    _match_threads(job)
    fallback_env = job.expected_env or current_environment(job.device)
    failures = _FailureLog()
    inductor_log = logging.getLogger("torch._inductor")
    inductor_log.addHandler(failures)
    try:
        for _attempt in range(MAX_WINNER_RETRIES + 1):
            graph, output = _compile_and_run_standing_in(job, policy)
            problem = _mismatch(job, policy)
            env = policy.env or fallback_env
            if problem is not None:
                return _result(job, env, [], STATUS_MISMATCH, started, error=problem)
            key = job.request.key
            candidates = _candidates(policy, key, failures.messages)
            timed = [c for c in candidates if c.ok]
            if not timed:
                return _result(job, env, candidates, STATUS_FAILED, started, error="every candidate failed")
            # The noise rule: ATen unless another clearly beats it.
            decision = choose_candidate(timed, policy.busy(key))
            winner = next(c for c in timed if decision is not None and c.choice_hash == decision.winner)
            # An ATen win with a template that ran in its place (``_stand_in``): the graph's
            # output is the template's, and ATen's comes from eager mode.
            stand_in = next((c for c in candidates if c.choice_hash == policy.stand_ins.get(key)), None) \
                if winner.kind == "aten" else None
            if stand_in is None and policy.stored.get(key) not in (None, winner.choice_hash):
                # The two readings of the rule disagree: the graph's kernel is not the one to store.
                return _result(job, env, candidates, STATUS_FAILED, started,
                               error=f"the compile ran {policy.stored[key]}, the rule stores {winner.choice_hash}")
            validation = _check_numerics(graph, output if stand_in is None else _eager_output(graph), job.request)
            validation["winner"] = winner.name
            validation["timing"] = {"rounds": TIMING_ROUNDS, "others_per_core": policy.loads.get(key),
                                    "busy": policy.busy(key)}
            if validation["passed"]:
                if stand_in is not None:
                    check = _check_numerics(graph, output, job.request)
                    candidates = _with_template_check(candidates, stand_in, check, validation)
                return _result(job, env, candidates, STATUS_OK, started, winner=winner.choice_hash,
                               validation=validation, request=_with_every_candidate(job.request, candidates),
                               fallback_reason=decision.fallback_reason if decision else None)
            log.warning("winner %s of %s gave wrong numbers (%s); trying the next best",
                        winner.name, job.request.op, validation)
            policy.excluded.add(winner.choice_hash)
            if winner.kind == "aten":
                break  # ATen is the reference itself: the check, not the kernel, is off
        return _result(job, env, candidates, STATUS_INVALID, started, validation=validation,
                       error="no candidate passed the numerical check against ATen")
    except UnsupportedRequest as exc:
        return _result(job, fallback_env, [], STATUS_FAILED, started, error=str(exc))
    except Exception as exc:  # a compile that dies is data about this request
        log.exception("tuning %s failed", job.request.op)
        return _result(job, fallback_env, [], STATUS_FAILED, started, error=f"{type(exc).__name__}: {exc}"[:2000])
    finally:
        inductor_log.removeHandler(failures)
