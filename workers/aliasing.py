"""Inputs that view one buffer, rebuilt as views of one buffer in the one-op graph.

A request records, per input, the first earlier input whose buffer it reads too
(``InputLayout.alias``): ``bmm(t, t.transpose(1, 2))``, ``bmm(x, x)``. Inductor then passes
that buffer to the kernel once, so the kernel's source differs from the one two separate
tensors of the same layouts get. Two graph inputs are two buffers to Inductor, so the
one-op graph takes one tensor per buffer and makes the views inside the compiled function:

- a member that is a permutation of its group's first input (a transpose; the same tensor
  twice) is that input permuted inside the graph, as in the model; its sizes may be symbolic,
  and the graph's inputs then have layouts the symbolic machinery can carry;
- any other member (a slice at another offset) is ``as_strided`` on one flat buffer that
  holds the whole group, for static sizes only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from autotune.cache.records import InputLayout, TuningRequest


class AliasingUnsupported(Exception):
    """The request's aliased inputs cannot be rebuilt as views (the message says why)."""


def alias_roots(request: TuningRequest) -> list[int]:
    """Each input's first input of the same buffer (itself where it has its own)."""
    roots: list[int] = []
    for index, layout in enumerate(request.inputs):
        alias = layout.alias
        roots.append(index if alias is None or not 0 <= alias < index else roots[alias])
    return roots


def _dims(layout: InputLayout) -> list[tuple[int, int, str | None]]:
    exprs = dict(zip(layout.symbolic, layout.exprs))
    return [(size, stride, exprs.get(d)) for d, (size, stride) in enumerate(zip(layout.sizes, layout.strides))]


def permutation(root: InputLayout, member: InputLayout) -> tuple[int, ...] | None:
    """The permutation of ``root``'s dimensions that gives ``member`` (sizes, strides and size
    expressions), or None where ``member`` is no permutation of it."""
    if (member.offset, member.dtype, len(member.sizes)) != (root.offset, root.dtype, len(root.sizes)):
        return None
    mine, wanted = _dims(root), _dims(member)
    order: list[int] = []
    for dim in wanted:
        match = next((d for d, have in enumerate(mine) if have == dim and d not in order), None)
        if match is None:
            return None
        order.append(match)
    return tuple(order)


@dataclass(frozen=True)
class Group:
    """One buffer and the inputs that read it; ``perms`` None: ``as_strided`` on a flat buffer."""

    root: int
    members: tuple[int, ...]
    perms: tuple[tuple[int, ...], ...] | None


def groups(request: TuningRequest) -> list[Group]:
    roots = alias_roots(request)
    out = []
    for root in sorted({r for i, r in enumerate(roots) if r != i}):
        members = tuple(i for i, r in enumerate(roots) if r == root)
        perms = [permutation(request.inputs[root], request.inputs[i]) for i in members]
        out.append(Group(root, members, None if None in perms else tuple(p for p in perms if p is not None)))
    return out


@dataclass
class SharedInputs:
    """The one-op graph's function and inputs with aliased inputs made views of one buffer."""

    fn: Callable[..., torch.Tensor]
    inputs: tuple[torch.Tensor, ...]
    reference: Callable[[], torch.Tensor]
    # The request as the graph's inputs see it (one layout per graph input), for the
    # symbolic carriers; None where a group travels as a flat buffer (static sizes only).
    carried_request: TuningRequest | None


def share_buffers(fn: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...], request: TuningRequest,
                  make_input: Callable[[InputLayout], torch.Tensor],
                  storage: Callable[[tuple[InputLayout, ...]], torch.Tensor]) -> SharedInputs:
    """``fn`` (a builder's function of one tensor per request input, ``inputs``) over one graph
    input per buffer: ``make_input`` builds a group's first input in its layout, ``storage``
    a flat buffer that every given layout fits in."""
    layouts = request.inputs
    if len(inputs) != len(layouts):
        raise AliasingUnsupported(f"{request.op}'s one-op graph does not take one tensor per input")
    found = groups(request)
    symbolic = any(layout.symbolic for layout in layouts)
    if symbolic and any(g.perms is None for g in found):
        raise AliasingUnsupported("inputs that share a buffer at other offsets or strides, with symbolic sizes")
    grouped = {i for g in found for i in g.members}
    own = [i for i in range(len(layouts)) if i not in grouped]
    bases = tuple(make_input(layouts[g.root]) if g.perms is not None
                  else storage(tuple(layouts[i] for i in g.members)) for g in found)

    def views(args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        out: dict[int, torch.Tensor] = dict(zip(own, args[:len(own)]))
        for group, base in zip(found, args[len(own):]):
            for n, index in enumerate(group.members):
                if group.perms is None:
                    layout = layouts[index]
                    out[index] = torch.as_strided(base, layout.sizes, layout.strides, layout.offset)
                else:
                    perm = group.perms[n]
                    out[index] = base if perm == tuple(range(len(perm))) else base.permute(perm)
        return [out[i] for i in range(len(layouts))]

    graph_inputs = tuple(inputs[i] for i in own) + bases

    def shares(*args: torch.Tensor) -> torch.Tensor:
        return fn(*views(args))

    def reference() -> torch.Tensor:
        return fn(*views(tuple(t.float() for t in graph_inputs)))

    carried = None
    if all(g.perms is not None for g in found):
        carried = replace(request, inputs=tuple(layouts[i] for i in own) + tuple(layouts[g.root] for g in found))
    return SharedInputs(shares, graph_inputs, reference, carried)
