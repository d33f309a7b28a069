"""A sweep with every GEMM cached still runs an end-to-end pass that never finished.

On four H100s (conformance runs 114-115) a sweep cut after its GEMMs were stored was run
again: it found every GEMM cached, tuned nothing and skipped the pass, so MLP-Mixer's
``dynamic=True`` kernels were never tuned and every job tuned them (22 kernels, 288
benchmarker calls). A finished pass now leaves a mark (``autotune/sweep/pass_marks.py``) and a
sweep runs the passes without one. Here the first sweep stores its GEMMs with the pass off
(``AUTOTUNE_KERNEL_CONFIGS=0``: as if it had been cut), the second finds them cached and
runs the pass, the third has nothing left to do.

Skipped on the CPU-only CI with that reason: only GPUs tune pointwise kernels in the pass
(the device tool runs it: ``python -m pytest tests/test_gpu_pass_marks.py``). The CPU tests
of the marks: tests/test_pass_marks.py, and tests/test_hook.py (the pass process leaves one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import harness

ROOT = Path(__file__).resolve().parent.parent

MODEL = """
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(256, 1024)
        self.norm = torch.nn.LayerNorm(1024)

    def forward(self, x):
        return self.norm(torch.nn.functional.gelu(self.up(x)))


def example(batch_size=None):
    torch.manual_seed(0)
    net = Net().eval().to("cuda", torch.bfloat16)
    return net, (torch.randn(batch_size or 256, 256, device="cuda", dtype=torch.bfloat16),)
"""


def _sweep(model: Path, url: str, **env: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "autotune.cli", "sweep", str(model), "--cache", url, "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    report = harness.sweep_report(done.stdout)  # the report, as the benchmarks read it
    assert report is not None, done.stdout[-2000:]
    return report


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: only GPUs tune pointwise kernels in the sweep's pass")
def test_a_sweep_with_every_gemm_cached_runs_the_pass_that_never_finished(tmp_path: Path) -> None:
    model = tmp_path / "net.py"
    model.write_text(MODEL)
    url = f"sqlite:///{tmp_path / 'cache.db'}"

    cut = _sweep(model, url, AUTOTUNE_KERNEL_CONFIGS="0")  # its GEMMs stored, no pass run
    assert cut["totals"]["tuned"] >= 1 and cut["pointwise"] is None

    resumed = _sweep(model, url)
    assert resumed["totals"]["tuned"] == 0 and resumed["totals"]["cached"] == cut["totals"]["found"]
    assert resumed["pointwise"] is not None and resumed["pointwise"]["error"] is None, resumed["pointwise"]
    assert resumed["pointwise"]["saved"] >= 1  # the GELU and the layer norm, tuned at last
    assert "resumed_pass_go" not in resumed["timeline"]  # it never began: it waits for capture, as before

    again = _sweep(model, url)
    assert again["totals"]["tuned"] == 0 and again["pointwise"] is None  # its mark is there now


STOPPING_MODEL = """
import os
import signal
import sys

import torch


@torch._dynamo.disable
def _stop_the_first_pass():
    # Only in the sweep's end-to-end pass (python -m autotune.sweep.end_to_end), and only once: as a
    # deadline's SIGTERM would, between the first graph (run, so its kernels are tuned) and
    # the second.
    flag = os.environ["STOP_FLAG"]
    if sys.argv[0].endswith("end_to_end.py") and not os.path.exists(flag):
        open(flag, "w").close()
        os.kill(os.getpid(), signal.SIGTERM)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.norm = torch.nn.Linear(256, 1024), torch.nn.LayerNorm(1024)
        self.down, self.norm2 = torch.nn.Linear(1024, 256), torch.nn.LayerNorm(256)

    def forward(self, x):
        y = self.norm(torch.nn.functional.gelu(self.up(x)))
        _stop_the_first_pass()
        return self.norm2(torch.tanh(self.down(y)))


def example(batch_size=None):
    torch.manual_seed(0)
    net = Net().eval().to("cuda", torch.bfloat16)
    return net, (torch.randn(batch_size or 256, 256, device="cuda", dtype=torch.bfloat16),)
"""


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: only GPUs tune pointwise kernels in the sweep's pass")
def test_a_pass_stopped_midway_keeps_its_kernel_configs_and_the_next_pass_loads_them(tmp_path: Path) -> None:
    """A sweep cut at its deadline (T5's --dynamic sweep, twice, runs 120-121) stops its pass
    with SIGTERM: the configs tuned so far are stored, and the next sweep's pass loads them.
    That pass starts beside the next sweep's capture (autotune/sweep/resumed_pass.py)."""
    model = tmp_path / "net.py"
    model.write_text(STOPPING_MODEL)
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    flag = str(tmp_path / "stopped-once")

    stopped = _sweep(model, url, STOP_FLAG=flag)
    assert stopped["pointwise"] is not None and (stopped["pointwise"]["error"] or "").startswith("stopped after"), \
        stopped["pointwise"]
    assert stopped["pointwise"]["saved"] >= 1  # the first graph's kernels, stored before it stopped

    resumed = _sweep(model, url, STOP_FLAG=flag)
    assert resumed["totals"]["tuned"] == 0 and resumed["pointwise"]["error"] is None, resumed["pointwise"]
    assert resumed["pointwise"]["loaded"] >= stopped["pointwise"]["saved"]  # not tuned again
    # It had begun (its GEMMs were stored), so it began again before capture ended, beside it.
    assert resumed["timeline"]["resumed_pass_go"] < resumed["timeline"]["capture_done"], resumed["timeline"]
