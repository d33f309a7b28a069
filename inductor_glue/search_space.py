"""Inductor's exhaustive GEMM/conv search space, as a sweep's worker may afford it.

``max_autotune_gemm_search_space="EXHAUSTIVE"`` makes each Triton GEMM template enumerate
block sizes, stages and warps instead of its short default list, and lets decompose-k try
every K split (``kernel/mm.py``, ``template_heuristics``); with it the register-spilling
configs are pruned, and here the shared-memory check prunes those that cannot launch.

What it does not change, and why this module leaves alone:
- The kernel source of a config: the search space is not in a template's source, so a
  config found in both spaces has one choice hash, and the default list is a subset of the
  exhaustive one for the mm family.
- The templates offered: persistent TMA comes from ``triton.enable_persistent_tma_matmul``,
  a flag of the job's own (it is in the environment's fingerprint). A worker that turned it on
  alone would find winners no job of that environment ever generates, so it is kept as the
  job has it.
- Coordinate descent: Inductor runs it on pointwise and reduction kernels only (max-autotune
  mode turns it on, and the sweep's end-to-end pass stores its configs); it has none for GEMM
  templates, and its flags are in every Triton kernel's source.
- C++ GEMM templates (CPU): they read no search space. On a CPU the exhaustive search
  offers what the default one does.

A request's environment is the job's, whatever the worker searched with:
``environment_as_job`` computes it with the search space as the job has it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

SEARCH_SPACE_KEY = "max_autotune_gemm_search_space"
EXHAUSTIVE = "EXHAUSTIVE"
# Prunes configs whose shared memory use exceeds the device's (torch#156610); absent in
# releases without it, so only set where the installed config has it.
_PRUNE_SHARED_MEMORY = "max_autotune_prune_choices_based_on_shared_mem"


def _has(key: str) -> bool:
    from torch._inductor import config

    return hasattr(config, key)


def exhaustive_config(device: str) -> dict[str, Any]:
    """The Inductor config patch that searches the exhaustive space on ``device``; empty where
    the installed torch has no exhaustive search space."""
    if not _has(SEARCH_SPACE_KEY):
        return {}
    patch: dict[str, Any] = {SEARCH_SPACE_KEY: EXHAUSTIVE}
    if device == "cuda" and _has(_PRUNE_SHARED_MEMORY):
        patch[_PRUNE_SHARED_MEMORY] = True
    return patch


def what_it_adds(device: str) -> str:
    """One line on what the exhaustive search adds on ``device`` (the sweep's log says it)."""
    if not _has(SEARCH_SPACE_KEY):
        return "nothing: this torch has no exhaustive GEMM search space"
    if device != "cuda":
        return "nothing on a CPU: C++ GEMM templates and ATen read no search space"
    return ("every BLOCK_M/N/K, stage and warp count of each Triton GEMM template, and every "
            "decompose-k split, pruned of configs that spill or overflow shared memory")


def job_values(overrides: dict[str, Any]) -> dict[str, Any]:
    """The job's values of the keys the exhaustive patch changes: its overrides, else this
    process's config (call it before the patch is applied)."""
    from torch._inductor import config

    names = (SEARCH_SPACE_KEY, _PRUNE_SHARED_MEMORY)
    return {key: overrides.get(key, getattr(config, key)) for key in names if _has(key)}


@contextlib.contextmanager
def as_the_job_has_it(values: dict[str, Any]) -> Iterator[None]:
    """Inside, Inductor's config holds ``values`` (``job_values``): for computing the job's
    environment while the worker searches with the exhaustive patch."""
    from torch._inductor import config

    with config.patch(values):
        yield
