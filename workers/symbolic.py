"""Symbolic sizes in a one-op graph, spelled as the model's graph spelled them.

Inductor writes a symbolic size into kernel source as the expression the graph has
for it, in the graph's own symbols: a Linear on a (batch, seq, dim) input asks with
M = ``s27*s77`` (seq times batch), and a C++ GEMM template's source then reads
``ks27*ks77``. A one-op graph on a 2-D input marked dynamic would ask with M = ``s33``:
same hints, same inputs_key, other source, so other choice hashes (``key_mismatch``).

So each symbolic input is passed as a *carrier*: the same memory, viewed with every
symbolic dimension split into its factors (``s77``, ``s27``; a constant such as 16
stays a static dimension), and flattened back inside the graph, which gives Inductor
the same products. Symbols are named after a hash of where Dynamo found them (torch
2.7+: ``L['x'].size()[0]`` is ``s77``); while the graph compiles, each carrier
dimension's symbol gets the number the model's had instead.

Only monomials (``c * s_i**k_i``) on dense inputs are carried; anything else is marked
dynamic as it stands, and a reproduction that then differs is reported as key_mismatch.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from autotune.cache.records import InputLayout, TuningRequest

_SIZE_SYMBOL = re.compile(r"s(\d+)")
MAX_INPUTS = 4  # the carrier module's forward names its arguments a0..a3 (builders pass at most 3)
T = TypeVar("T")


@dataclass(frozen=True)
class Carrier:
    """How one input travels: ``view`` of it in memory order, split into factors."""

    order: tuple[int, ...]  # the input's dimensions from outermost (largest stride) in
    factors: tuple[tuple[int, str | None], ...]  # (size hint, symbol or None if static), in memory order
    groups: tuple[tuple[int, int], ...]  # per dimension in memory order: its factors' [start, end]

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.permute(self.order).reshape(tuple(size for size, _ in self.factors))

    def unpack(self, carrier: torch.Tensor) -> torch.Tensor:
        for start, end in reversed(self.groups):  # right to left: earlier indices stay valid
            if end > start:
                carrier = carrier.flatten(start, end)
        return carrier.permute(tuple(self.order.index(d) for d in range(len(self.order))))


def monomial(expr: str, hints: dict[str, int]) -> list[tuple[int, str | None]] | None:
    """``expr``'s factors, each (hint, symbol), the constant first; None unless it is a
    positive integer times a product of known size symbols."""
    import sympy

    symbols = {name: sympy.Symbol(name, positive=True, integer=True) for name in hints}
    try:
        parsed = sympy.sympify(expr, locals=symbols)
    except (sympy.SympifyError, TypeError, SyntaxError):
        return None
    coeff, rest = parsed.as_coeff_Mul()
    if not (coeff.is_Integer and coeff > 0):
        return None
    factors: list[tuple[int, str | None]] = [(int(coeff), None)] if coeff != 1 else []
    for base, power in sorted(rest.as_powers_dict().items(), key=lambda item: str(item[0])):
        if base == 1:
            continue
        name = str(base)
        if not (base.is_Symbol and name in hints and power.is_Integer and power > 0):
            return None
        factors += [(hints[name], name)] * int(power)
    return factors


def memory_order(tensor: torch.Tensor, layout: InputLayout) -> tuple[int, ...] | None:
    """The input's dimensions from outermost in, or None unless it was built in the recorded
    shape, is dense in that order, and every symbolic dimension has its expression."""
    if tuple(tensor.shape) != layout.sizes or len(layout.exprs) != len(layout.symbolic):
        return None
    return dense_order(tensor)


def dense_order(tensor: torch.Tensor) -> tuple[int, ...] | None:
    """The dimensions from outermost in, or None unless the tensor covers its memory once,
    without gaps, in that order (a size-1 dimension's stride is free)."""
    strides = tensor.stride()
    order = tuple(sorted(range(tensor.dim()), key=lambda d: (-strides[d], d)))
    return order if tensor.permute(order).is_contiguous() else None


def as_module(fn: Callable[..., torch.Tensor]) -> torch.nn.Module:
    """A builder's function as a submodule, so that freezing folds a builder module's
    parameters as in the model."""
    return fn if isinstance(fn, torch.nn.Module) else _Function(fn)


def carrier_for(tensor: torch.Tensor, layout: InputLayout, hints: dict[str, int]) -> Carrier | None:
    """The carrier of an input built with exactly the recorded layout, or None (not dense,
    another shape than recorded, or a size that is no monomial)."""
    order = memory_order(tensor, layout)
    if order is None:
        return None
    exprs = dict(zip(layout.symbolic, layout.exprs))
    factors: list[tuple[int, str | None]] = []
    groups: list[tuple[int, int]] = []
    for dim in order:
        split = monomial(exprs[dim], hints) if dim in exprs else [(layout.sizes[dim], None)]
        if split is None or math.prod(size for size, _ in split) != layout.sizes[dim]:
            return None
        split = split or [(1, None)]  # a constant 1 still needs its dimension
        groups.append((len(factors), len(factors) + len(split) - 1))
        factors += split
    return Carrier(order, tuple(factors), tuple(groups))


class CarrierModule(torch.nn.Module):
    """Unpacks carriers, then calls the builder's function: the graph Inductor compiles.

    The arguments are named (a0, a1, ...) so that the source names Dynamo derives
    symbol numbers from are known in advance."""

    def __init__(self, fn: Callable[..., torch.Tensor], carriers: tuple[Carrier | None, ...]) -> None:
        super().__init__()
        self.inner = as_module(fn)
        self.carriers = carriers

    def forward(self, a0: torch.Tensor, a1: torch.Tensor | None = None, a2: torch.Tensor | None = None,
                a3: torch.Tensor | None = None) -> torch.Tensor:
        given = [a for a in (a0, a1, a2, a3) if a is not None]
        args = [c.unpack(a) if c is not None else a for a, c in zip(given, self.carriers)]
        return self.inner(*args)


class _Function(torch.nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.fn(*args)


def source_symbol_ids(carriers: tuple[Carrier | None, ...]) -> dict[str, int]:
    """Dynamo's source name of every symbolic carrier dimension -> the model's symbol number."""
    ids: dict[str, int] = {}
    for index, carrier in enumerate(carriers):
        for dim, (_, symbol) in enumerate(carrier.factors if carrier else ()):
            match = _SIZE_SYMBOL.fullmatch(symbol or "")
            if match:
                ids[f"L['a{index}'].size()[{dim}]"] = int(match.group(1))
    return ids


@contextlib.contextmanager
def symbol_numbers(ids: dict[str, int]) -> Iterator[None]:
    """While inside, a symbol Dynamo creates for a source in ``ids`` gets that number.

    Dynamo numbers a new size symbol from a hash of its source name (ShapeEnv's
    _generate_unique_id, torch 2.7+); on a torch without it symbols are numbered in
    creation order and nothing is changed here."""
    from autotune.inductor_glue.seams import UNIQUE_ID, SeamMissing

    try:
        shape_env_class, original = UNIQUE_ID.owner(), UNIQUE_ID.resolve()
    except SeamMissing:
        original = None
    if original is None or not ids:
        yield
        return

    def generate(self: Any, source_name: str) -> int:
        wanted = ids.get(source_name)
        if wanted is not None and wanted not in self.unique_ids:
            self.unique_ids.add(wanted)
            return wanted
        # Any other source (a flat carrier's size) must not take a number still wanted.
        pending = set(ids.values()) - self.unique_ids
        self.unique_ids |= pending
        try:
            return original(self, source_name)
        finally:
            self.unique_ids -= pending

    setattr(shape_env_class, UNIQUE_ID.name, generate)
    try:
        yield
    finally:
        setattr(shape_env_class, UNIQUE_ID.name, original)


@dataclass
class Carried:
    """A one-op graph's function and inputs rewritten to carry the recorded expressions."""

    module: CarrierModule
    inputs: tuple[torch.Tensor, ...]
    symbol_ids: dict[str, int]  # for symbol_numbers() while it compiles
    duck: bool  # compile with dynamic=True: equal sizes share one symbol, as s77 in two inputs must


def symbol_hints(request: TuningRequest) -> dict[str, int]:
    """The model's size symbols and their hints, as capture recorded them."""
    return {str(k): int(v) for k, v in (request.params.get("symbols") or {}).items()}


def carriers_for(inputs: tuple[torch.Tensor, ...], request: TuningRequest, hints: dict[str, int],
                 make: Callable[[torch.Tensor, InputLayout, dict[str, int]], T | None]) -> list[T | None] | None:
    """``make``'s carrier for each symbolic input (None for one that travels as it is), or
    None when one cannot be made or none is needed."""
    if not hints or len(inputs) > MAX_INPUTS:
        return None
    carriers: list[T | None] = []
    for index, tensor in enumerate(inputs):
        layout = request.inputs[index] if index < len(request.inputs) else None
        # An input built in another shape than recorded (a 1-D bias Inductor expands) takes
        # its symbolic sizes from the others; it travels as it is.
        if layout is None or not layout.symbolic or tuple(tensor.shape) != layout.sizes:
            carriers.append(None)
            continue
        carrier = make(tensor, layout, hints)
        if carrier is None:
            return None
        carriers.append(carrier)
    return carriers if any(carriers) else None


def own_memory(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` with the same sizes, strides and values in memory of its own, not a view.

    Under ``dynamic=True`` Dynamo gives a view's base symbols of its own first, and duck
    sizing then hands an equal-sized dimension of the view the base's symbol: a carrier of
    512 elements viewed as (512, 1) asked with ``s84`` (its base's), not the model's ``s41``
    (seen with the Llama decoder's rotary ``mm`` on a GPU). An input whose
    elements overlap (an expanded dimension) stays a view: it cannot be copied so."""
    if tensor._base is None or dense_order(tensor) is None:
        return tensor
    owned = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=tensor.device)
    return owned.copy_(tensor)


def carry(fn: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...],
          request: TuningRequest) -> Carried | None:
    """The builder's graph reproducing the request's size expressions, or None when they
    cannot be carried (the caller then marks dimensions as they stand)."""
    hints = symbol_hints(request)
    carriers = carriers_for(inputs, request, hints, carrier_for)
    if carriers is None:
        return None
    packed = tuple(own_memory(c.pack(t) if c else t) for t, c in zip(inputs, carriers))
    # Dynamo shares one symbol between equal sizes only in duck mode (dynamic=True); marked
    # dimensions each get their own. Duck is right unless two symbols have equal hints.
    duck = len(set(hints.values())) == len(hints)
    for tensor, carrier in zip(packed, carriers):
        for dim in range(tensor.dim()):
            if carrier is None or carrier.factors[dim][1] is None:
                torch._dynamo.mark_static(tensor, dim)
            elif not duck:
                torch._dynamo.mark_dynamic(tensor, dim)
    return Carried(CarrierModule(fn, tuple(carriers)), packed, source_symbol_ids(tuple(carriers)), duck)
