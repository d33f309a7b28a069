"""Dynamic shapes, end to end on CPU: the sweep captures and tunes the graphs a job
compiles with a dynamic batch, under keys that tell them from the static ones, and
the job is served with no benchmark in every mode.

Starts from a copy of the session's sweep of the tiny model (static, batch 8) and adds
`autotune sweep --dynamic --batch-sizes 16`: a batch dimension that is symbolic, with
size hint 16. That one graph is what a job gets both with ``dynamic=True`` at batch 16
and with automatic dynamic shapes after a first call at batch 8 (Dynamo marks the
changed dimension dynamic and recompiles; the feature size is specialized by the
weights either way).

Dimensions named by the model file (DYNAMIC_DIMS): tests/test_dynamic_dims.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TINY, copy_sqlite
from test_hook import job

from autotune.cache import Store

# One pytest-xdist worker runs every module that copies the session's signed sweep
# (tests/conftest.py), so that sweep runs once, not once per worker.
pytestmark = pytest.mark.xdist_group("signed_dynamic")  # its own sweep copy; the signed sweep is one per run (conftest)


@pytest.fixture(scope="module")
def swept_dynamic(_signed_tiny_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    url = copy_sqlite(_signed_tiny_cache, tmp_path_factory.mktemp("dynamic") / "cache.db")
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", "sweep", TINY, "--device", "cpu", "--cache", url,
                           "--dynamic", "--batch-sizes", "16", "--json"], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return url


def test_the_dynamic_sweep_stores_requests_apart_from_the_static_ones(swept_dynamic: str) -> None:
    with Store(swept_dynamic, read_only=True) as store:
        results = [r for _, r in store.list_results()]
    symbolic = [r for r in results if any(i.symbolic for i in r.request.inputs)]
    assert len(results) == 4 and len(symbolic) == 2, [(r.request.op, r.request.inputs) for r in results]
    for result in symbolic:
        assert result.status == "ok" and result.request.inputs[0].symbolic == (0,)
        assert result.request.inputs[0].sizes[0] == 16  # the size hint


def test_dynamic_true_is_served_without_benchmarking(swept_dynamic: str, tmp_path: Path) -> None:
    report = job(tmp_path, "--cache", swept_dynamic, "--dynamic", "--batch-size", "16")
    assert (report["stats"]["hits"], report["stats"]["misses"], report["benchmarks"]) == (2, 0, 0), report["stats"]


@pytest.mark.slow
def test_a_changed_batch_size_recompiles_and_is_served_without_benchmarking(swept_dynamic: str,
                                                                              tmp_path: Path) -> None:
    """Batch 8 (the static graph), then batch 16: the dynamic recompile hits too."""
    report = job(tmp_path, "--cache", swept_dynamic, "--batch-size", "8", "--next-batch-size", "16")
    assert (report["stats"]["hits"], report["stats"]["misses"], report["benchmarks"]) == (4, 0, 0), report["stats"]
