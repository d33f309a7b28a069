"""Coordinate descent on run-time tuned Triton kernels: one patch, asked by every rule.

Two parts of autotune skip Inductor's ``CachingAutotuner.coordinate_descent_tuning``:
capture and the workers, for kernels they leave untuned (inductor_glue/capture.py), and
the hook, for a kernel whose config came from the cache (autotune/job/kernel_configs.py).
They used to wrap the method each on its own, and the two wrappers nested: taken off out
of order, one restored the other's wrapper for good. Now each pushes a rule here; the one
wrapper asks every active rule and descends only when none keeps the launcher as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import seams
from .patching import StackedPatch

# (autotuner, launcher) -> True to run the launcher as it is, without descending. Every
# active rule is asked (one may mark the launcher), innermost first.
KeepLauncher = Callable[[Any, Any], bool]


def _wrap(original: Any, patch: StackedPatch[KeepLauncher]) -> Any:
    def coordinate_descent_tuning(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> Any:
        keep = False
        for rule in reversed(patch.values):
            keep = rule(self, launcher) or keep
        return launcher if keep else original(self, launcher, *args, **kwargs)

    return coordinate_descent_tuning


_DESCENT: StackedPatch[KeepLauncher] = StackedPatch(seams.COORDINATE_DESCENT, _wrap)


def push(rule: KeepLauncher) -> None:
    _DESCENT.push(rule)


def pop(rule: KeepLauncher) -> None:
    _DESCENT.pop(rule)
