"""The one place that touches Inductor's autotune selector.

Every GEMM/conv lowering goes through the process-wide
``select_algorithm._ALGORITHM_SELECTOR_CACHE`` and its ``lookup(choices, op,
inputs_key, benchmark)``. ``Selector`` subclasses it and hands each lookup to a
policy: capture (record, make up timings, compile nothing), tune (benchmark
everything and keep every timing) or serve (answer from the SQL cache).

Inductor calls ``lookup`` without the input nodes, and on GPUs it may call it
long after ``__call__`` returned (multi-template buffers are timed in the
scheduler). So ``__call__`` describes the request up front, and the lookup finds
it by the choices it is handed: the same objects ``__call__`` was given. (op,
inputs_key) alone is not enough: it holds size hints, and two lookups of one graph
can share it with other size expressions, and so other kernels.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import weakref
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import torch
from torch._inductor import select_algorithm as sa

from autotune.cache.records import (
    ALIASED_OPS,
    CONSTANT_OPS,
    CandidateResult,
    InputLayout,
    TuningRequest,
    request_variant,
)

from . import pinning, seams, selector_hold

log = logging.getLogger(__name__)

Timings = dict[Any, float]  # ChoiceCaller -> ms
Benchmark = Callable[[list[Any]], Timings]


@dataclass
class ObservedRequest:
    """A request as seen inside Inductor, before it becomes a plain record."""

    op: str
    inputs_key: str
    precision: str
    inputs: tuple[InputLayout, ...]
    params: dict[str, Any]
    offered: list[Any] = field(default_factory=list)  # every choice Inductor offered

    def to_request(self) -> TuningRequest:
        return TuningRequest(
            op=self.op,
            inputs_key=self.inputs_key,
            precision=self.precision,
            inputs=self.inputs,
            params=self.params,
            choice_hashes=tuple(sorted({choice_hash(c) for c in self.offered})),
        )


class LookupPolicy(Protocol):
    """Answers one lookup. ``default()`` is what Inductor itself would have done."""

    def lookup(
        self,
        request: ObservedRequest,
        choices: list[Any],
        benchmark: Benchmark | None,
        default: Callable[[], Timings],
    ) -> Timings: ...


def choice_hash(choice: Any) -> str:
    return str(choice.hash_key())


def choice_kind(choice: Any) -> str:
    if isinstance(choice, sa.ExternKernelCaller):
        return "aten"
    if isinstance(choice, sa.TritonTemplateCaller):
        return "triton"
    backend = str(_info(choice).get("backend", "")).lower()
    if backend in ("cpp", "cuda", "cutlass", "ck", "subgraph"):
        return backend
    return type(getattr(choice, "_wrapped", choice)).__name__


def _info(choice: Any) -> dict[str, Any]:
    try:
        return dict(choice.info_dict())
    except Exception:  # info_dict is logging-only in Inductor and may be partial
        return {}


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bool, int, str, type(None))):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    return repr(value)


def choice_params(choice: Any) -> tuple[str | None, dict[str, Any]]:
    """(template id, tunable parameters) of a choice, as plain data."""
    params = {k: _jsonable(v) for k, v in _info(choice).items()}
    kwargs = getattr(choice, "kwargs", None)
    if isinstance(choice, sa.ExternKernelCaller) and kwargs:
        params.update({f"kwarg.{k}": _jsonable(v) for k, v in kwargs.items()})
    template_id = None
    ktc = (getattr(choice, "annotations", None) or {}).get("ktc")
    if ktc is not None:
        template = getattr(ktc, "template", None)
        template_id = getattr(template, "uid", None) or getattr(template, "name", None)
        for key, value in (getattr(ktc, "params", None) and _ktc_params(ktc) or {}).items():
            params.setdefault(key, _jsonable(value))
    if template_id is None and isinstance(choice, sa.TritonTemplateCaller):
        template_id = choice.name.rsplit("_", 1)[0]
    params.update(pinning.pin_params(choice))
    return (str(template_id) if template_id is not None else None), params


def _ktc_params(ktc: Any) -> dict[str, Any]:
    params = ktc.params
    for attr in ("to_kwargs", "to_serializeable_dict"):
        if hasattr(params, attr):
            try:
                return dict(getattr(params, attr)())
            except Exception:
                return {}
    return dict(params) if isinstance(params, dict) else {}


def describe_choice(
    choice: Any,
    time_ms: float | None,
    failure_kind: str | None = None,
    failure_message: str | None = None,
) -> CandidateResult:
    template_id, params = choice_params(choice)
    failed = time_ms is None or not math.isfinite(time_ms)
    return CandidateResult(
        choice_hash=choice_hash(choice),
        kind=choice_kind(choice),
        name=str(getattr(choice, "name", type(choice).__name__)),
        description=str(getattr(choice, "description", "") or ""),
        template_id=template_id,
        params=params,
        time_ms=None if failed else float(time_ms),  # type: ignore[arg-type]
        failure_kind=(failure_kind or "benchmark_error") if failed else None,
        failure_message=(failure_message or "Inductor timed it as infinite (it failed to compile or run)")
        if failed
        else None,
    )


def input_layouts(input_nodes: list[Any], op: str | None = None) -> tuple[InputLayout, ...]:
    """Layouts exactly as create_inputs_key sees them (same hints, same strides), and for the
    ops of ``ALIASED_OPS`` which inputs view one buffer (``InputLayout.alias``)."""
    layouts = []
    named = op in ALIASED_OPS or op in CONSTANT_OPS  # the buffer each input reads: both questions need it
    buffers = [_buffer_name(node) if named else None for node in input_nodes]
    constants = _graph_constants() if op in CONSTANT_OPS else ()
    for index, node in enumerate(input_nodes):
        key = sa.AlgorithmSelectorCache.key_of(node)
        ndim = len(node.get_size())
        symbolic = _symbolic_dims(node)
        layouts.append(
            InputLayout(
                device=str(key[0]),
                dtype=str(key[1]),
                sizes=tuple(int(s) for s in key[2 : 2 + ndim]),
                strides=tuple(int(s) for s in key[2 + ndim : 2 + 2 * ndim]),
                offset=int(key[2 + 2 * ndim]),
                symbolic=symbolic,
                exprs=tuple(str(node.get_size()[d]) for d in symbolic),
                alias=_first_alias(buffers, index) if op in ALIASED_OPS else None,
                constant=str(key[0]) == "cpu" and buffers[index] in constants,
            )
        )
    return tuple(layouts)


def _graph_constants() -> Container[str | None]:
    """The buffer names of the graph being lowered that are constants (frozen weights)."""
    from torch._inductor.virtualized import V

    try:
        return cast("Container[str | None]", V.graph.constants)
    except Exception:  # no graph being lowered (a worker rebuilding layouts): no constants
        return ()


def _buffer_name(node: Any) -> str | None:
    """The buffer an input reads: a view (``ReinterpretView``) names its base's, as the kernel
    arguments Inductor de-duplicates by it do. None where the node has no buffer yet."""
    try:
        name = node.get_name()
    except Exception:  # an unrealized node has no name; it is nobody's alias
        return None
    return name if isinstance(name, str) else None


def _first_alias(buffers: list[str | None], index: int) -> int | None:
    name = buffers[index]
    if name is None:
        return None
    first = buffers.index(name)
    return first if first < index else None


def _symbolic_dims(node: Any) -> tuple[int, ...]:
    """Dimensions of node whose size is an expression in the graph's size symbols."""
    return tuple(d for d, size in enumerate(node.get_size()) if getattr(size, "free_symbols", None))


def _symbol_hints(input_nodes: list[Any]) -> dict[str, int]:
    """Each size symbol of the inputs and its hint: the expressions' hints alone do not say
    how a product splits (32 = s27*s77 with s27=16, s77=2), and a worker needs each."""
    from torch._inductor.virtualized import V

    symbols = {sym for node in input_nodes for size in node.get_size() for sym in getattr(size, "free_symbols", ())}
    sizevars: Any = V.graph.sizevars
    # torch 2.13 renamed size_hint (torch 2.11) to optimization_hint; the same number.
    hint = getattr(sizevars, "optimization_hint", None) or sizevars.size_hint
    return {str(sym): int(hint(sym)) for sym in sorted(symbols, key=str)}


def _current_node_params() -> dict[str, Any]:
    """The FX node being lowered: target and its non-tensor arguments."""
    from torch._inductor.virtualized import V

    node = getattr(V.graph, "current_node", None) if V.graph is not None else None
    if node is None:
        return {}
    return {
        "target": str(node.target),
        "args": _jsonable(list(node.args)),
        "kwargs": _jsonable(dict(node.kwargs)),
    }


def _graph_decisions() -> dict[str, Any]:
    """Choices Inductor made for the whole graph that shape this request's layouts.

    layout_opt (channels-last for convolutions) is decided from the whole graph: a
    one-op graph can decide otherwise (a ViT's patch embedding: off in the model,
    where nodes >= 300 x convolutions, on alone), and then asks with other strides.
    """
    from torch._inductor.virtualized import V

    layout_opt = getattr(V.graph, "layout_opt", None)
    return {} if layout_opt is None else {"layout_opt": bool(layout_opt)}


def _aten_kwargs(choices: list[Any]) -> dict[str, Any]:
    for choice in choices:
        if isinstance(choice, sa.ExternKernelCaller) and choice.kwargs:
            return {k: _jsonable(v) for k, v in choice.kwargs.items()}
    return {}


def _variant_key(aten_kwargs: dict[str, Any]) -> str:
    """The request's variant (``cache.records.request_variant``) as a dict key: two lookups
    with one (op, inputs_key) but another fused epilogue or convolution geometry are two requests."""
    return json.dumps(request_variant({"aten": aten_kwargs}), sort_keys=True, default=str)


_NO_VARIANT = _variant_key({})

def _matmul_precision() -> str:
    """The float32 matmul precision a request is described with: torch's one setting, or where
    a script set it per backend (torch 2.15's API, after which torch's one setting raises), the
    per-backend settings as torch 2.15's selector keys its own timings by them."""
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        if seams.FP32_PRECISION_KEY.problem() is not None:
            raise  # a torch whose selector reads the one setting fails here without us too
        return cast(str, seams.FP32_PRECISION_KEY.resolve()())


# torch 2.15 looks timings up under the inputs key followed by how they are benchmarked
# (create_benchmark_cache_key: "<inputs key>:benchmark_policy=eager"); a request is described,
# matched and stored under the inputs key alone, as create_inputs_key gives it.
_BENCHMARK_POLICY = ":benchmark_policy="


def _plain_inputs_key(inputs: str) -> str:
    return inputs.partition(_BENCHMARK_POLICY)[0]


def _selector_base() -> type:
    """Inductor's selector class, to derive from; ``object`` where this torch has none, so
    that this module still imports: ``install`` then refuses, and the hook serves nothing
    (``warm_start()`` and ``autotune doctor`` name the seam)."""
    try:
        return seams.ALGORITHM_SELECTOR_CACHE.resolve()
    except seams.SeamMissing:
        return object


class Selector(_selector_base()):  # type: ignore[misc]
    """Inductor's selector, with lookups answered by a policy."""

    def __init__(self, policy: LookupPolicy) -> None:
        super().__init__()
        self.policy = policy
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str, str, tuple[tuple[str, ...], ...]], ObservedRequest] = {}
        # id(choice) -> (the choice, weakly, and the request __call__ described with it)
        self._described: dict[int, tuple[Callable[[], Any], ObservedRequest]] = {}

    def __call__(self, name: str, choices: list[Any], input_nodes: list[Any], layout: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: E501
        try:
            self._describe(name, choices, input_nodes)
        except Exception:  # describing is bookkeeping; never break a compile on it
            log.debug("could not describe autotune request %s", name, exc_info=True)
        return super().__call__(name, choices, input_nodes, layout, *args, **kwargs)

    def _describe(self, name: str, choices: list[Any], input_nodes: list[Any]) -> None:
        inputs_key = sa.create_inputs_key(input_nodes)
        params: dict[str, Any] = {"aten": _aten_kwargs(choices), "fx": _current_node_params(),
                                  "graph": _graph_decisions()}
        symbols = _symbol_hints(input_nodes)
        if symbols:  # absent for static requests: their params stay as before
            params["symbols"] = symbols
        observed = ObservedRequest(
            op=name,
            inputs_key=inputs_key,
            precision=_matmul_precision(),
            inputs=input_layouts(input_nodes, name),
            params=params,
        )
        exprs = tuple(layout.exprs for layout in observed.inputs)
        with self._lock:
            # One graph can ask twice with one (op, inputs_key) and other size expressions
            # (ConvNeXt-T under dynamic=True: a block's width is s53//4 or
            # ((s53//4)**2)//(s53//4)): their kernels differ, so they are two requests.
            observed = self._pending.setdefault((name, inputs_key, _variant_key(params["aten"]), exprs), observed)
            for choice in choices:
                self._described[id(choice)] = (_weak(choice), observed)

    def lookup(self, choices: list[Any], op: str, inputs: str, benchmark: Benchmark | None, hint_override: int | None = None) -> Timings:  # noqa: E501
        timed_as = inputs  # Inductor's own cache keeps its timings under what it passed
        inputs = _plain_inputs_key(inputs)
        inputs_key = f"{inputs}_{hint_override}" if hint_override is not None else inputs
        variant = _variant_key(_aten_kwargs(choices))
        pending_key = (op, inputs, variant)
        with self._lock:
            observed = self._described_with(choices)
            if observed is None:
                observed = self._first_described(pending_key)
            if observed is None and variant == _NO_VARIANT:
                observed = self._only_variant(op, inputs)
            if observed is None:  # a lowering that bypassed __call__: describe what we can
                observed = ObservedRequest(op, inputs_key, _matmul_precision(), (), {})
                self._pending[(*pending_key, ())] = observed
            known = {choice_hash(c) for c in observed.offered}
            observed.offered.extend(c for c in choices if choice_hash(c) not in known)
        if hint_override is not None:
            observed = ObservedRequest(**{**observed.__dict__, "inputs_key": inputs_key})
        def default() -> Timings:
            return super(Selector, self).lookup(choices, op, timed_as, benchmark, hint_override)

        return self.policy.lookup(observed, list(choices), benchmark, default)

    def _described_with(self, choices: list[Any]) -> ObservedRequest | None:
        """The request ``__call__`` described with these very choice objects."""
        for choice in choices:
            entry = self._described.get(id(choice))
            if entry is not None and entry[0]() is choice:
                return entry[1]
        return None

    def _first_described(self, pending_key: tuple[str, str, str]) -> ObservedRequest | None:
        """The first request described under (op, inputs_key, variant), whatever its sizes'
        expressions: for a lookup whose choices ``__call__`` never saw."""
        return next((observed for key, observed in self._pending.items() if key[:3] == pending_key), None)

    def _only_variant(self, op: str, inputs: str) -> ObservedRequest | None:
        """The request described under (op, inputs), for a lookup whose choices do not name
        its variant (no ATen choice among them); None when several variants or none were."""
        found = [(key[2], observed) for key, observed in self._pending.items() if key[:2] == (op, inputs)]
        # Requests that differ only by their sizes' expressions are one variant: the first stands in.
        return found[0][1] if len({variant for variant, _ in found}) == 1 else None

    def cache_clear(self) -> None:
        super().cache_clear()
        with self._lock:
            self._pending.clear()
            self._described.clear()


def _weak(choice: Any) -> Callable[[], Any]:
    """A weak reference to ``choice`` (a strong one where it takes none): an id is only
    the choice's while the choice lives."""
    try:
        return weakref.ref(choice)
    except TypeError:
        return lambda: choice


@contextlib.contextmanager
def installed(policy: LookupPolicy) -> Iterator[Selector]:
    """Route every autotune lookup in this process through ``policy`` while inside."""
    selector = install(policy)
    try:
        yield selector
    finally:
        uninstall(selector)


_previous: list[Any] = []
# What routing lookups through a policy takes: the class, the methods Selector overrides, the global.
_SELECTOR_SEAMS = (seams.ALGORITHM_SELECTOR_CACHE, seams.SELECTOR_CALL, seams.SELECTOR_LOOKUP,
                   seams.SELECTOR_CACHE_CLEAR, seams.SELECTOR_GLOBAL)


class LazySelector:
    """Stands in for the selector until Inductor first uses it.

    Building a ``Selector`` computes Inductor's system hash, which hashes Triton's whole
    install (about a second on a GPU host, torch 2.11). A compile served from compiled
    artifacts (an FX graph or a Dynamo package) never lowers a GEMM and never needs it, so
    the hook installs this instead; the first call or attribute Inductor asks for builds the
    real one and puts it in place.
    """

    def __init__(self, policy: LookupPolicy, previous: Any) -> None:
        self._policy = policy
        self._previous = previous
        self._selector: Selector | None = None
        self._lock = threading.Lock()

    def selector(self) -> Selector:
        with self._lock:
            if self._selector is None:
                self._selector = _new_selector(self._policy, self._previous)
                if seams.SELECTOR_GLOBAL.get() is self:
                    seams.SELECTOR_GLOBAL.set(self._selector)
            return self._selector

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.selector()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.selector(), name)


def _new_selector(policy: LookupPolicy, previous: Any) -> Selector:
    selector = Selector(policy)
    if previous is not None:
        # Keep what users registered on the selector we replace.
        selector.feedback_saver_fns = list(previous.feedback_saver_fns)
        selector.preprocessing_fns = list(previous.preprocessing_fns)
    return selector


def install(policy: LookupPolicy, *, lazy: bool = False) -> Any:
    """Route every autotune lookup through ``policy``; returns the handle ``uninstall`` takes.
    ``lazy``: build the selector only when Inductor first uses it (the warm-start hook).
    Raises ``SeamMissing`` where this torch lacks the selector's seams."""
    for seam in _SELECTOR_SEAMS:
        seam.resolve()
    previous = selector_hold.unwrap(seams.SELECTOR_GLOBAL.get())  # a background install's hold: what it holds
    selector: Any = LazySelector(policy, previous) if lazy else _new_selector(policy, previous)
    _previous.append(previous)
    seams.SELECTOR_GLOBAL.set(selector)
    # Every policy gets pin digests on Triton choices; one that can answer from
    # stored winners (the hook) also decides which configs are generated at all.
    pinning.push(getattr(policy, "allow_template", None))
    return selector


def uninstall(selector: Any) -> None:
    current = seams.SELECTOR_GLOBAL.get()
    installed_now = current is selector or (isinstance(selector, LazySelector) and current is selector._selector)
    if installed_now and _previous:
        seams.SELECTOR_GLOBAL.set(_previous.pop())
        pinning.pop()


def benchmark_count() -> int:
    """How many times Inductor has benchmarked choices in this process."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["select_algorithm_autotune"])


# Dynamo's timers around each real run of pointwise/reduction autotuning and of coordinate
# descent (an early return, a config served from a cache, is not timed).
_TIMED_TUNING = ("CachingAutotuner.benchmark_all_configs", "CachingAutotuner.coordinate_descent_tuning")


def benchmarks_run() -> int:
    """Benchmarks of any kind Inductor has run in this process: GEMM/conv autotuning, and
    pointwise/reduction autotuning and coordinate descent, as benchmarks/compile_time.py counts them."""
    from torch._dynamo.utils import compilation_time_metrics

    return benchmark_count() + sum(len(compilation_time_metrics.get(name, ())) for name in _TIMED_TUNING)
