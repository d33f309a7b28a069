"""One graph, one ``inputs_key``, two size expressions: two requests (inductor_glue/inductor.py).

ConvNeXt-T under ``dynamic=True`` (H100s, runs 120-128; the cause found on an H200, run 129)
asks for its first stage's depthwise convolution and ``addmm`` in each block with one
``inputs_key``, but after the first block with other size expressions (Inductor's views
carry a width of ``((s53//4)**2)//(s53//4)``). The selector filed every one under the first,
so the sweep tuned only the first one's kernels, and a job missed the others every time:
their Triton choices, rendered with the other expressions, were choices the sweep never saw.
tests/models/tiny_two_widths.py asks the same way on CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import dynamic_sweep
from test_hook import job

from autotune.cache import Store

pytestmark = [pytest.mark.xdist_group("tiny_two_widths"), pytest.mark.slow]
MODEL = str(Path(__file__).parent / "models" / "tiny_two_widths.py")
PLAIN, DIVIDED = "s77*((s53//4))**2", "s77*((s53//4))*(((((s53//4))**2)//((s53//4))))"


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> str:
    return dynamic_sweep(MODEL, tmp_path_factory.mktemp("two_widths"))


def test_two_expressions_with_one_inputs_key_are_two_requests(swept: str) -> None:
    with Store(swept, read_only=True) as store:
        results = [r for _, r in store.list_results()]
    assert all(r.status == "ok" for r in results), [(r.status, r.error) for r in results]
    by_exprs = {r.request.inputs[0].exprs: r.request for r in results}
    assert {(PLAIN,), (DIVIDED,)} <= set(by_exprs), sorted(by_exprs)
    plain, divided = by_exprs[(PLAIN,)], by_exprs[(DIVIDED,)]
    assert plain.inputs_key == divided.inputs_key and plain.key != divided.key


def test_a_job_is_served_both_without_benchmarking(swept: str, tmp_path: Path) -> None:
    report = job(tmp_path, "--cache", swept, "--model", "tiny_two_widths", "--dynamic")
    stats = report["stats"]
    assert (stats["hits"], stats["misses"], report["benchmarks"]) == (2, 0, 0), stats["missed"]
    torch.testing.assert_close(torch.load(report["output"]), torch.load(report["eager_output"]),
                               rtol=1e-4, atol=1e-4)
