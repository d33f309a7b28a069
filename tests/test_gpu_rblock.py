"""A reduction served from the cache is not tuned again on a GPU, also when it is register-heavy.

Torch 2.11 adds halved-RBLOCK candidates to a register-heavy looped reduction after every
compile, its config read from the cache or not (``_dynamic_scale_rblock``); with two
launchers the kernel is benchmarked and descended again at its first run. On an H100 one
layer-norm kernel of Whisper's encoder was tuned again by every warm start (conformance runs
93 and 111) and by the sweep's own second compile. The hook now skips the scaling for a
served config (``autotune/job/kernel_configs.py``, ``_SCALE``).

Skipped on the CPU-only CI with that reason: only GPUs tune reduction kernels at their first
run (the device tool runs it: ``python -m pytest tests/test_gpu_rblock.py``). The CPU test of
the patch: tests/test_pinning_and_configs.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

# Layer norms over many rows: looped reductions (4096 columns; 512 behind a transpose, as in
# Whisper's stem) with more rows than the GPU holds blocks for at once, which is when
# Inductor scales RBLOCK down.
NORMS = """
import torch


class Norms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(512, 512)
        self.narrow = torch.nn.LayerNorm(512)
        self.wide = torch.nn.LayerNorm(4096)

    def forward(self, x, y):
        h = torch.nn.functional.gelu(self.proj(x.transpose(1, 2)))
        return self.narrow(h), self.wide(torch.nn.functional.gelu(y) * 2 + 1)


def example(batch_size=None):
    torch.manual_seed(0)
    b = batch_size or 4
    net = Norms().eval().to("cuda", torch.bfloat16)
    return net, (torch.randn(b, 512, 1500, device="cuda", dtype=torch.bfloat16),
                 torch.randn(b * 4096, 4096, device="cuda", dtype=torch.bfloat16))
"""


def _counting_scales(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Inductor's own scaling, unchanged, recording each kernel it gave more candidates to
    (beneath the hook's patch, which decides whether it runs)."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    original = CachingAutotuner.__dict__["_dynamic_scale_rblock"]
    scaled: list[str] = []

    def counting(self: Any) -> Any:
        before = len(self.compile_results)
        outcome = original(self)
        if len(self.compile_results) > before:
            scaled.append(str(getattr(self, "filename", "?")))
        return outcome

    monkeypatch.setattr(CachingAutotuner, "_dynamic_scale_rblock", counting)
    return scaled


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: only GPUs tune reduction kernels at their first run")
def test_a_served_register_heavy_reduction_is_not_tuned_again(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.inductor_glue.capture import fresh_inductor
    from autotune.inductor_glue.modelfile import load_model_file
    from autotune.job.hook import warm_start
    from autotune.settings import Settings
    from autotune.sweep.end_to_end import tune_pointwise

    scaled = _counting_scales(monkeypatch)
    (tmp_path / "norms.py").write_text(NORMS)
    model = load_model_file(str(tmp_path / "norms.py"))
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    report = tune_pointwise(model, Settings.from_env(cache=url), batch_sizes=(4,), mode="max-autotune-no-cudagraphs",
                            inductor_config={}, train=False, device="cuda")
    assert report.error is None and report.saved > 0, report
    assert scaled, "no kernel of this model was given halved-RBLOCK candidates: the test tests nothing here"

    scaled.clear()
    net, inputs = model.factory(4)
    with fresh_inductor({}), warm_start(url) as hook, torch.no_grad():
        torch.compile(net, mode="max-autotune-no-cudagraphs")(*inputs)
        torch.cuda.synchronize()
        hook.flush()
        stats = hook.stats
    assert stats.kernel_configs_loaded > 0
    assert (stats.kernel_configs_saved, scaled) == (0, []), (stats.kernel_configs_saved, scaled)
