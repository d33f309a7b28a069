"""Fusion and padding verdicts on a GPU: a compile that times its template fusions and its
matmul padding stores each verdict, and the next compile (fresh Inductor caches, as a job on
another node) serves every one of them and times none.

Skipped on the CPU-only CI with that reason: Inductor times template fusions and padding
only on GPUs (the device tool runs it: `python -m pytest tests/test_gpu_verdicts.py`). The
pure parts: tests/test_fusion_verdicts.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune.inductor_glue.capture import fresh_inductor
from autotune.job.hook import warm_start
from autotune.job.hook_stats import HookStats


def _compile_and_run(url: str) -> HookStats:
    torch.manual_seed(0)
    # K = 196 is not aligned: Inductor times the GEMM padded to 200 against it as is (the
    # MLP-Mixer's token mixing, whose verdict flipped between processes on an H100, run 90).
    net = torch.nn.Sequential(torch.nn.Linear(196, 256, bias=False), torch.nn.ReLU(),
                              torch.nn.Linear(256, 512), torch.nn.GELU()).to("cuda", torch.bfloat16)
    x = torch.randn(8192, 196, device="cuda", dtype=torch.bfloat16)
    with fresh_inductor({}), warm_start(url) as hook:
        torch.compile(net, mode="max-autotune-no-cudagraphs")(x)
        torch.cuda.synchronize()
        hook.flush()
        return hook.stats


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: Inductor times template fusions and padding only on GPUs")
def test_a_second_compile_serves_every_verdict_the_first_one_reached(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    first = _compile_and_run(url)  # misses: tuned and written back, fusions and padding timed
    assert first.misses >= 2 and first.fusion_verdicts_saved >= 1 and first.pad_decisions_saved >= 1, first
    second = _compile_and_run(url)
    assert second.misses == 0, second
    assert second.fusion_verdicts_served == first.fusion_verdicts_saved
    assert second.pad_decisions_served == first.pad_decisions_saved
    assert (second.fusion_verdicts_saved, second.pad_decisions_saved) == (0, 0)  # nothing left to time


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: Inductor times matmul padding only on GPUs")
def test_a_remote_capture_returns_its_padding_verdicts_and_pads_as_stored_ones_say(tmp_path: Path) -> None:
    # The Ray task a GPU-less sweep host sends to a GPU node, called here without Ray.
    from autotune.cache.records import Environment, TuningRequest
    from autotune.cache.store import Store
    from autotune.workers.actor import remote_capture

    model = tmp_path / "unaligned.py"
    model.write_text(
        "import torch\n\n"
        "def example(batch_size=None):\n"
        "    net = torch.nn.Sequential(torch.nn.Linear(196, 256, bias=False), torch.nn.ReLU())\n"
        "    return net.to('cuda', torch.bfloat16).eval(), "
        "(torch.randn(batch_size or 8192, 196, device='cuda', dtype=torch.bfloat16),)\n")
    kwargs = {"device": "cuda", "mode": "max-autotune-no-cudagraphs"}
    with Store(f"sqlite:///{tmp_path / 'cache.db'}") as store:
        with fresh_inductor({}):
            first = remote_capture(model.read_text(), model.name, kwargs, store)
        assert first["pad_decisions"] and first["pad_env"] is not None, first
        store.put_kernel_configs(Environment.from_json(first["pad_env"]), first["pad_decisions"])
        with fresh_inductor({}):
            second = remote_capture(model.read_text(), model.name, kwargs, store)
    assert second["pad_decisions"] == {}  # every verdict served from the store, none timed again
    keys = [[TuningRequest.from_json(r).key for r in data["requests"]] for data in (first, second)]
    assert keys[0] == keys[1]
