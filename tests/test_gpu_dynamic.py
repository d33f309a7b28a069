"""Dynamic sizes on a GPU: every request of an MLP-Mixer captured with ``--dynamic`` (batch,
height and width marked) is tuned, none fails.

Its token-mixing GEMM has K = (s0//16)*(s53//16), a size no input carries; under CUDA
graphs, torch 2.11's graph partition left ``s0`` out of the partition that launched the
template, so the worker's compile failed with ``NameError: name 's0' is not defined`` on an
H100 (runs 71 and 75). The worker now compiles without CUDA graphs (workers/tune.py).

Skipped on the CPU-only CI with that reason: the bug is in the Triton template's launch
(the device tool runs it: `python -m pytest tests/test_gpu_dynamic.py`). CPU dynamic
shapes: tests/test_dynamic.py, tests/test_size_exprs.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

MIXER = f"""
import sys
sys.path.insert(0, {str(ROOT / "benchmarks")!r})
import torch
from zoo.models import MLPMixer

DYNAMIC_DIMS = {{0: (0, 2, 3)}}  # batch, height, width, as the zoo's dynamic rows mark them


def example(batch_size=None):
    torch.manual_seed(0)
    net = MLPMixer(224, 16, 64, 32, 64, depth=1, classes=0).eval().to("cuda", torch.bfloat16)
    return net, (torch.randn(batch_size or 2, 3, 224, 224, device="cuda", dtype=torch.bfloat16),)
"""


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: the failure was in a Triton template's launch under CUDA graphs")
def test_a_mixer_token_gemm_with_a_floordiv_size_is_tuned(tmp_path: Path) -> None:
    from inductor_glue.capture import capture_model
    from inductor_glue.modelfile import load_model_file
    from workers.jobs import TuneJob
    from workers.tune import tune_request

    (tmp_path / "mixer.py").write_text(MIXER)
    model = load_model_file(str(tmp_path / "mixer.py"))
    captured = capture_model(model, device="cuda", dynamic=True)
    floordiv = [r for r in captured.requests if any("//" in e for layout in r.inputs for e in layout.exprs)]
    assert floordiv, [r.inputs for r in captured.requests]  # the token GEMM's K is in the capture
    for request in captured.requests:
        result = tune_request(TuneJob(request, captured.env, captured.mode, model.config_overrides, "cuda"))
        assert result.status == "ok", (request.op, [layout.exprs for layout in request.inputs], result.error)
