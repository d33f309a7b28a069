"""Epilogue-fusion verdicts: whether a GEMM template absorbed its neighbour, decided once.

On GPUs every mm-family lowering under max-autotune is a ``MultiTemplateBuffer``, and the
scheduler settles each template's epilogue (and prologue) fusions by benchmarking: the
fused template against the best choice alone plus the neighbour alone
(``Scheduler.speedup_by_fusion``). Each process measures afresh. Those GEMMs often take a
few microseconds and their choices time nearly alike, so the verdict flips from process to
process. A flip changes which kernels the graph has, and with them every later kernel's name
and source, which is what a stored pointwise config is keyed by: on GPUs, a CNN's warm start
(MobileNetV3's) retuned many of its pointwise kernels in one run and none in the next.

So the sweep's end-to-end pass records each verdict it reaches, and a job serves it: no
benchmark, and the same kernels as the compile whose pointwise configs were stored. A
verdict is keyed by the graph (its FX nodes and input layouts) and the two scheduler nodes'
names; it names the Triton config the template was finalized with, by its pin key
(inductor_glue/pinning.py), and is served only when that config was generated here. Anything
else (an unknown pair, a config not generated, multi-kernel hints) falls back to Inductor's
own benchmark, and what it decides is recorded.

A verdict is served in the form Inductor gave it: at once, or pending (resolved later
with the other template fusions of its round). An answer given at once where Inductor's was
pending fuses inside the scheduler's loop over candidate pairs, so the later pairs of that
round see the fused node under another name: on a GPU a Llama decoder's rotary ``bmm``
template had two prologue candidates, both fused in the pass, and the warm start, served
the first at once, timed the second against the fused node and refused it, which changed
every later kernel.

Data only: a boolean, a pin key and the answer's form, in the kernel_configs table under
``PREFIX``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from autotune.cache.records import digest

from . import seams
from .patching import StackedPatch

log = logging.getLogger(__name__)

PREFIX = "fusion:"


class DecisionBook(Protocol):
    """Where decisions Inductor reaches by benchmarking come from and go to (the hook's
    store, autotune/job/serve_policy.py): fusion verdicts here, padding verdicts (padding.py)."""

    def stored(self, key: str) -> dict[str, Any] | None: ...

    def record(self, key: str, verdict: dict[str, Any]) -> None: ...

    def served(self, key: str) -> None: ...


def graph_fingerprint(graph: Any) -> str:
    """The FX graph being lowered, as a digest: its nodes without source locations (a job's
    model file may live elsewhere than the sweep's) and its inputs' layouts (one graph
    compiled at two static batch sizes has the same nodes)."""
    cached = getattr(graph, "_autotune_fingerprint", None)
    if cached is not None:
        return cached
    module = getattr(graph, "orig_gm", None) or getattr(graph, "module", None)
    nodes = [node.format_node() for node in module.graph.nodes] if module is not None else []
    inputs = [_layout(t) for t in getattr(graph, "example_inputs", None) or ()]
    fingerprint = digest(nodes, inputs)[:32]
    try:
        graph._autotune_fingerprint = fingerprint
    except AttributeError:
        pass
    return fingerprint


def _layout(value: Any) -> Any:
    try:
        return [str(value.dtype), [str(s) for s in value.size()], [str(s) for s in value.stride()]]
    except (AttributeError, TypeError, RuntimeError):
        return type(value).__name__


def fusion_key(fingerprint: str, node1: Any, node2: Any, epilogue: bool) -> str:
    return PREFIX + digest(fingerprint, "epilogue" if epilogue else "prologue",
                           node1.get_name(), node2.get_name())[:40]


def multi_template(node1: Any, node2: Any) -> tuple[Any, bool] | None:
    """The MultiTemplateBuffer a fusion would settle, and whether it is an epilogue fusion
    (the template first); None when neither node is one."""
    from torch._inductor import ir

    for node, epilogue in ((node1, True), (node2, False)):
        if node.is_template() and isinstance(node.get_template_node(), ir.MultiTemplateBuffer):
            return node.get_template_node(), epilogue
    return None


def _pin_key(choice: Any) -> str | None:
    pin = getattr(choice, "autotune_pin", None)
    return pin.key if pin is not None else None


def finalized_choice(multi: Any) -> Any | None:
    """The Triton choice a fused template was finalized with (Inductor sets the buffer's
    renderer to the choice's own), or None."""
    render = getattr(multi, "make_kernel_render", None)
    for choice in multi.choices:
        get = getattr(choice, "get_make_kernel_render", None)
        if get is not None and render is not None and get() is render:
            return choice
    return None


def _result(should_fuse: bool) -> Any:
    try:
        from torch._inductor.scheduler import FusionResult
    except ImportError:  # a torch whose speedup_by_fusion returns a plain bool
        return should_fuse
    return FusionResult.fuse(should_fuse)


def _pending(decide: Callable[[], bool], with_future: bool) -> Any | None:
    """A pending answer, as Inductor's own: its future already done when Inductor's had one
    (the scheduler then resolves it with the async-compiled fusions of its round)."""
    try:
        from torch._inductor.codecache import LambdaFuture
        from torch._inductor.scheduler import FusionResult
    except ImportError:
        return None
    future = None
    if with_future:
        done: Future[None] = Future()
        done.set_result(None)
        future = LambdaFuture(lambda: None, done)
    return FusionResult.from_callable(decide, future)


def _finalize(multi: Any, choice: Any) -> bool:
    try:
        multi.finalize_as_triton_caller(choice)
    except AssertionError:  # the stored config's layout is not this buffer's
        return False
    return True


def serve(scheduler: Any, multi: Any, verdict: dict[str, Any]) -> Any | None:
    """The stored verdict as Inductor's answer, in the form Inductor gave it, the template
    finalized as it was where the verdict was reached; None when it cannot be applied here."""
    from torch._inductor import config

    if not isinstance(verdict.get("fuse"), bool) or config.multi_kernel_hints:
        return None
    chosen = None
    if verdict["fuse"]:
        named = [c for c in multi.choices if _pin_key(c) is not None and _pin_key(c) == verdict.get("choice")]
        conflict = getattr(scheduler, "_has_layout_conflict_for_template", None)
        if len(named) != 1 or (conflict is not None and conflict(multi)):
            return None
        chosen = named[0]
    if verdict.get("pending") is True:
        # Finalized when the scheduler resolves it, as Inductor's own benchmark would be; a
        # layout that refuses the config then refuses the fusion (too late to benchmark).
        return _pending(lambda: chosen is not None and _finalize(multi, chosen), verdict.get("future") is True)
    if chosen is not None and not _finalize(multi, chosen):
        return None
    return _result(chosen is not None)


def _verdict(multi: Any, fused: bool) -> dict[str, Any] | None:
    if not fused:
        return {"fuse": False, "choice": None}
    choice = finalized_choice(multi)
    key = _pin_key(choice) if choice is not None else None
    return {"fuse": True, "choice": key} if key is not None else None  # unservable: not kept


def recording(outcome: Any, multi: Any, keep: Callable[[dict[str, Any]], None]) -> Any:
    """``outcome`` of Inductor's speedup_by_fusion, with its verdict passed to ``keep`` once
    known: at once, or for a pending fusion "not fused" now and its benchmark's verdict
    when the scheduler resolves it (``keep`` may be called twice for one pair: last wins)."""

    def note(fused: Any, form: dict[str, bool]) -> None:
        try:
            verdict = _verdict(multi, bool(fused))
            if verdict is not None:
                keep({**verdict, **form})
        except Exception:  # keeping a copy must never break the compile
            log.debug("could not record a fusion verdict", exc_info=True)

    if isinstance(outcome, bool):
        note(outcome, {})
        return outcome
    if getattr(outcome, "should_fuse", None) is not None:
        note(outcome.should_fuse, {})
        return outcome
    pending = getattr(outcome, "callable_fn", None)
    if pending is None:
        return outcome
    form = {"pending": True, "future": getattr(outcome, "future", None) is not None}
    # Until Inductor resolves it: a compile that never does (its template fused with another
    # candidate first) left this pair unfused, and a job that gets to resolve it must too.
    note(False, {**form, "resolved": False})

    def resolve() -> bool:
        fused = pending()
        note(fused, form)
        return fused

    return type(outcome).from_callable(resolve, outcome.future)


def _patched_speedup(original: Any, patch: StackedPatch[DecisionBook]) -> Any:
    def speedup_by_fusion(self: Any, node1: Any, node2: Any) -> Any:
        book = patch.top
        found = _settled(node1, node2) if book is not None else None
        if book is None or found is None:
            return original(self, node1, node2)
        multi, key, graph = found
        try:
            stored = book.stored(key)
            served = serve(self, multi, stored) if stored is not None else None
        except Exception:  # the cache never breaks a compile: Inductor decides as it would have
            log.debug("could not serve a fusion verdict", exc_info=True)
            served = None
        if served is not None:
            book.served(key)
            return served
        # The graph and the nodes' names travel with the verdict, to compare two compiles by.
        where = {"graph": graph, "nodes": [node1.get_name(), node2.get_name()]}
        return recording(original(self, node1, node2), multi, lambda verdict: book.record(key, {**verdict, **where}))

    return speedup_by_fusion


def _settled(node1: Any, node2: Any) -> tuple[Any, str, str] | None:
    """(the template, the verdict's key, the graph's fingerprint) for a fusion Inductor would
    benchmark; None otherwise."""
    try:
        from torch._inductor.virtualized import V

        found = multi_template(node1, node2)
        if found is None:
            return None
        multi, epilogue = found
        graph = graph_fingerprint(V.graph)
        return multi, fusion_key(graph, node1, node2, epilogue), graph
    except Exception:  # an Inductor without these internals: leave its fusions alone
        log.debug("no fusion key", exc_info=True)
        return None


_SPEEDUP: StackedPatch[DecisionBook] = StackedPatch(seams.SPEEDUP_BY_FUSION, _patched_speedup)


def push(book: DecisionBook) -> None:
    """Serve and record template fusion verdicts through ``book`` from now on."""
    _SPEEDUP.push(book)


def pop() -> None:
    _SPEEDUP.pop()
