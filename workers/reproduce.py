"""Rebuild one recorded request as a one-op graph on inputs of the recorded layout.

Compiling that graph with the same mode and config makes Inductor issue the same
request (same inputs_key, same candidates), so it can be tuned in isolation on
any device of the same model. Each op gets a small builder; an op without one is
reported as unsupported rather than guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from autotune.cache.records import ALIASED_OPS, InputLayout, TuningRequest

from .aliasing import AliasingUnsupported, share_buffers
from .size_exprs import carry_expressions
from .symbolic import carry


class UnsupportedRequest(Exception):
    """The request's op has no one-op reproduction yet."""


@dataclass
class OneOpGraph:
    fn: Callable[..., torch.Tensor]  # what torch.compile compiles (a function or a module)
    inputs: tuple[torch.Tensor, ...]
    reference: Callable[[], torch.Tensor]  # the same op in float32 eager, on the same values
    dynamic: bool | None = None  # torch.compile's dynamic= for this graph
    # Source name -> size symbol number, for workers.symbolic.symbol_numbers while it compiles.
    symbol_ids: dict[str, int] = field(default_factory=dict)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise UnsupportedRequest(f"unknown dtype {name}")
    return dtype


def make_input(layout: InputLayout, device: str, generator: torch.Generator) -> torch.Tensor:
    """A tensor with exactly the recorded sizes, strides, offset and dtype."""
    return _storage((layout,), device, generator).as_strided(layout.sizes, layout.strides, layout.offset)


def _extent(layout: InputLayout) -> int:
    """The elements of storage a layout reaches, its offset included."""
    reach = sum((size - 1) * stride for size, stride in zip(layout.sizes, layout.strides) if size > 0)
    return layout.offset + 1 + reach


def _storage(layouts: tuple[InputLayout, ...], device: str, generator: torch.Generator) -> torch.Tensor:
    """One flat buffer of random values that every layout of ``layouts`` fits in."""
    dtype, numel = _dtype(layouts[0].dtype), max(_extent(layout) for layout in layouts)
    if dtype.is_floating_point:
        storage = torch.randn(numel, generator=generator, dtype=torch.float32).to(dtype)
    else:
        storage = torch.randint(-8, 8, (numel,), generator=generator).to(dtype)
    return storage.to(device)


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()


def _fx_arg(request: TuningRequest, index: int, default: Any = None) -> Any:
    args = request.params.get("fx", {}).get("args", [])
    return args[index] if index < len(args) else default


def _fx_kwarg(request: TuningRequest, name: str, default: Any) -> Any:
    return request.params.get("fx", {}).get("kwargs", {}).get(name, default)


def _bias(layout: InputLayout, device: str, gen: torch.Generator) -> torch.Tensor:
    """Inductor expands a 1-D addmm bias to stride 0; giving it 1-D reproduces that."""
    if len(layout.sizes) == 2 and layout.strides[0] == 0:
        row = InputLayout((layout.sizes[1],), (layout.strides[1],), layout.offset, layout.dtype, layout.device)
        return make_input(row, device, gen)
    return make_input(layout, device, gen)


def _matmul(request: TuningRequest, device: str, gen: torch.Generator) -> OneOpGraph:
    op = request.op
    tensors = [make_input(layout, device, gen) for layout in request.inputs]
    if op in ("mm", "bmm"):
        fn = torch.mm if op == "mm" else torch.bmm
        a, b = tensors[:2]
        return OneOpGraph(fn, (a, b), lambda: fn(a.float(), b.float()))
    if op in ("addmm", "baddbmm"):
        beta = _fx_kwarg(request, "beta", 1)
        alpha = _fx_kwarg(request, "alpha", 1)
        bias = _bias(request.inputs[0], device, gen) if op == "addmm" else tensors[0]
        a, b = tensors[1:3]
        with_bias: Any = torch.addmm if op == "addmm" else torch.baddbmm

        def scaled(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return with_bias(bias, a, b, beta=beta, alpha=alpha)

        return OneOpGraph(scaled, (bias, a, b), lambda: scaled(bias.float(), a.float(), b.float()))
    raise UnsupportedRequest(f"op {op} has no one-op reproduction")


def _convolution(request: TuningRequest, device: str, gen: torch.Generator) -> OneOpGraph:
    kw = request.params.get("aten", {})
    x = make_input(request.inputs[0], device, gen)
    w = make_input(request.inputs[1], device, gen)
    bias = make_input(request.inputs[2], device, gen) if len(request.inputs) > 2 else None
    if bias is None and _fx_arg(request, 2) is not None:
        # The lowering moved the bias out of the template's inputs; the graph still has one.
        bias = torch.randn(w.shape[0], generator=gen).to(dtype=x.dtype, device=device)
    stride, padding, dilation = kw.get("stride", [1]), kw.get("padding", [0]), kw.get("dilation", [1])
    transposed = bool(kw.get("transposed", False))
    output_padding, groups = kw.get("output_padding", [0]), int(kw.get("groups", 1))

    def conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return torch.ops.aten.convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups)

    if bias is None:
        return OneOpGraph(lambda x, w: conv(x, w, None), (x, w), lambda: conv(x.float(), w.float(), None))
    return OneOpGraph(conv, (x, w, bias), lambda: conv(x.float(), w.float(), _f32(bias)))


def _random_linear(weight: InputLayout, has_bias: bool, dtype: torch.dtype, device: str,
                   gen: torch.Generator) -> torch.nn.Linear:
    out_features, in_features = weight.sizes[:2]
    linear = torch.nn.Linear(in_features, out_features, bias=has_bias).to(device=device, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out_features, in_features, generator=gen) / in_features**0.5)
    return linear


class _LinearAdd(torch.nn.Module):
    """A Linear whose output is added to another tensor: freezing fuses the add into
    mkldnn's linear_binary (a residual connection after a block's last Linear)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + other


def _linear_binary(request: TuningRequest, device: str, gen: torch.Generator) -> OneOpGraph:
    """CPU mkldnn linear with a fused add (inputs: x, other, weight[, bias])."""
    attr = str(request.params.get("aten", {}).get("attr", ""))
    if attr != "add" or len(request.inputs) < 3:
        raise UnsupportedRequest(f"linear_binary with attr {attr!r} has no one-op reproduction")
    x_layout, other_layout, weight = request.inputs[:3]
    linear = _random_linear(weight, len(request.inputs) > 3, _dtype(x_layout.dtype), device, gen)
    module = _LinearAdd(linear).eval().requires_grad_(False)
    x, other = make_input(x_layout, device, gen), make_input(other_layout, device, gen)

    def reference() -> torch.Tensor:
        bias = None if linear.bias is None else linear.bias.float()
        return torch.nn.functional.linear(x.float(), linear.weight.float(), bias) + other.float()

    return OneOpGraph(module, (x, other), reference)


def _frozen_linear(request: TuningRequest, weight: InputLayout, has_bias: bool,
                   unary: Callable[[], torch.nn.Module] | None, device: str,
                   gen: torch.Generator) -> OneOpGraph:
    """A frozen nn.Linear of the recorded shape on an input of the recorded layout,
    followed by ``unary`` (as a module) if given."""
    x_layout = request.inputs[0]
    linear = _random_linear(weight, has_bias, _dtype(x_layout.dtype), device, gen)
    module = linear if unary is None else torch.nn.Sequential(linear, unary())
    module = module.eval().requires_grad_(False)
    x = make_input(x_layout, device, gen)

    def reference() -> torch.Tensor:
        bias = None if linear.bias is None else linear.bias.float()
        out = torch.nn.functional.linear(x.float(), linear.weight.float(), bias)
        return out if unary is None else unary()(out)

    return OneOpGraph(module, (x,), reference)


def _packed_linear(request: TuningRequest, device: str, gen: torch.Generator) -> OneOpGraph:
    """CPU mkldnn linear under freezing: a frozen nn.Linear of the recorded shape."""
    # mkl._mkl_linear(x, packed_w, w, bias, batch) vs mkldnn._linear_pointwise(x, w, bias, ...)
    bias_index = 3 if "_mkl_linear" in request.params.get("fx", {}).get("target", "") else 2
    has_bias = _fx_arg(request, bias_index) is not None
    return _frozen_linear(request, request.inputs[-1], has_bias, None, device, gen)


# linear_unary's fused op, by its ATen attr: the module after the Linear that Inductor fuses,
# made from the ATen choice's ``algorithm`` (GELU's approximation).
_UNARY: dict[str, Callable[[str], torch.nn.Module] | None] = {
    "none": None,
    "relu": lambda algorithm: torch.nn.ReLU(),
    "gelu": lambda algorithm: torch.nn.GELU(approximate="tanh" if algorithm == "tanh" else "none"),
    "swish": lambda algorithm: torch.nn.SiLU(),  # a Llama MLP's gate
    "hardswish": lambda algorithm: torch.nn.Hardswish(),
    "hardsigmoid": lambda algorithm: torch.nn.Hardsigmoid(),
    "sigmoid": lambda algorithm: torch.nn.Sigmoid(),
    "tanh": lambda algorithm: torch.nn.Tanh(),
}


def _linear_pointwise(request: TuningRequest, device: str, gen: torch.Generator) -> OneOpGraph:
    """CPU mkldnn linear with a fused unary op (freezing with a dynamic batch): a frozen
    nn.Linear of the recorded shape, followed by that op. The op is the ATen choice's
    ``attr`` (the FX node can still say "none" when a fusion pass added the op)."""
    aten = request.params.get("aten", {})
    attr = str(aten.get("attr", "none"))
    if attr not in _UNARY:
        raise UnsupportedRequest(f"linear_unary with attr {attr!r} has no one-op reproduction")
    make_unary, algorithm = _UNARY[attr], str(aten.get("algorithm") or "none")
    unary = None if make_unary is None else (lambda: make_unary(algorithm))
    return _frozen_linear(request, request.inputs[1], len(request.inputs) > 2, unary, device, gen)


BUILDERS: dict[str, Callable[[TuningRequest, str, torch.Generator], OneOpGraph]] = {
    "mm": _matmul,
    "bmm": _matmul,
    "addmm": _matmul,
    "baddbmm": _matmul,
    "convolution": _convolution,
    "packed_linear": _packed_linear,
    "linear_unary": _linear_pointwise,
    "linear_binary": _linear_binary,
}


def graph_config(request: TuningRequest) -> dict[str, Any]:
    """Inductor config that makes the one-op graph take the recorded graph-wide decisions.

    Only convolutions read layout_opt: forcing it either way reproduces the model's
    choice of channels-last, which the one-op graph would otherwise make by itself.
    Requests recorded before this was captured get Inductor's own decision.
    """
    layout_opt = request.params.get("graph", {}).get("layout_opt")
    if request.op != "convolution" or layout_opt is None:
        return {}
    if layout_opt:
        return {"layout_optimization": True, "force_layout_optimization": True}
    return {"layout_optimization": False}


def _sharing_buffers(graph: OneOpGraph, request: TuningRequest, device: str,
                     gen: torch.Generator) -> tuple[OneOpGraph, TuningRequest]:
    """``graph`` with the inputs the model read from one buffer made views of one buffer, and
    the request as its inputs see it (for the symbolic carriers)."""
    if request.op not in ALIASED_OPS:  # a row from elsewhere: capture records no other op's aliasing
        raise UnsupportedRequest(f"{request.op} with inputs that share a buffer has no one-op reproduction")
    try:
        shared = share_buffers(graph.fn, graph.inputs, request, lambda layout: make_input(layout, device, gen),
                               lambda layouts: _storage(layouts, device, gen))
    except AliasingUnsupported as exc:
        raise UnsupportedRequest(f"{request.op} has no one-op reproduction: {exc}") from exc
    return OneOpGraph(shared.fn, shared.inputs, shared.reference), shared.carried_request or request


def one_op_graph(request: TuningRequest, device: str, seed: int = 0) -> OneOpGraph:
    builder = BUILDERS.get(request.op)
    if builder is None:
        raise UnsupportedRequest(f"op {request.op} has no one-op reproduction")
    generator = torch.Generator().manual_seed(seed)
    graph = builder(request, device, generator)
    if request.aliases:  # from here on, the request as the shared inputs see it
        graph, request = _sharing_buffers(graph, request, device, generator)
    if not any(layout.symbolic for layout in request.inputs):
        return _holding_constants(graph, request)
    # The carriers hold the builder's tensors' values, so its reference still applies.
    carried = carry(graph.fn, graph.inputs, request)
    if carried is not None:
        return OneOpGraph(carried.module, carried.inputs, graph.reference,
                          dynamic=True if carried.duck else None, symbol_ids=carried.symbol_ids)
    sized = carry_expressions(graph.fn, graph.inputs, request)  # a size that is no product of symbols
    if sized is not None:
        return OneOpGraph(sized.module, sized.inputs, graph.reference, symbol_ids=sized.symbol_ids)
    _mark_symbolic(graph.inputs, request)  # no expressions recorded, or none that can be rebuilt
    return graph


class _WithConstants(torch.nn.Module):
    """``fn`` over the request's inputs, those recorded as graph constants held as frozen
    parameters: compiled with freezing, they are constants again, as in the model."""

    def __init__(self, fn: Callable[..., torch.Tensor], tensors: tuple[torch.Tensor, ...],
                 constant: tuple[bool, ...]) -> None:
        super().__init__()
        self.fn, self.constant = fn, constant
        self.held = torch.nn.ParameterList(
            torch.nn.Parameter(t, requires_grad=False) for t, held in zip(tensors, constant) if held)

    def forward(self, *free: torch.Tensor) -> torch.Tensor:
        held, given = iter(self.held), iter(free)
        return self.fn(*(next(held) if constant else next(given) for constant in self.constant))


def _holding_constants(graph: OneOpGraph, request: TuningRequest) -> OneOpGraph:
    """The graph with the request's constant inputs (``InputLayout.constant``) made constants
    of the module; unchanged where there are none."""
    constant = tuple(layout.constant for layout in request.inputs)
    if not any(constant) or len(constant) != len(graph.inputs):
        return graph
    module = _WithConstants(graph.fn, graph.inputs, constant).eval()
    free = tuple(t for t, held in zip(graph.inputs, constant) if not held)
    return OneOpGraph(module, free, graph.reference, dynamic=graph.dynamic, symbol_ids=graph.symbol_ids)


def _mark_symbolic(inputs: tuple[torch.Tensor, ...], request: TuningRequest) -> None:
    """Make the dimensions that were symbolic in the model symbolic here too (each
    builder's inputs come in the order of the request's, as far as they go)."""
    for tensor, layout in zip(inputs, request.inputs):
        for dim in layout.symbolic:
            torch._dynamo.mark_dynamic(tensor, dim)


def tolerance(dtype: torch.dtype, precision: str) -> float:
    """Max error relative to the reference's largest magnitude that still counts as right."""
    if dtype == torch.bfloat16:
        return 3e-2
    if dtype == torch.float16:
        return 1e-2
    if precision in ("high", "medium"):  # TF32 / bf16 internal math
        return 1e-2
    return 1e-3
