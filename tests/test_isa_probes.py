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


def _run(code: str, cache_dir: Path, *args: str, probe: bool = True) -> str:
    # probe: drop a set TORCHINDUCTOR_VEC_ISA_OK, so the child really probes; else keep the environment's
    env = {k: v for k, v in os.environ.items() if not (probe and k == "TORCHINDUCTOR_VEC_ISA_OK")}
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


# A compile's thread asking for the CPU's description while the early probes run.
EARLY = """
import sys
from torch._inductor.cpu_vec_isa import valid_vec_isa_list
from autotune.inductor_glue import env
env.import_probe_modules()
before = set(sys.modules)
thread = env.probe_vec_isa_early()
described = env.cpu_description()
thread.join()
print(sorted(set(sys.modules) - before), valid_vec_isa_list.cache_info().misses, described == env.cpu_description())
"""
# A CPU job's warm start with the prefetch on and the install on a thread (the opt-in,
# AUTOTUNE_BACKGROUND_INSTALL=1): the description is worked out without the job asking. The
# default start-up leaves the probes to the first compile (tests/test_default_start.py).
WARM = """
import sys, time
import autotune
from autotune.inductor_glue import env
autotune.warm_start(sys.argv[1])
deadline = time.monotonic() + 120
while env._cpu_description.cache_info().currsize == 0 and time.monotonic() < deadline:
    time.sleep(0.05)
print(env._cpu_description.cache_info().misses)
"""


@pytest.mark.background_install  # the early probes are the opt-in install's
def test_early_probes_import_nothing_more_and_a_caller_meanwhile_waits_for_their_answer(tmp_path: Path) -> None:
    """The thread imports no module (import_probe_modules has them all), and the compile's
    thread asking meanwhile gets the thread's answer: the ISAs are probed once, not twice."""
    assert _run(EARLY, tmp_path / "early") == "[] 1 True"


@pytest.mark.background_install
def test_a_cpu_warm_start_with_the_install_on_a_thread_probes_before_any_compile_asks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_PREFETCH", "1")
    monkeypatch.setenv("AUTOTUNE_BACKGROUND_INSTALL", "1")
    assert _run(WARM, tmp_path / "warm", f"sqlite:///{tmp_path / 'cache.db'}", probe=False) == "1"


# setuptools missing (a bare Python 3.12 venv has none): the probes' build module cannot import.
NO_SETUPTOOLS = """
import sys
from autotune.inductor_glue import env
sys.modules["torch.utils.cpp_extension"] = None  # any import of it now raises ImportError
print(env.probe_vec_isa_early())
"""


@pytest.mark.background_install  # the early probes are the opt-in install's
def test_early_probes_that_cannot_import_their_modules_leave_the_probes_to_the_compile(tmp_path: Path) -> None:
    assert _run(NO_SETUPTOOLS, tmp_path / "bare", probe=False) == "None"
