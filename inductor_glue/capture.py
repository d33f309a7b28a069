"""Dry-run enumeration: every GEMM/conv autotune request a compile will make.

The model is compiled once per batch size with the real mode and config, but
every autotune lookup is answered with made-up timings (ATen fastest), so no
candidate is compiled or benchmarked. What the lookups saw is the request list.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from autotune.cache.errors import CacheError, find_cause
from autotune.cache.records import Environment, TuningRequest

from . import descent, seams
from .distributed import DistributedSpec, job_process_group, wrap
from .inductor import Benchmark, ObservedRequest, Timings, installed
from .modelfile import DynamicDims, ModelFile, ModelFileError, load_model_file
from .patching import StackedPatch

log = logging.getLogger(__name__)


@dataclass
class CaptureResult:
    env: Environment | None
    requests: list[TuningRequest]
    config_overrides: dict[str, Any]
    mode: str
    device: str
    seconds: float
    total_lookups: int = 0  # before dedupe, over every batch size and graph
    # Padding verdicts this capture timed (GPUs; inductor_glue/padding.py): the sweep stores
    # them, so its pass and every job pad as this capture did.
    pad_decisions: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class CapturePolicy:
    """Record each request, answer with made-up timings so nothing is compiled."""

    device: str
    seen: dict[str, ObservedRequest] = field(default_factory=dict)
    env: Environment | None = None
    lookups: int = 0
    families: set[str] = field(default_factory=set)
    # Called once per new request, while the compile goes on: the sweep streams it to workers.
    on_request: Callable[[TuningRequest, Environment | None], None] | None = None

    def allow_template(self, pin: Any) -> bool:
        """Render one Triton config per template and request, not all of them.

        Rendering every config was most of a capture's time (a CNN on a GPU). One is
        enough: the request still reaches the selector with several
        choices, and its hash is still checked against the worker's, which renders
        them all. Which configs exist is the worker's business.
        """
        if pin.family in self.families:
            return False
        self.families.add(pin.family)
        return True

    def lookup(
        self, request: ObservedRequest, choices: list[Any], benchmark: Benchmark | None, default: Any
    ) -> Timings:
        from torch._inductor import select_algorithm as sa

        from .env import current_environment

        if self.env is None:
            # Config is patched by torch.compile's mode only during the compile: read it here.
            self.env = current_environment(self.device)
        if benchmark is not None:
            self.lookups += 1
        found = request.to_request()
        merged = self.seen.setdefault(found.key, request)
        if merged is request and self.on_request is not None:
            self.on_request(found, self.env)
        elif merged is not request:
            known = {c.hash_key() for c in merged.offered}
            merged.offered.extend(c for c in request.offered if c.hash_key() not in known)
        aten = [c for c in choices if isinstance(c, sa.ExternKernelCaller)]
        fastest = aten[0] if aten else choices[0]
        return {c: (0.001 if c is fastest else 1.0) for c in choices}


@contextlib.contextmanager
def fresh_inductor(config_overrides: dict[str, Any]) -> Iterator[None]:
    """Fresh Dynamo/Inductor state and cache dirs, with the given config applied."""
    import torch
    from torch._inductor import config
    from torch._inductor.utils import fresh_cache

    torch._dynamo.reset()
    with fresh_cache(), config.patch(config_overrides):
        try:
            yield
        finally:
            torch._dynamo.reset()


def _to_device(value: Any, device: str) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    return value


def _mark_dynamic(inputs: tuple[Any, ...], dims: DynamicDims) -> None:
    """The named dimensions symbolic (``dims``: input position -> dimensions, from
    ``ModelFile.marked_dims``), as a job compiling with dynamic shapes has them."""
    import torch

    for index, named in dims.items():
        for dim in named:
            size = inputs[index].shape[dim]
            if size > 1:
                torch._dynamo.mark_dynamic(inputs[index], dim)
            else:  # 0 and 1 are always specialized: Dynamo would refuse the mark
                log.warning("input %d dimension %d has size %d here, so it stays static", index, dim, size)


def _mark_duck(inputs: tuple[Any, ...], dims: DynamicDims) -> None:
    """Under ``dynamic=True`` every dimension is dynamic and equal sizes share one symbol
    (duck shaping): keep the named dimensions so and make every other one static."""
    import torch

    for index, tensor in enumerate(inputs):
        if isinstance(tensor, torch.Tensor):
            for dim in range(tensor.dim()):
                if dim not in dims.get(index, ()):
                    torch._dynamo.mark_static(tensor, dim)


def duck_differs(inputs: tuple[Any, ...], dims: DynamicDims) -> bool:
    """Whether named dimensions share a size, so that ``dynamic=True`` (one symbol for
    both) and ``mark_dynamic`` (one each) compile different graphs."""
    sizes = [inputs[index].shape[dim] for index, named in dims.items() for dim in named]
    sizes = [size for size in sizes if size > 1]
    return len(sizes) != len(set(sizes))


def _run_once(module: Any, inputs: tuple[Any, ...], mode: str, train: bool, device: str,
              later_inputs: tuple[tuple[Any, ...], ...] = (), dynamic_dims: DynamicDims | None = None,
              duck: bool = False, distributed: DistributedSpec | None = None) -> None:
    """Compile module, call it on inputs, then on each of later_inputs (same compiled
    module: a new batch size recompiles it with a dynamic batch, as automatic dynamic
    shapes do in a job); ``dynamic_dims``, if given, are dynamic from the start: marked
    (``mark_dynamic``), or with ``duck`` as ``dynamic=True`` makes them. ``duck`` without
    ``dynamic_dims``: plain ``dynamic=True``, every input dimension symbolic.
    ``distributed``: wrapped in DDP or FSDP2 as a rank of that job (inductor_glue/distributed.py)."""
    import torch

    with job_process_group(distributed):
        if isinstance(module, torch.nn.Module):
            module = module.to(device)
            module.train(train)
            module = wrap(module, distributed, device)
        compiled = torch.compile(module, mode=mode, dynamic=True if duck else None)
        for call_inputs in marked_calls((inputs, *later_inputs), device, dynamic_dims, duck):
            _call(compiled, call_inputs, train)


def marked_calls(calls: tuple[tuple[Any, ...], ...], device: str, dynamic_dims: DynamicDims | None,
                 duck: bool) -> Iterator[tuple[Any, ...]]:
    """Each call's inputs on ``device``, marked as a session's dynamic dimensions say."""
    import torch

    for call_inputs in calls:
        call_inputs = tuple(_to_device(x, device) for x in call_inputs)
        if duck:  # marks stay on a tensor: the marked capture's must not carry over
            call_inputs = tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in call_inputs)
        if dynamic_dims is not None:
            (_mark_duck if duck else _mark_dynamic)(call_inputs, dynamic_dims)
        yield call_inputs


@dataclass(frozen=True)
class Session:
    """One compiled model and the batch sizes it is called on, in order (a later size
    recompiles it with a dynamic batch), and how its dimensions are made dynamic:
    ``static`` (as torch does by default), ``marked`` (the model file's dimensions, or the
    batch, dynamic from the first call; with a ``dynamic=True`` twin where two of them
    share a size) or ``all`` (``dynamic=True``: every input dimension symbolic)."""

    sizes: tuple[int | None, ...]
    dynamic: str = "static"


def compile_sessions(batch_sizes: tuple[int | None, ...], dynamic: bool) -> list[Session]:
    """The compiles a job may make, so capture and the pass make them too.

    Without ``dynamic``: each size's static graph; with several sizes the first size's
    compiled model is also called on the others in turn, which recompiles it with a
    dynamic batch (torch's automatic dynamic shapes). With ``dynamic``: per size, the
    marked graph and the ``dynamic=True`` graph, whose other dimensions (image sizes,
    sequence lengths) are symbolic too, so their kernels and GEMM layouts differ."""
    if dynamic:
        return [Session((b,), kind) for kind in ("marked", "all") for b in batch_sizes]
    if len(batch_sizes) > 1:
        return [Session(tuple(batch_sizes))] + [Session((b,)) for b in batch_sizes[1:]]
    return [Session((b,)) for b in batch_sizes]


def build_session(model: ModelFile, session: Session) -> tuple[Any, tuple[Any, ...], tuple[tuple[Any, ...], ...]]:
    """``(module, inputs, later_inputs)``: the model built at the session's first size, and
    the inputs of its later calls (``_run_once``'s)."""
    builds = [model.build(b) for b in session.sizes]
    (module, inputs), later = builds[0], tuple(i for _, i in builds[1:])
    return module, inputs, later


def session_variants(session: Session, model: ModelFile, inputs: tuple[Any, ...]
                     ) -> list[tuple[DynamicDims | None, bool]]:
    """``(dynamic_dims, duck)`` for each compile of ``session`` (``_run_once``'s)."""
    if session.dynamic == "all":
        return [(None, True)]
    if session.dynamic != "marked":
        return [(None, False)]
    dims = model.marked_dims(inputs)
    return [(dims, duck) for duck in ((False, True) if dims and duck_differs(inputs, dims) else (False,))]


def _call(compiled: Any, inputs: tuple[Any, ...], train: bool) -> None:
    import torch

    if not train:
        with torch.no_grad():
            compiled(*inputs)
        return
    out = compiled(*inputs)
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    loss = sum(o.float().sum() for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad)
    if isinstance(loss, torch.Tensor):
        loss.backward()


# Which pointwise/reduction kernels tune at their first run: the innermost active
# policy decides (capture, workers and the pointwise pass may nest). A kernel that
# does not tune runs with its first config; only run-time behaviour changes, no
# config and no kernel source (so no key or hash).
TunesAtRun = Callable[[Any], bool]


def _wrap_autotune_to_one_config(original: Any, patch: StackedPatch[TunesAtRun]) -> Any:
    def autotune_to_one_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        if patch.top is None or patch.top(self):
            return original(self, *args, **kwargs)
        self.launchers = self.launchers[:1]
        return None

    return autotune_to_one_config


_ONE_CONFIG: StackedPatch[TunesAtRun] = StackedPatch(seams.AUTOTUNE_TO_ONE_CONFIG, _wrap_autotune_to_one_config)


def _untuned_here(autotuner: Any, launcher: Any) -> bool:
    """The coordinate-descent rule (inductor_glue/descent.py): the innermost policy's answer."""
    tunes = _ONE_CONFIG.top
    return tunes is not None and not tunes(autotuner)


@contextlib.contextmanager
def _runtime_tuning(tunes: TunesAtRun) -> Iterator[None]:
    _ONE_CONFIG.push(tunes)
    descent.push(_untuned_here)
    try:
        yield
    finally:
        descent.pop(_untuned_here)
        _ONE_CONFIG.pop(tunes)


def no_runtime_tuning() -> contextlib.AbstractContextManager[None]:
    """Run generated pointwise/reduction kernels with their first config, untuned.

    Capture and the workers compile a graph to see its GEMM/conv requests and
    run it once for a result, but have no use for tuned pointwise kernels; under
    max-autotune Inductor tunes each at its first run, a large share of a CNN's
    capture on a GPU.
    """
    return _runtime_tuning(lambda _autotuner: False)


def kernel_owner(kernel_id: str, count: int) -> int:
    """Which of ``count`` shards tunes this kernel: the same answer in every process."""
    return int(hashlib.sha1(kernel_id.encode()).hexdigest(), 16) % max(1, count)


def _kernel_id(autotuner: Any) -> str:
    meta = getattr(autotuner, "inductor_meta", None) or {}
    source = getattr(getattr(autotuner, "fn", None), "src", "") or ""
    return f"{meta.get('kernel_name', '')}:{hashlib.sha1(source.encode()).hexdigest()}"


def tune_only_shard(rank: int, count: int) -> contextlib.AbstractContextManager[None]:
    """Tune at first run only the pointwise/reduction kernels of shard ``rank`` of ``count``.

    The sweep's pointwise pass runs one process per GPU over the same model; each
    compiles every kernel (the same source, so the same ids) but tunes only its
    share, and the others run with their first config untuned and store nothing.
    """
    if count <= 1:
        return contextlib.nullcontext()
    return _runtime_tuning(lambda autotuner: kernel_owner(_kernel_id(autotuner), count) == rank)


def capture_config() -> dict[str, Any]:
    """Inductor options of every capture and tuning compile. Epilogue-fusion benchmarking
    happens in the scheduler, outside lookup; it is off (it changes no choice hash), under
    the option's name in this torch (torch 2.15 renamed it, its old name warns there)."""
    return {seams.BENCHMARK_FUSION.present_attr(): False}


def capture_model(
    model: ModelFile,
    *,
    batch_sizes: tuple[int | None, ...] = (None,),
    mode: str = "max-autotune",
    inductor_config: dict[str, Any] | None = None,
    train: bool = False,
    device: str = "cpu",
    dynamic: bool = False,
    on_request: Callable[[TuningRequest, Environment | None], None] | None = None,
    pad_decisions: dict[str, dict[str, Any]] | None = None,
    distributed: DistributedSpec | None = None,
) -> CaptureResult:
    """Compile ``model`` in dry-run mode and list its requests.

    Once per batch size; with several, the first size's compiled model is then called on
    the others in turn, which recompiles it with a dynamic batch (automatic dynamic
    shapes, what a job whose batch size changes compiles). ``dynamic``: the dimensions the
    model file names in DYNAMIC_DIMS (default: the batch dimension, 0, of every tensor input)
    are dynamic from the first call (``torch._dynamo.mark_dynamic``), once per batch size, instead;
    where two of them have one size, again as ``dynamic=True`` gives them (one symbol for both);
    and each size once more under plain ``dynamic=True`` (``compile_sessions``).
    ``on_request(request, env)`` is called for each new request as it is found,
    while the compile goes on. ``pad_decisions``: padding verdicts stored by an earlier
    sweep, served instead of timed. ``distributed``: the model compiled as one rank of a DDP
    or FSDP2 job compiles it (``autotune sweep --ddp/--fsdp``).
    """
    from . import padding
    from .env import pin_triton_toolchain

    seams.usable(seams.SWEEP_CAPTURE)  # a seam this torch lacks: one warning naming it
    pin_triton_toolchain()
    policy = CapturePolicy(device=device, on_request=on_request)
    pads = padding.MemoryBook(pad_decisions)
    padding.push(pads)
    try:
        result = _capture_sessions(model, policy, batch_sizes, mode, inductor_config, train, device, dynamic,
                                   distributed)
    finally:
        padding.pop()
    result.pad_decisions = pads.new
    return result


def _capture_sessions(model: ModelFile, policy: CapturePolicy, batch_sizes: tuple[int | None, ...], mode: str,
                      inductor_config: dict[str, Any] | None, train: bool, device: str,
                      dynamic: bool, distributed: DistributedSpec | None = None) -> CaptureResult:
    start = time.perf_counter()
    overrides: dict[str, Any] = {}
    for session in compile_sessions(batch_sizes, dynamic):
        module, inputs, later = build_session(model, session)  # may itself set config: read overrides after
        overrides = {**model.config_overrides, **(inductor_config or {})}
        log.info("capturing %s batch_sizes=%s mode=%s dynamic=%s", model.path, session.sizes, mode, session.dynamic)
        for dims, duck in session_variants(session, model, inputs):
            with fresh_inductor({**overrides, **capture_config()}), installed(policy), no_runtime_tuning():
                try:
                    _run_once(module, inputs, mode, train, device, later, dynamic_dims=dims, duck=duck,
                              distributed=distributed)
                except Exception as exc:  # the model's own error, or one its graph hits in Inductor
                    if (cache_error := find_cause(exc, CacheError)) is not None:
                        raise cache_error from None  # the cache's own one line, not the model's fault
                    first = (str(exc).strip().splitlines() or [""])[0][:300]
                    sizes = ",".join(str(b or "") for b in session.sizes)
                    raise ModelFileError(
                        f"{model.path}: compiling and running {model.entry}({sizes}) raised "
                        f"{type(exc).__name__}: {first}; check that `{model.entry}()`'s module runs on its inputs"
                    ) from exc
    requests = [observed.to_request() for observed in policy.seen.values()]
    return CaptureResult(
        env=policy.env,
        requests=requests,
        config_overrides=overrides,
        mode=mode,
        device=device,
        seconds=time.perf_counter() - start,
        total_lookups=policy.lookups,
    )


def capture_file(
    path: str,
    entry: str = "example",
    **kwargs: Any,
) -> CaptureResult:
    return capture_model(load_model_file(path, entry), **kwargs)
