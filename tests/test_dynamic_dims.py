"""Dynamic dimensions named by the model file (DYNAMIC_DIMS), end to end on CPU.

tests/models/tiny_block.py names batch and sequence of its (batch, seq, dim) input, so
its GEMMs ask with M = s27*s77, which the workers reproduce as that product of those
symbols. Its own sweep, not the session's signed one: no xdist group, so it runs beside
the modules that share that sweep.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cache import Store
from conftest import REPO
from test_hook import job

BLOCK = str(Path(__file__).parent / "models" / "tiny_block.py")


@pytest.fixture(scope="module")
def swept_block(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`autotune sweep tiny_block.py --dynamic`: batch and sequence symbolic (hints 2 and 16)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('block') / 'cache.db'}"
    proc = subprocess.run([sys.executable, "-m", "cli", "sweep", BLOCK, "--device", "cpu", "--cache", url,
                           "--dynamic", "--json"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return url


def test_a_named_sequence_dimension_is_tuned_under_the_models_expression(swept_block: str) -> None:
    """M is seq*batch in the model's own symbols, and the worker asked with exactly that
    (no key_mismatch: its candidates' kernel source, which spells M, came out the same)."""
    with Store(swept_block, read_only=True) as store:
        results = [r for _, r in store.list_results()]
    assert [r.status for r in results] == ["ok", "ok"], [(r.status, r.error) for r in results]
    for result in results:
        x = result.request.inputs[0]
        assert (x.sizes[0], x.symbolic, x.exprs) == (32, (0,), ("s27*s77",))
        assert result.request.params["symbols"] == {"s27": 16, "s77": 2}
        assert len(result.candidates) == 2  # MKL and the C++ GEMM template, both timed


def _served(report: dict) -> tuple[int, int, int, int]:  # type: ignore[type-arg]
    return (report["stats"]["hits"], report["stats"]["misses"], report["benchmarks"], report["frames_compiled"])


def test_dynamic_true_with_a_dynamic_sequence_is_served_without_benchmarking(swept_block: str,
                                                                           tmp_path: Path) -> None:
    """dynamic=True at (2, 16), then a sequence of 40 on the same graph: no recompile, no benchmark."""
    report = job(tmp_path, "--cache", swept_block, "--model", "tiny_block", "--dynamic", "--next-seq-len", "40")
    assert _served(report) == (2, 0, 0, 1), report["stats"]
    torch.testing.assert_close(torch.load(report["output"]), torch.load(report["eager_output"]),
                               rtol=1e-4, atol=1e-4)


def test_mark_dynamic_on_the_named_dimensions_is_served_without_benchmarking(swept_block: str,
                                                                            tmp_path: Path) -> None:
    report = job(tmp_path, "--cache", swept_block, "--model", "tiny_block", "--mark-dynamic")
    assert _served(report) == (2, 0, 0, 1), report["stats"]


_SLICED = """
import torch
import torch._inductor.config
torch._inductor.config.freezing = True
DYNAMIC_DIMS = {0: (0, 1)}
def example(batch_size=None):
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 16).eval()
    return (lambda x: linear(x[:, 1:])), (torch.randn(batch_size or 2, 16, 32),)
"""


def test_limit_a_size_that_is_no_product_of_symbols_is_not_reproduced(tmp_path: Path) -> None:
    """Known limit (README, dynamic shapes): a sliced sequence gives M = s77*(s27 - 1); the
    worker reproduces products of symbols and constants only, and reports this one as
    key_mismatch (never served) rather than tuning another kernel under its key."""
    from inductor_glue.capture import capture_file
    from workers.jobs import TuneJob
    from workers.tune import tune_request

    path = tmp_path / "sliced.py"
    path.write_text(_SLICED)
    captured = capture_file(str(path), dynamic=True)
    (request,) = captured.requests
    assert request.inputs[0].exprs == ("s77*(s27 - 1)",)
    result = tune_request(TuneJob(request=request, expected_env=captured.env, mode=captured.mode,
                                  config_overrides=captured.config_overrides, device="cpu"))
    assert result.status == "key_mismatch" and "s77*(s27 - 1)" in (result.error or ""), result.error
