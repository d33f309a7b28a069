"""The built wheel, installed as a user installs it, beside a torch already there.

.ci/wheel_install prepares a venv (DIR/venv): a torch first, then the wheel `python -m build`
made, with its [sweep] extra. These tests look at that venv from outside, as a user's shell:
its torch is the one it had, its metadata names our distribution and license, and the README's
quickstart runs from it (a sweep of examples/mlp.py into a scratch SQLite cache, `cache ls`,
then the job: every GEMM a hit, nothing benchmarked). AUTOTUNE_TEST_WHEEL_VENV names DIR;
without it (an editable install) there is no such venv, and this module says so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

VENV_DIR = os.environ.get("AUTOTUNE_TEST_WHEEL_VENV")
pytestmark = pytest.mark.skipif(
    not VENV_DIR, reason="runs from .ci/wheel_install's venv (AUTOTUNE_TEST_WHEEL_VENV unset here: an editable "
                         "install has no built wheel to install)")
REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# Read, not imported: this module runs under .ci/wheel_install's tools venv (with --noconftest),
# which has pytest and nothing of ours, while CI reinstalls the main environment beside it.
VERSION = re.search(r'^__version__ = "(.+)"$', (REPO / "autotune" / "__init__.py").read_text(), re.M)[1]  # type: ignore[index]


def _dir() -> Path:
    assert VENV_DIR
    return Path(VENV_DIR)


def _bin(name: str) -> str:
    return str(_dir() / "venv" / "bin" / name)


def _venv_python(code: str) -> str:
    # From the venv's folder: `python -c` puts its working directory first on sys.path, and the
    # checkout's egg-info (the main suite's editable install) would answer for the distribution.
    done = subprocess.run([_bin("python"), "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          cwd=_dir())
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_installing_the_wheel_kept_the_torch_that_was_there() -> None:
    before, after = (_dir() / "torch.before").read_text().strip(), (_dir() / "torch.after").read_text().strip()
    assert before and after == before, f"the wheel's install replaced torch {before} with {after}"
    # The distribution's version as pip records it (a CUDA build's torch.__version__ adds +cu130), and it imports.
    assert _venv_python("import importlib.metadata as m, torch; print(m.version('torch'))") == before


def test_the_wheels_metadata_names_the_distribution_its_license_and_version() -> None:
    found = json.loads(_venv_python(
        "import importlib.metadata as m, json; d = m.distribution('inductor-autotune'); "
        "print(json.dumps({'meta': dict(d.metadata.items()), 'files': [str(f) for f in d.files or []]}))"))
    meta = found["meta"]
    assert meta["Name"] == "inductor-autotune" and meta["Version"] == VERSION
    assert meta["License-Expression"] == "BSD-3-Clause", meta
    assert any(f.endswith(".dist-info/licenses/LICENSE") for f in found["files"]), found["files"]
    version = subprocess.run([_bin("autotune"), "--version"], capture_output=True, text=True, timeout=60, check=True)
    assert version.stdout.strip() == f"autotune, version {VERSION}"


def test_the_readme_quickstart_runs_from_the_installed_wheel(tmp_path: Path) -> None:
    """The quickstart's commands, as the README writes them, from a folder outside the checkout
    (nothing of it on sys.path), with the venv's bin first on PATH and scratch caches."""
    blocks = dict(re.findall(r"<!-- readme-test: ([\w-]+)[^>]*-->\n```\w*\n(.*?)```", README.read_text(), re.S))
    commands = [line.strip() for name in ("quickstart-sweep", "quickstart-job")
                for line in blocks[name].splitlines() if line.strip() and not line.strip().startswith("#")]
    assert commands[0].startswith("autotune sweep examples/") and commands[-1].startswith("python examples/")
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AUTOTUNE_", "PYTHON"))}
    env.update(PATH=f"{_dir() / 'venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(_dir() / "venv"),
               AUTOTUNE_CACHE=str(tmp_path / "cache.db"), XDG_CACHE_HOME=str(tmp_path / "xdg"),
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    outputs = []
    for command in commands:
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900, check=False)
        assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{done.stderr[-3000:]}\n{done.stdout[-2000:]}"
        outputs.append(done.stdout + done.stderr)
    assert "3 found, 0 cached, 3 tuned, 0 failed" in outputs[0], outputs[0][-2000:]
    assert len(re.findall(r"^\s*\d+\s+packed_linear ", outputs[1], re.M)) == 3, outputs[1][-2000:]
    stats = re.search(r"autotune: hits=(\d+) misses=(\d+) benchmarks=(\d+)", outputs[-1])
    line = re.search(r"^autotune: hits=.*$", outputs[-1], re.M)
    # For benchmarks/install_matrix.py's results: what the job printed.
    (_dir() / "quickstart.json").write_text(json.dumps({"stats": line[0] if line else None}))
    assert stats and stats.groups() == ("3", "0", "0"), outputs[-1][-2000:]
