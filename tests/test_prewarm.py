"""With the install on a thread (the opt-in, AUTOTUNE_BACKGROUND_INSTALL=1), the hook prewarms
Triton's backend hash (inductor_glue/env.py), which a cached graph asks for before it runs, and
holds the first kernel until it is ready; the default start-up leaves it to the first compile.

The GPU tests need a CUDA device with Triton; on the CPU-only CI they are skipped with
that reason (the device tool runs them: `python -m pytest tests/test_prewarm.py`).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._triton import has_triton, triton_hash_with_backend

import autotune
from autotune.inductor_glue.env import prewarm_triton_backend
from autotune.job import kernel_configs

needs_triton_gpu = pytest.mark.skipif(not (torch.cuda.is_available() and has_triton()),
                                      reason="needs a CUDA GPU with Triton: only GPU jobs build Triton's backend")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_without_a_gpu_the_hook_holds_no_kernel(tmp_path) -> None:
    with autotune.warm_start(f"sqlite:///{tmp_path / 'c.db'}"):
        assert kernel_configs._COMPILES.top is None


@pytest.mark.background_install
def test_the_prewarm_thread_never_raises_and_ends() -> None:
    thread = prewarm_triton_backend()
    assert thread is not None and thread.daemon
    thread.join(timeout=120)
    assert not thread.is_alive()


@needs_triton_gpu
@pytest.mark.background_install
def test_the_prewarm_fills_torchs_cached_backend_hash() -> None:
    triton_hash_with_backend.cache_clear()
    thread = prewarm_triton_backend()
    assert thread is not None
    thread.join(timeout=120)
    assert triton_hash_with_backend.cache_info().currsize == 1
    prewarmed = triton_hash_with_backend()
    triton_hash_with_backend.cache_clear()
    assert triton_hash_with_backend() == prewarmed


@needs_triton_gpu
@pytest.mark.background_install
def test_with_the_install_on_a_thread_the_first_kernel_waits_for_the_prewarm(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AUTOTUNE_BACKGROUND_INSTALL", "1")
    triton_hash_with_backend.cache_clear()
    with autotune.warm_start(f"sqlite:///{tmp_path / 'c.db'}") as handle:
        handle.resolved()  # installed: the kernels' hold is in place
        ready = kernel_configs._COMPILES.top
        assert ready is not None
        ready()
        assert triton_hash_with_backend.cache_info().currsize == 1
