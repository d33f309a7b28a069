"""tests/tools/cached_cxx.py: the suite's C++ compile cache gives each identical compile the
file g++ made for it, and leaves alone what it cannot key."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).parent / "tools" / "cached_cxx.py"
REAL = shutil.which("g++")
pytestmark = pytest.mark.skipif(REAL is None, reason="needs g++ (the compiler Inductor uses on CPU)")


def _compile(cache: Path, source: Path, output: Path) -> None:
    done = subprocess.run([sys.executable, "-S", str(TOOL), str(cache), str(REAL), str(source), "-shared", "-fPIC",
                           "-O1", "-o", str(output)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_an_identical_compile_gets_g_plus_plus_s_own_file(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for job in ("a", "b"):  # two fresh Inductor dirs with the same kernel
        (tmp_path / job).mkdir()
        (tmp_path / job / "k.cpp").write_text('extern "C" int k(int x) { return 2 * x; }\n')
        _compile(cache, tmp_path / job / "k.cpp", tmp_path / job / "k.so")
    assert len(list(cache.rglob("*.so"))) == 1
    assert (tmp_path / "a" / "k.so").read_bytes() == (tmp_path / "b" / "k.so").read_bytes()
    (tmp_path / "b" / "k.cpp").write_text('extern "C" int k(int x) { return 3 * x; }\n')  # another source
    _compile(cache, tmp_path / "b" / "k.cpp", tmp_path / "b" / "k.so")
    assert len(list(cache.rglob("*.so"))) == 2


def test_a_source_with_a_relative_include_is_compiled_every_time(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (tmp_path / "two.h").write_text("#define TWO 2\n")
    (tmp_path / "k.cpp").write_text('#include "two.h"\nextern "C" int k(int x) { return TWO * x; }\n')
    _compile(cache, tmp_path / "k.cpp", tmp_path / "k.so")
    assert (tmp_path / "k.so").exists() and not cache.exists()
