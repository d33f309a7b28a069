"""on_miss="nearest": a shape the sweep never saw takes the nearest swept shape's kernel.

The rules are pure (autotune/job/nearest.py) and tested on made-up requests; then a real
job compiles the tiny model at a batch size the session's sweep did not cover.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from factories import make_request, make_result
from test_hook import job

from autotune.cache import Store
from autotune.cache.records import CandidateResult, InputLayout
from autotune.job.nearest import MAX_RATIO, NearestIndex, distance, match_choice

# One pytest-xdist worker runs every module that copies the session's signed sweep
# (tests/conftest.py), so that sweep runs once, not once per worker.
pytestmark = pytest.mark.xdist_group("signed_nearest")  # its own sweep copy; the signed sweep is one per run (conftest)


def test_nearer_in_log_terms_wins_and_ties_go_to_the_larger_shape() -> None:
    index = NearestIndex([make_result(m=m) for m in (512, 1024, 2048, 4096)])
    assert index.nearest(make_request(m=1200)).request.inputs[0].sizes[0] == 1024
    assert index.nearest(make_request(m=1448)).request.inputs[0].sizes[0] == 1024  # log2 gaps 0.4997 vs 0.5002
    tie = NearestIndex([make_result(m=512), make_result(m=2048)])
    assert tie.nearest(make_request(m=1024)).request.inputs[0].sizes[0] == 2048  # equally far: the larger


def test_only_sizes_may_differ_and_by_at_most_max_ratio() -> None:
    stored = make_result(m=1024)
    assert distance(make_request(m=1024 * int(MAX_RATIO)), stored.request) is not None
    assert distance(make_request(m=1024 * int(MAX_RATIO) + 1), stored.request) is None
    assert distance(make_request(m=1024, dtype="torch.float16"), stored.request) is None
    assert distance(make_request(m=1024, op="addmm"), stored.request) is None
    a, b = make_request(m=1024).inputs
    transposed = InputLayout(b.sizes, (1, b.sizes[0]), 0, b.dtype, b.device)  # column-major
    other_layout = dataclasses.replace(make_request(m=1024), inputs=(a, transposed))
    assert distance(other_layout, stored.request) is None
    assert NearestIndex([stored]).nearest(stored.request) is None  # never itself: that is a plain hit


def _candidate(kind: str, params: dict[str, object], template: str | None = None) -> CandidateResult:
    return CandidateResult("h", kind, "x", template_id=template, params=params)


def test_the_winners_config_is_matched_among_the_new_shapes_choices() -> None:
    choices = [("aten", _candidate("aten", {"kernel_call_name": "extern_kernels.mm"})),
               ("t32", _candidate("triton", {"BLOCK_M": 32, "BLOCK_N": 64, "num_stages": 3}, "mm")),
               ("t64", _candidate("triton", {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 3}, "mm"))]
    assert match_choice(_candidate("aten", {"kernel_call_name": "extern_kernels.mm"}), choices) == "aten"
    assert match_choice(_candidate("triton", {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 3}, "mm"), choices) == "t64"
    # Nothing tells the two configs apart: no guess.
    assert match_choice(_candidate("triton", {"BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3}, "mm"), choices) is None
    assert match_choice(_candidate("cpp", {}), choices) is None


def test_a_job_at_an_unswept_batch_size_takes_the_nearest_winners_without_benchmarking(
        signed_tiny_sweep: str, tmp_path: Path) -> None:
    """The sweep covered batch 8; the job runs batch 12 under max-autotune."""
    report = job(tmp_path, "--cache", signed_tiny_sweep, "--on-miss", "nearest", "--batch-size", "12")
    stats = report["stats"]
    assert stats["nearest"] == 2 and stats["misses"] == 2 and stats["hits"] == 0, stats
    assert report["benchmarks"] == 0 and stats["written"] == 0
    torch.testing.assert_close(torch.load(report["output"]), torch.load(report["eager_output"]),
                               rtol=1e-4, atol=1e-4)
    with Store(signed_tiny_sweep, read_only=True) as store:
        assert len(store.misses()) == 2  # logged: the next sweep tunes batch 12 itself
