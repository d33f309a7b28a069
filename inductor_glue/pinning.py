"""Pinning: on a cache hit, generate only the Triton config that won.

Inductor renders and loads every Triton template config of a GEMM/conv before
it asks the selector anything; for ResNet-18 that is most of what a warm
max-autotune compile spends beyond default mode. Rendering is what produces a
choice's hash, so the hash cannot tell us beforehand which configs to skip.

Instead every ``TritonTemplate.generate`` call is given two digests of its own
arguments: a *family* (template, input layouts, output size and dtype: one
request's configs of one template) and a *key* (the family plus every scalar
argument: tile sizes, stages, warps...). The worker stores both with each
candidate. The warm-start hook then lets a generate call through only when its
family is unknown (a miss: Inductor tunes as usual) or its key is a stored
winner's. The lookup still compares choice hashes, so a pinned config whose
source changed is a miss, never a wrong answer.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from autotune.cache.records import digest

from . import seams
from .patching import StackedPatch

log = logging.getLogger(__name__)

PIN_FAMILY = "pin.family"
PIN_KEY = "pin.key"
# A stored winner's scalar generate() arguments, kept where the job's own config list may lack
# it (an exhaustive search's winner, workers/search.py): the hook generates it from them.
PIN_ARGS = "pin.args"

# generate() arguments that are objects, not choices of a config: left out of the key.
_NOT_SCALAR = {"self", "input_nodes", "layout", "kwargs", "epilogue_fn", "subgraphs", "mutated_inputs",
               "call_sizes", "workspace_arg", "triton_meta", "generate_with_caching"}


class Pin(NamedTuple):
    device: str  # device type of the inputs ("cuda"): which environment's winners apply
    family: str
    key: str
    args: tuple[tuple[str, Any], ...] = ()  # the scalar arguments the key digests, sorted


# Decides whether a generate call goes ahead; None lets everything through. A Pin instead of
# True/False: generate that config in this one's place (its family's stored winner, which this
# compile's config list lacks), once per lowering.
TemplateFilter = Callable[[Pin], "bool | Pin"]


def _scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str, type(None)))


def pin_of(template: Any, arguments: dict[str, Any]) -> Pin | None:
    """(family, key) of one generate call, or None where its inputs cannot be read."""
    from torch._inductor import select_algorithm as sa

    try:
        inputs = [[str(part) for part in sa.AlgorithmSelectorCache.key_of(node)] for node in arguments["input_nodes"]]
        layout = arguments["layout"]
        output = [str(layout.dtype), [str(s) for s in layout.size]]
    except Exception:  # a node without a plain layout: never pin it
        log.debug("no pin for a %s config", getattr(template, "name", template), exc_info=True)
        return None
    family = digest(str(getattr(template, "name", "")), inputs, output)[:32]
    scalars = {k: v for k, v in arguments.items() if k not in _NOT_SCALAR and _scalar(v)}
    scalars.update({k: v for k, v in (arguments.get("kwargs") or {}).items() if _scalar(v)})
    device = inputs[0][0] if inputs else "cpu"
    return Pin(device, family, digest(family, scalars)[:32], tuple(sorted(scalars.items())))


def _patched_generate(original: Any, patch: StackedPatch[TemplateFilter | None]) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(self, *args, **kwargs)
            pin = pin_of(self, dict(bound.arguments))
        except TypeError:
            pin = None
        allow = patch.top
        verdict = allow(pin) if pin is not None and allow is not None else True
        if isinstance(verdict, Pin) and pin is not None:
            return _generate_instead(original, self, bound, pin, verdict)
        if not verdict or (pin is not None and _LOWERINGS.generated(pin, bound.arguments)):
            return None  # a stored loser (or a winner generated in its place already): never rendered
        choice = original(self, *args, **kwargs)
        if choice is not None and pin is not None:
            try:
                choice.autotune_pin = pin
            except AttributeError:
                pass
        return choice

    return generate


class _Lowerings:
    """Which stored winner was generated in another config's place, per lowering (a family and
    its input nodes), so that it is generated once there. Bounded: a lowering forgotten can only
    leave its winner ungenerated, and the hook then serves the best of the rest."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._done: dict[tuple[str, tuple[int, ...]], str] = {}

    @staticmethod
    def _lowering(pin: Pin, arguments: Any) -> tuple[str, tuple[int, ...]]:
        return pin.family, tuple(id(node) for node in arguments.get("input_nodes") or ())

    def generated(self, pin: Pin, arguments: Any) -> bool:
        return self._done.get(self._lowering(pin, arguments)) == pin.key

    def claim(self, pin: Pin, arguments: Any, key: str) -> bool:
        """True once per lowering: this call may generate ``key`` in its place."""
        lowering = self._lowering(pin, arguments)
        if lowering in self._done:
            return False
        if len(self._done) >= self.LIMIT:
            self._done.clear()
        self._done[lowering] = key
        return True


_LOWERINGS = _Lowerings()


def _generate_instead(original: Any, template: Any, bound: inspect.BoundArguments, pin: Pin, instead: Pin) -> Any:
    """``instead`` (a stored winner of ``pin``'s family) generated from this call's arguments
    with its scalars; None where it was generated already in this lowering, or where the
    arguments do not come out as its key (its source would differ: never served)."""
    arguments = dict(bound.arguments)
    extra = dict(arguments.get("kwargs") or {})
    for name, value in instead.args:
        if name in arguments and name != "kwargs":
            arguments[name] = value
        else:
            extra[name] = value
    if "kwargs" in bound.signature.parameters:
        arguments["kwargs"] = extra
    moved = pin_of(template, arguments)
    if moved is None or moved.key != instead.key or not _LOWERINGS.claim(pin, bound.arguments, instead.key):
        return None
    rebound = inspect.BoundArguments(bound.signature, arguments)
    choice = original(*rebound.args, **rebound.kwargs)
    if choice is not None:
        try:
            choice.autotune_pin = moved
        except AttributeError:
            pass
    return choice


_GENERATE: StackedPatch[TemplateFilter | None] = StackedPatch(seams.TEMPLATE_GENERATE, _patched_generate)


def push(template_filter: TemplateFilter | None) -> None:
    """Start annotating (and, given a filter, pinning) Triton template configs."""
    _GENERATE.push(template_filter)


def pop() -> None:
    """Undo the latest push; the last one restores Inductor's own generate."""
    _GENERATE.pop()


def pin_params(choice: Any) -> dict[str, str]:
    """The pin digests of a generated choice, as candidate params."""
    pin = getattr(choice, "autotune_pin", None)
    return {PIN_FAMILY: pin.family, PIN_KEY: pin.key} if pin else {}


def pin_args(choice: Any) -> dict[str, Any]:
    """The scalar generate() arguments of a generated choice (``PIN_ARGS``), empty if unknown."""
    pin = getattr(choice, "autotune_pin", None)
    return dict(pin.args) if pin else {}


class PinIndex:
    """Which Triton configs to generate, built from stored results of one environment.

    A family that appears in a stored result is pinned: only the keys of stored
    winners in it are generated. If a family has no stored winner (ATen or
    another template won) none of its configs are generated.

    ``fastest_template_too``: also generate each result's fastest Triton config when
    ATen won it, so that a compile timing its choices in the graph weighs a template
    against ATen as cold max-autotune does (autotune/job/in_graph.py).

    ``also``: keys generated in any case. A template the sweep's pass fused with its
    epilogue was finalized with one config, which must exist here too for the stored
    fusion verdict to be served (inductor_glue/fusion.py), even where ATen won alone.
    """

    def __init__(self, results: list[Any], *, fastest_template_too: bool = False,
                 also: frozenset[str] = frozenset()) -> None:
        self.allowed: dict[str, set[str]] = {}
        self.also = also  # keys generated whatever won: configs a stored fusion verdict names
        self.winners: dict[str, Pin] = {}  # family -> its stored winner, where its arguments are kept
        for result in results:
            chosen = {result.winner.choice_hash} if result.winner is not None else set()
            self._keep_arguments(result.winner)
            fastest = fastest_template(result.candidates) if fastest_template_too else None
            if fastest is not None:
                chosen.add(fastest.choice_hash)
            for candidate in result.candidates:
                family = candidate.params.get(PIN_FAMILY)
                if not family:
                    continue
                keys = self.allowed.setdefault(str(family), set())
                if candidate.choice_hash in chosen:
                    keys.add(str(candidate.params.get(PIN_KEY)))

    def _keep_arguments(self, winner: Any) -> None:
        params = winner.params if winner is not None else {}
        stored = params.get(PIN_ARGS)
        if isinstance(stored, dict) and params.get(PIN_FAMILY) and params.get(PIN_KEY):
            family = str(params[PIN_FAMILY])
            self.winners[family] = Pin("", family, str(params[PIN_KEY]), tuple(sorted(stored.items())))

    def allows(self, pin: Pin) -> bool:
        keys = self.allowed.get(pin.family)
        return keys is None or pin.key in keys or pin.key in self.also

    def instead(self, pin: Pin) -> Pin | None:
        """The stored winner to generate in place of the config ``pin`` (which lost), where its
        arguments were kept; None otherwise."""
        winner = self.winners.get(pin.family)
        return winner if winner is not None and winner.key != pin.key else None


def fastest_template(candidates: Sequence[Any]) -> Any | None:
    """The fastest pinnable Triton config among stored candidates that ran, or None.
    The worker checks this one when ATen wins, and the in-graph pass times it."""
    pinned = [c for c in candidates if c.params.get(PIN_KEY) and c.time_ms is not None]
    return min(pinned, key=lambda c: (c.time_ms, c.choice_hash)) if pinned else None
