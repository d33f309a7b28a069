"""Dynamic dimensions named by the model file (DYNAMIC_DIMS), end to end on CPU.

tests/models/tiny_block.py names batch and sequence of its (batch, seq, dim) input, so
its GEMMs ask with M = s27*s77, which the workers reproduce as that product of those
symbols. Its own sweep, not the session's signed one: no xdist group, so it runs beside
the modules that share that sweep.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import dynamic_sweep
from test_hook import job

from autotune.cache import Store

pytestmark = pytest.mark.slow

BLOCK = str(Path(__file__).parent / "models" / "tiny_block.py")


@pytest.fixture(scope="module")
def swept_block(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`autotune sweep tiny_block.py --dynamic`: batch and sequence symbolic (hints 2 and 16)."""
    return dynamic_sweep(BLOCK, tmp_path_factory.mktemp("block"))


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
