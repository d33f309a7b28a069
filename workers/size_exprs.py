"""Symbolic sizes that are no product of symbols, rebuilt inside the one-op graph.

A dimension of ``s77*((s53//4))**2`` (a batch of square images cut into 4x4 patches,
under ``dynamic=True``) or ``s77*(s27 - 1)`` (a sliced sequence) cannot be an input's
size: Dynamo gives every input dimension a symbol of its own, and splitting a dimension
into factors (``workers.symbolic``) only spells products. So the graph takes

- a *sizes* input, a stride-0 tensor whose dimension i has the hint of the model's i-th
  symbol, marked dynamic and numbered as the model numbered that symbol, and
- each symbolic input flattened to one dimension (a fresh symbol of no consequence),

and inside evaluates each recorded expression on the sizes input's SymInts with
Python's own operators, then views the flat input with the result (``FlatCarrier``
says how, around Inductor's habit of expanding sizes). Dynamo then builds the sympy
expressions the model's graph built (FloorDiv, Add, Mul), which Inductor writes into
kernel source. A reproduction that still differs is reported as key_mismatch by the
caller, never tuned under the model's key.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from autotune.cache.records import InputLayout, TuningRequest

from .symbolic import as_module, carriers_for, memory_order, symbol_hints

SIZES_ARG = "sizes"  # the module's first argument; Dynamo's source for dimension i is L['sizes'].size()[i]

_BINARY: dict[type, str] = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.FloorDiv: "floordiv",
                            ast.Mod: "mod"}
_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
    "mod": operator.mod,
}


class UnsupportedExpression(ValueError):
    """A size expression with something other than integers, symbols, + - * // % and ** n."""


# An expression parsed once, outside the traced graph (Dynamo cannot trace ast): an int,
# a symbol's name, or (operator, left, right) / ("neg", operand).
Term = Any


def parse(expr: str) -> Term:
    """``expr`` as Inductor prints a size (Python syntax), as a Term."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise UnsupportedExpression(expr) from exc
    return _term(tree.body, expr)


def _term(node: ast.AST, expr: str) -> Term:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return ("neg", _term(node.operand, expr))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        # A power is what sympy makes of a repeated product: multiply, so that it comes
        # back as the same Mul/Pow (a SymInt's ** would build another function).
        exponent, base = _term(node.right, expr), _term(node.left, expr)
        if not (isinstance(exponent, int) and exponent > 0):
            raise UnsupportedExpression(expr)
        term = base
        for _ in range(exponent - 1):
            term = ("mul", term, base)
        return term
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return (_BINARY[type(node.op)], _term(node.left, expr), _term(node.right, expr))
    raise UnsupportedExpression(expr)


def evaluate(term: Term, values: Mapping[str, Any]) -> Any:
    """``term`` with ``values`` for its symbols: ints give an int, SymInts a SymInt built
    by the same operations as the model's graph built it. Plain Python, so Dynamo traces it."""
    if isinstance(term, int):
        return term
    if isinstance(term, str):
        return values[term]
    if term[0] == "neg":
        return -evaluate(term[1], values)
    return _OPERATORS[term[0]](evaluate(term[1], values), evaluate(term[2], values))


def factors(term: Term) -> list[Term]:
    """A product's factors, left to right (a power already came out as a product)."""
    if isinstance(term, tuple) and term[0] == "mul":
        return factors(term[1]) + factors(term[2])
    return [term]


def _expands(group: list[Term]) -> bool:
    """Whether sympy.expand, which Inductor applies to every size a view is given, would
    rewrite this product: a sum times anything (``s77*(s27 - 1)`` -> ``s27*s77 - s77``)."""
    return len(group) > 1 and any(isinstance(f, tuple) and f[0] in ("add", "sub", "neg") for f in group)


@dataclass(frozen=True)
class FlatCarrier:
    """One input as a flat view of its memory, viewed back to the recorded sizes in the graph.

    Twice: first to every dimension's factors, each a size Inductor keeps as it is; then
    the factors merged into the dimensions. A merged size that Inductor would expand is
    given as -1 instead, which Inductor resolves as the quotient of the factors' product,
    keeping the product's form (how the model's graph got it: a view(-1, K) of a tensor
    of those factors). One such dimension per input at most."""

    order: tuple[int, ...]  # the input's dimensions from outermost (largest stride) in
    split: tuple[Term, ...]  # every dimension's factors, in memory order
    merged: tuple[Term | None, ...]  # per dimension in memory order: its size, or None for -1

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.permute(self.order).reshape(-1)

    def unpack(self, flat: torch.Tensor, values: Mapping[str, Any]) -> torch.Tensor:
        tensor = flat.view([evaluate(size, values) for size in self.split])
        if len(self.split) != len(self.merged):
            tensor = tensor.view([-1 if size is None else evaluate(size, values) for size in self.merged])
        return tensor.permute(tuple(self.order.index(d) for d in range(len(self.order))))


def flat_carrier_for(tensor: torch.Tensor, layout: InputLayout, hints: dict[str, int]) -> FlatCarrier | None:
    """The flat carrier of an input built with the recorded layout, or None (not dense,
    another shape than recorded, an expression that does not evaluate to the recorded
    size, or two whose form only a -1 keeps)."""
    order = memory_order(tensor, layout)
    if order is None:
        return None
    exprs = dict(zip(layout.symbolic, layout.exprs))
    split: list[Term] = []
    merged: list[Term | None] = []
    for dim in order:
        if dim not in exprs:
            split.append(layout.sizes[dim])
            merged.append(layout.sizes[dim])
            continue
        try:
            term = parse(exprs[dim])
            value = evaluate(term, hints)
        except (UnsupportedExpression, KeyError, ZeroDivisionError):  # KeyError: a symbol without a hint
            return None
        if value != layout.sizes[dim]:
            return None
        group = factors(term)
        split += group
        merged.append(None if _expands(group) else term)
    if merged.count(None) > 1:
        return None
    return FlatCarrier(order, tuple(split), tuple(merged))


class SizedModule(torch.nn.Module):
    """Evaluates the sizes, unpacks the flat carriers, then calls the builder's function."""

    def __init__(self, fn: Callable[..., torch.Tensor], carriers: tuple[FlatCarrier | None, ...],
                 symbols: tuple[str, ...]) -> None:
        super().__init__()
        self.inner = as_module(fn)
        self.carriers = carriers
        self.symbols = symbols

    def forward(self, sizes: torch.Tensor, a0: torch.Tensor, a1: torch.Tensor | None = None,
                a2: torch.Tensor | None = None, a3: torch.Tensor | None = None) -> torch.Tensor:
        values = {name: sizes.size(i) for i, name in enumerate(self.symbols)}
        given = [a for a in (a0, a1, a2, a3) if a is not None]
        args = [c.unpack(a, values) if c is not None else a for a, c in zip(given, self.carriers)]
        return self.inner(*args)


@dataclass
class SizedGraph:
    module: SizedModule
    inputs: tuple[torch.Tensor, ...]  # the sizes tensor, then the (flat or untouched) inputs
    symbol_ids: dict[str, int]  # for workers.symbolic.symbol_numbers() while it compiles


def carry_expressions(fn: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...],
                      request: TuningRequest) -> SizedGraph | None:
    """The builder's graph with each symbolic input rebuilt from the model's size
    expressions, or None when one cannot be (the caller then reports what it gets)."""
    hints = symbol_hints(request)
    numbers = {name: int(name[1:]) for name in hints if name[:1] == "s" and name[1:].isdigit()}
    carriers = carriers_for(inputs, request, hints, flat_carrier_for) if len(numbers) == len(hints) else None
    if carriers is None:
        return None
    symbols = tuple(sorted(hints))
    sizes = torch.empty((), device=inputs[0].device).expand(*(hints[name] for name in symbols))
    packed = tuple(c.pack(t) if c else t for t, c in zip(inputs, carriers))
    _mark(sizes, packed, carriers)
    ids = {f"L['{SIZES_ARG}'].size()[{i}]": numbers[name] for i, name in enumerate(symbols)}
    return SizedGraph(SizedModule(fn, tuple(carriers), symbols), (sizes, *packed), ids)


def _mark(sizes: torch.Tensor, packed: tuple[torch.Tensor, ...], carriers: list[FlatCarrier | None]) -> None:
    """Every symbol its own dimension of ``sizes`` (marked, so never duck-shared); a flat
    input weakly dynamic (the view may solve its size for the expressions, which a strict
    mark would refuse as a specialization); the rest static."""
    for dim in range(sizes.dim()):
        torch._dynamo.mark_dynamic(sizes, dim)
    for tensor, carrier in zip(packed, carriers):
        for dim in range(tensor.dim()):
            if carrier is None:
                torch._dynamo.mark_static(tensor, dim)
            else:
                torch._dynamo.maybe_mark_dynamic(tensor, dim)
