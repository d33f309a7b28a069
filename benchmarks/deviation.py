"""How far a compiled model's output is from eager's: max |compiled - eager| / max |eager|.

A scenario child (``compile_time _scenario --deviation``) keeps a copy of its first call's
output (a training step's: the loss it returns), and once its timing is done builds the
model again from its model file (the zoo's builders seed themselves, so the weights and
inputs are those of the first call) and runs it eagerly. The parent never imports torch;
this module does, in the child only.

A training step that draws random numbers (dropout, stochastic depth) draws other ones
compiled than eager, so its deviation says little: ``random`` marks it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def tensors(output: Any) -> list[Any]:
    """Every tensor of an output: a tensor, or a tuple, list or dict of them (nested)."""
    import torch

    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in tensors(item)]
    return []


def snapshot(output: Any) -> list[Any]:
    """A copy of the output's tensors: CUDA graphs write the next call's output into the same memory."""
    return [t.detach().clone() for t in tensors(output)]


def draws_random(module: Any) -> bool:
    """Whether a module in training mode draws random numbers: a dropout or stochastic-depth
    module with p > 0, or a ``dropout`` probability kept as a float (Hugging Face's Whisper)."""
    for sub in module.modules():
        name, p = type(sub).__name__, getattr(sub, "p", None)
        if ("Dropout" in name or "StochasticDepth" in name) and isinstance(p, float) and p > 0:
            return True
        rate = getattr(sub, "dropout", None)
        if isinstance(rate, float) and rate > 0:
            return True
    return False


def compare(compiled: list[Any], eager: list[Any]) -> dict[str, Any]:
    """max |compiled - eager| over every element, over max |eager|."""
    if len(compiled) != len(eager) or any(c.shape != e.shape for c, e in zip(compiled, eager)):
        return {"error": f"outputs differ in shape: {[tuple(c.shape) for c in compiled]} compiled, "
                         f"{[tuple(e.shape) for e in eager]} eager"}
    diff = max(((c.float() - e.float().to(c.device)).abs().max().item() for c, e in zip(compiled, eager)
                if c.numel()), default=0.0)
    scale = max((e.float().abs().max().item() for e in eager if e.numel()), default=0.0)
    relative = diff / scale if scale > 0 and math.isfinite(diff) else (0.0 if diff == 0 else None)
    return {"max_abs_diff": _number(diff), "eager_max_abs": _number(scale), "relative": relative}


def _number(value: float) -> float | str:
    return value if math.isfinite(value) else repr(value)  # JSON has no NaN or inf


def against_eager(first: list[Any], rebuild: Callable[[], tuple[Any, tuple[Any, ...]]], train: bool) -> dict[str, Any]:
    """``first`` (``snapshot`` of the first call) against the model built afresh and run eagerly;
    an error is recorded, never raised: the scenario's timings stand without it."""
    import torch

    try:
        module, inputs = rebuild()
        module.train(train)
        with torch.no_grad():
            eager = snapshot(module(*inputs))
        result = compare(first, eager)
        result.update(of="loss" if train else "output", random=train and draws_random(module))
        return result
    except Exception as exc:  # noqa: BLE001 - the measurement is extra; the scenario's figures stand
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
