"""Several requests per GPU (--jobs-per-gpu): their timings take turns, and an ATen win's
fastest template is checked in the compile that timed it.

The GPU tests need a CUDA device; on the CPU-only CI they are skipped with that reason
(the device tool runs them: `python -m pytest tests/test_gpu_lanes.py`). The lanes
themselves run on CPU too: tests/test_sweep.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from autotune.inductor_glue.gpu_lock import gpu_timing_turn

ROOT = Path(__file__).resolve().parent.parent
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="needs a CUDA GPU: the timing lock and template stand-ins only act on GPUs")

_HOLDER = """
import sys, time
from autotune.inductor_glue.gpu_lock import gpu_timing_turn
with gpu_timing_turn("cuda"):
    began = time.time()
    time.sleep(1.0)
    print(began, time.time())
"""


def test_the_lock_is_a_no_op_off_the_gpu() -> None:
    with gpu_timing_turn("cpu"):
        pass  # no CUDA call, no file


@needs_gpu
def test_two_processes_on_one_gpu_time_in_turn() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", _HOLDER], cwd=ROOT, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    spans = sorted(tuple(map(float, p.communicate(timeout=120)[0].split())) for p in procs)
    assert all(p.returncode == 0 for p in procs)
    (_, first_end), (second_start, _) = spans
    assert second_start >= first_end - 0.01  # one held the GPU after the other, never both


@needs_gpu
def test_an_aten_win_has_its_fastest_template_checked_in_the_same_compile(tmp_path: Path) -> None:
    """A bf16 GEMM with a bias (cuBLAS's bias epilogue won it on an H100): whatever wins,
    an ATen winner's fastest Triton config must come back checked, with its error."""
    from autotune.inductor_glue.capture import capture_model
    from autotune.inductor_glue.modelfile import load_model_file
    from autotune.workers.entry import tune_request
    from autotune.workers.jobs import TuneJob

    model_file = tmp_path / "gemm.py"
    model_file.write_text(
        "import torch\n"
        "def example(batch_size=None):\n"
        "    torch.manual_seed(0)\n"
        "    layer = torch.nn.Linear(1024, 3072).to('cuda', torch.bfloat16)\n"
        "    return layer, (torch.randn(batch_size or 4096, 1024, device='cuda', dtype=torch.bfloat16),)\n")
    model = load_model_file(str(model_file))
    captured = capture_model(model, device="cuda")
    started = time.perf_counter()
    result = tune_request(TuneJob(captured.requests[0], captured.env, captured.mode, model.config_overrides, "cuda"))
    seconds = time.perf_counter() - started
    assert result.status == "ok", result.error
    if result.winner is None or result.winner.kind != "aten":
        pytest.skip(f"a Triton template won here ({result.winner and result.winner.name}): nothing stood in")
    checked = result.validation["fastest_template"]
    assert checked["passed"] is True and "max_abs_err" in checked, checked
    assert result.validation["passed"] is True  # ATen's own numbers, from eager mode
    print(f"tuned in {seconds:.1f} s; {checked['name']} checked beside the ATen winner")


@needs_gpu
def test_the_turn_is_reentrant_within_a_process_and_released_after() -> None:
    # A tuning child holds the turn around a request's candidates, and its kernel-bound timing
    # asks for it again per call (inductor_glue/timing.py): nesting must not wait on itself.
    with gpu_timing_turn("cuda"), gpu_timing_turn("cuda"):
        pass
    holder = subprocess.run([sys.executable, "-c", _HOLDER], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert holder.returncode == 0, holder.stderr  # released: another process took it
