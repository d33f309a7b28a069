"""Dynamic sizes on a GPU: every request of an MLP-Mixer captured with ``--dynamic`` (batch,
height and width marked) is tuned, none fails; and the sweep's pass tunes the pointwise and
reduction kernels of the dynamic graphs, so that jobs in every dynamic mode tune none.

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
sys.path.insert(0, {str(ROOT / "examples")!r})
import torch
from zoo import MLPMixer  # examples/zoo.py

DYNAMIC_DIMS = {{0: (0, 2, 3)}}  # batch, height, width, as the zoo's dynamic rows mark them


def example(batch_size=None):
    torch.manual_seed(0)
    net = MLPMixer(224, 16, 64, 32, 64, depth=1, classes=0).eval().to("cuda", torch.bfloat16)
    return net, (torch.randn(batch_size or 2, 3, 224, 224, device="cuda", dtype=torch.bfloat16),)
"""


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: the failure was in a Triton template's launch under CUDA graphs")
def test_a_mixer_token_gemm_with_a_floordiv_size_is_tuned(tmp_path: Path) -> None:
    from autotune.inductor_glue.capture import capture_model
    from autotune.inductor_glue.modelfile import load_model_file
    from autotune.workers.entry import tune_request
    from autotune.workers.jobs import TuneJob

    (tmp_path / "mixer.py").write_text(MIXER)
    model = load_model_file(str(tmp_path / "mixer.py"))
    captured = capture_model(model, device="cuda", dynamic=True)
    floordiv = [r for r in captured.requests if any("//" in e for layout in r.inputs for e in layout.exprs)]
    assert floordiv, [r.inputs for r in captured.requests]  # the token GEMM's K is in the capture
    for request in captured.requests:
        result = tune_request(TuneJob(request, captured.env, captured.mode, model.config_overrides, "cuda"))
        assert result.status == "ok", (request.op, [layout.exprs for layout in request.inputs], result.error)


NORMED = """
import torch

DYNAMIC_DIMS = {0: (0, 1)}  # batch and sequence


def example(batch_size=None):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512),
                              torch.nn.Linear(512, 256)).eval().to("cuda", torch.bfloat16)
    return net, (torch.randn(batch_size or 8, 96, 256, device="cuda", dtype=torch.bfloat16),)
"""


def _job(url: str, batch_sizes: tuple[int, ...], dynamic: bool | None) -> tuple[int, int, int]:
    """A job on a fresh node: (GEMM misses, pointwise/reduction kernels it tuned, loaded)."""
    from autotune.inductor_glue.capture import fresh_inductor
    from autotune.job.hook import warm_start

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512),
                              torch.nn.Linear(512, 256)).eval().to("cuda", torch.bfloat16)
    with fresh_inductor({}), warm_start(url) as hook, torch.no_grad():
        compiled = torch.compile(net, mode="max-autotune-no-cudagraphs", dynamic=dynamic)
        for batch in batch_sizes:
            compiled(torch.randn(batch, 96, 256, device="cuda", dtype=torch.bfloat16))
        torch.cuda.synchronize()
        hook.flush()
        stats = hook.stats
    return stats.misses, stats.kernel_configs_saved, stats.kernel_configs_loaded


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: only GPUs tune pointwise/reduction kernels at their first run")
def test_the_pass_tunes_the_dynamic_graphs_kernels_so_jobs_in_every_mode_tune_none(tmp_path: Path) -> None:
    """On an H200 (conformance, 2026-11-26) the pass compiled only static graphs, so a job's
    automatic-dynamic recompile tuned 21 pointwise kernels of the MLP-Mixer and a
    ``dynamic=True`` job 22: their kernels' sources have symbolic sizes, so other keys."""
    from autotune.inductor_glue.modelfile import load_model_file
    from autotune.settings import Settings
    from autotune.sweep.end_to_end import tune_pointwise

    (tmp_path / "normed.py").write_text(NORMED)
    model = load_model_file(str(tmp_path / "normed.py"))
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    settings = Settings.from_env(cache=url)
    for batch_sizes, dynamic in (((8, 16), False), ((8,), True)):  # what a sweep of B,2B then --dynamic B runs
        report = tune_pointwise(model, settings, batch_sizes=batch_sizes, mode="max-autotune-no-cudagraphs",
                                inductor_config={}, train=False, device="cuda", dynamic=dynamic)
        assert report.error is None and report.saved > 0, report
    for batch_sizes, dynamic in (((8,), False), ((8, 16), None), ((8,), True)):  # static, automatic, dynamic=True
        misses, tuned, loaded = _job(url, batch_sizes, dynamic)
        assert (misses, tuned) == (0, 0) and loaded > 0, (batch_sizes, dynamic, misses, tuned, loaded)
