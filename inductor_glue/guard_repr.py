"""Dynamo's identity guards without printing the tensors they guard (torch 2.10 to 2.12).

Torch 2.10, 2.11 and 2.12 annotate every identity guard (ID_MATCH) with ``repr()`` of the
guarded value, for the message of a guard that fails. A compiled optimizer step guards each
parameter and each of its state tensors by identity (their addresses are static, for CUDA
graphs), so its first call formats every one of them, values and all: a copy to the host and one
``.item()`` per printed element, for each tensor, in the first call of every process, cached or
not (pytorch/pytorch#176129). Torch 2.9 annotates nothing, and 2.13 names the value's type
instead (pytorch/pytorch#184796). While a warm start is installed on a torch that prints, a
tensor printed for such a guard is written as its type, shape, dtype and device; every other
``repr()`` of a tensor is torch's own.

The two patches are declared as seams gated on those releases (``seams.ID_MATCH_GUARD``,
``seams.TENSOR_REPR``, ``needed_on``): on any other torch neither is touched, and nothing of
Dynamo is imported to find out. Within them, the guard's code confirms it (a build that prints no
value is left alone too).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from . import seams
from .patching import StackedPatch

_building = threading.local()  # .depth: identity guards being built on this thread


def _prints_values(id_match: Callable[..., Any]) -> bool:
    """Whether this torch's identity guard calls ``repr()`` on the value it guards."""
    code = getattr(id_match, "__code__", None)
    return code is not None and "repr" in code.co_names


@functools.cache
def _needed() -> bool:
    """Whether this torch prints the values an identity guard guards: one of the releases the
    seams are gated on, whose guard's code calls ``repr()`` (a torch without the guard builder's
    method is left alone too)."""
    if not (seams.ID_MATCH_GUARD.needed() and seams.TENSOR_REPR.needed()):
        return False
    try:
        return _prints_values(seams.ID_MATCH_GUARD.resolve())
    except Exception:  # noqa: BLE001 - seams.SeamMissing, or Dynamo failing to import
        return False


def _guard_unprinted(original: Callable[..., Any], patch: StackedPatch[object]) -> Callable[..., Any]:
    @functools.wraps(original)
    def id_match_unchecked(*args: Any, **kwargs: Any) -> Any:
        if patch.top is None:
            return original(*args, **kwargs)
        _building.depth = getattr(_building, "depth", 0) + 1
        try:
            return original(*args, **kwargs)
        finally:
            _building.depth -= 1

    return id_match_unchecked


def _summary_for_guards(original: Callable[..., Any], patch: StackedPatch[object]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __repr__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_building, "depth", 0) and patch.top is not None:
            return summary(self)
        return original(self, *args, **kwargs)

    return __repr__


def summary(tensor: Any) -> str:
    """A tensor named without its values: nothing is read from its device."""
    try:
        return f"{type(tensor).__name__}(shape={tuple(tensor.shape)}, dtype={tensor.dtype}, device={tensor.device})"
    except Exception:  # noqa: BLE001 - a tensor mid-construction still gets a name
        return f"<{type(tensor).__name__}>"


_GUARD: StackedPatch[object] = StackedPatch(seams.ID_MATCH_GUARD, _guard_unprinted)
_REPR: StackedPatch[object] = StackedPatch(seams.TENSOR_REPR, _summary_for_guards)


def push(owner: object) -> None:
    """From now on, identity guards name the tensors they guard without printing them (where
    this torch prints them)."""
    if _needed():
        _REPR.push(owner)
        _GUARD.push(owner)


def pop(owner: object) -> None:
    if _needed():
        _GUARD.pop(owner)
        _REPR.pop(owner)
