"""A job's output carries no torch warnings that autotune's own settings trigger.

With trusted keys the artifact tier turns on torch's ``caching_precompile`` (Dynamo's package),
and torch then logs a warning for every guard that mode drops and for every graph it leaves out
of the package: 14 lines for examples/mlp_job.py, none of them about the job. A job that traces
under that mode (an empty cache and an empty Inductor cache, so nothing is loaded) must print
none of them, nor any other warning but torch's notes about the host, which a plain
torch.compile job prints too; autotune keeps them in its own log at debug level.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# torch's log format (W1207 09:00:20.57 ...], a rank's prefix before it under torchrun) or
# Python's warnings (UserWarning: ...)
WARNING_LINE = re.compile(r"^(?:\[rank\d+\]:)?W\d{4} |Warning\b")
# What torch says about the host, which a plain torch.compile job on it prints as well: torch's
# CUDA build on a machine with nvcc and no GPU (cpp_extension, imported by a CPU compile).
HOST_NOTES = ("No CUDA runtime is found",)


def warning_lines(stderr: str) -> list[str]:
    """The warnings in a job's stderr, torch's notes about the host left out."""
    return [line for line in stderr.splitlines()
            if WARNING_LINE.search(line) and not any(note in line for note in HOST_NOTES)]


def test_a_job_with_the_artifact_tier_prints_no_torch_warnings(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "autotune.cli", "keys", "new", str(tmp_path / "sweeper")],
                   check=True, capture_output=True, timeout=120)
    env = {**os.environ, "AUTOTUNE_CACHE": f"sqlite:///{tmp_path / 'cache.db'}",
           "AUTOTUNE_TRUSTED_KEYS": str(tmp_path / "sweeper.pub"), "AUTOTUNE_ON_MISS": "aten",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    env.pop("AUTOTUNE_SIGNING_KEY", None)
    done = subprocess.run([sys.executable, "-m", "autotune.cli", "run", "examples/mlp_job.py"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "autotune: hits=0 misses=3" in done.stdout + done.stderr, (done.stdout, done.stderr[-2000:])
    assert warning_lines(done.stderr) == [], f"the job printed warnings:\n{done.stderr[-3000:]}"
