"""Serving a shape the sweep never saw from the nearest one it did (``on_miss="nearest"``).

Two requests are neighbours when only their sizes differ: the same op and matmul
precision, and input by input the same device, dtype, number of dimensions, stride
order (the layout: row- or column-major, channels-last), whether the view starts at
offset 0 and which earlier input's buffer it views, if any. Their distance is the sum
over every dimension of |log2(size / size')|, so a batch of 12 is nearer to 8 than to
32. A stored result is served only if no dimension is more than ``MAX_RATIO`` times
larger or smaller: beyond that a tiling chosen for one shape says little about the other. Ties go to the larger shape
(its tiles fit the smaller problem at worst with idle lanes; the other way round
they may run out of shared memory).

Serving means taking the stored winner's kind of kernel: ATen's call, or the
template config whose parameters agree with the winner's on the most keys. The
request still counts as a miss and is logged for the next sweep, which tunes it.

Pure: no torch, no database. The hook feeds it stored results and described choices.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from autotune.cache.records import CandidateResult, InputLayout, TuningRequest, TuningResult

MAX_RATIO = 4.0
# Choice parameters that name one shape or one request rather than a config (the pin
# digests are inductor_glue.pinning's PIN_FAMILY and PIN_KEY; kept literal: this module is pure).
_SHAPE_PARAMS = frozenset({"kwarg.batch_size", "kwarg.B", "pin.family", "pin.key"})

Choice = TypeVar("Choice")


def _stride_order(layout: InputLayout) -> tuple[int, ...]:
    """Dimensions from the innermost (smallest stride) out; size-1 dims sort by index."""
    return tuple(sorted(range(len(layout.sizes)), key=lambda d: (layout.strides[d], -d)))


def signature(request: TuningRequest) -> tuple[Any, ...]:
    """What must be equal for two requests to be neighbours: everything but sizes."""
    inputs = tuple((i.device, i.dtype, len(i.sizes), _stride_order(i), i.offset == 0, i.alias) for i in request.inputs)
    return (request.op, request.precision, inputs)


def distance(a: TuningRequest, b: TuningRequest) -> float | None:
    """Sum of |log2| size ratios over every dimension; None if not neighbours or too far."""
    return _size_gap(a, b) if signature(a) == signature(b) else None


def _size_gap(a: TuningRequest, b: TuningRequest) -> float | None:
    """distance() for two requests already known to share a signature."""
    total = 0.0
    for left, right in zip(a.inputs, b.inputs):
        for x, y in zip(left.sizes, right.sizes):
            if x == y:
                continue
            if x <= 0 or y <= 0 or max(x, y) > MAX_RATIO * min(x, y):
                return None
            total += abs(math.log2(x / y))
    return total


def _volume(request: TuningRequest) -> int:
    return sum(math.prod(i.sizes) for i in request.inputs)


class NearestIndex:
    """Stored results of one environment, grouped by signature."""

    def __init__(self, results: Iterable[TuningResult]) -> None:
        self._groups: dict[tuple[Any, ...], list[TuningResult]] = {}
        for result in results:
            if result.winner is not None:
                self._groups.setdefault(signature(result.request), []).append(result)

    def nearest(self, request: TuningRequest) -> TuningResult | None:
        """The stored result nearest to request (never request itself), or None."""
        best: tuple[float, int] | None = None
        found: TuningResult | None = None
        for stored in self._groups.get(signature(request), ()):
            if stored.request.key == request.key:
                continue
            gap = _size_gap(request, stored.request)  # the group shares request's signature
            if gap is None:
                continue
            rank = (gap, -_volume(stored.request))  # nearer first, then the larger shape
            if best is None or rank < best:
                best, found = rank, stored
        return found


def _config(candidate: CandidateResult) -> dict[str, Any]:
    return {k: v for k, v in candidate.params.items() if k not in _SHAPE_PARAMS}


def match_choice(winner: CandidateResult, described: Sequence[tuple[Choice, CandidateResult]]) -> Choice | None:
    """Among this request's choices, the one of the stored winner's kind and config.

    Same kind and template; then the most parameters in agreement with the winner's.
    None when that leaves a tie or no parameter agrees (with several to pick from):
    guessing would be no better than Inductor's own default.
    """
    same = [(choice, c) for choice, c in described if c.kind == winner.kind and c.template_id == winner.template_id]
    if winner.kind == "aten":
        call = winner.params.get("kernel_call_name")
        same = [(choice, c) for choice, c in same if c.params.get("kernel_call_name") == call]
    if len(same) == 1:
        return same[0][0]
    wanted = _config(winner)
    scored = sorted(((sum(c.params.get(k) == v for k, v in wanted.items()), i) for i, (_, c) in enumerate(same)),
                    reverse=True)
    if not scored or scored[0][0] == 0 or (len(scored) > 1 and scored[1][0] == scored[0][0]):
        return None
    return same[scored[0][1]][0]
