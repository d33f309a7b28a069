"""Inductor's vector-ISA probes, probed again by a publishing pass (inductor_glue/env.py,
``reprobe_vec_isa``), are built under the same keys as a fresh process builds them: the
artifacts a sweep publishes then serve a job's probes, and the job compiles no C++ for them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The fast subset CI also runs on the oldest supported torch (.ci/run).
pytestmark = [
    pytest.mark.torch_subset,
    pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (the compiler Inductor probes with)"),
]

FRESH = "from torch._inductor.cpu_vec_isa import pick_vec_isa; print(pick_vec_isa())"
# A pass's process: it probed in one cache dir, then compiles in a fresh one (fresh_inductor).
AGAIN = """
import os, sys
from torch._inductor.cpu_vec_isa import pick_vec_isa
from autotune.inductor_glue.env import reprobe_vec_isa
pick_vec_isa()
os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[1]
print(reprobe_vec_isa())
"""


def _run(code: str, cache_dir: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_VEC_ISA_OK"}  # really probe
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def _probes(cache_dir: Path) -> set[str]:
    return {str(path.relative_to(cache_dir)) for path in cache_dir.rglob("*.so")}


def test_probing_again_in_a_fresh_cache_dir_builds_what_a_fresh_process_builds(tmp_path: Path) -> None:
    fresh_isa = _run(FRESH, tmp_path / "fresh")
    again_isa = _run(AGAIN, tmp_path / "first", str(tmp_path / "again"))
    fresh = _probes(tmp_path / "fresh")
    assert fresh, "a fresh process built no probe"
    assert again_isa == fresh_isa
    assert _probes(tmp_path / "again") == fresh
