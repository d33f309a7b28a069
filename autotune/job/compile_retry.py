"""A graph whose compile with the cache's kernels fails is compiled again with ATen for its GEMMs.

A served winner can meet a lowering bug the sweep's one-op graph never met: on a CPU (torch
2.13) the C++ GEMM template that won a DLRM training step's backward bmm in isolation fails in
the job's graph, where an epilogue is fused into it (an ``AssertionError`` in the template's
codegen); cold max-autotune fails the same way whenever it picks that template. A job never
fails because of the cache: when a graph's compile raises after the hook served it a kernel,
the graph is compiled once more with every GEMM lookup answered by ATen, as default mode
compiles it, with one warning. A failure with nothing served is not the cache's, and is raised
as before.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

from autotune.inductor_glue import seams
from autotune.inductor_glue.patching import StackedPatch

log = logging.getLogger(__name__)


class Serving(Protocol):
    """What the retry needs of the hook's policy."""

    served: int  # stored answers given so far

    def aten_only(self) -> contextlib.AbstractContextManager[None]: ...

    def compile_retried(self, error: BaseException) -> None: ...


def _retrying(original: Callable[..., Any], patch: StackedPatch[Serving]) -> Callable[..., Any]:
    def compile_graph(*args: Any, **kwargs: Any) -> Any:
        policy = patch.top
        if policy is None:
            return original(*args, **kwargs)
        before = policy.served
        try:
            return original(*args, **kwargs)
        except Exception as error:
            if policy.served == before or _not_retried(error):
                raise
            policy.compile_retried(error)
            with policy.aten_only():
                return original(*args, **kwargs)

    return compile_graph


def _not_retried(error: BaseException) -> bool:
    """The hook's own refusal (on_miss="error") is what the job asked for."""
    from .hook_stats import CacheMissError

    chain: BaseException | None = error
    while chain is not None:
        if isinstance(chain, CacheMissError):
            return True
        chain = chain.__cause__ or chain.__context__
    return False


_RETRY: StackedPatch[Serving] = StackedPatch(seams.COMPILE_GRAPH, _retrying)


def push(policy: Serving) -> None:
    """From now on, a graph compile that fails after ``policy`` served it is compiled again."""
    _RETRY.push(policy)


def pop(policy: Serving) -> None:
    _RETRY.pop(policy)
