"""Dynamo's package and guards it cannot pickle: the frame is left out and the model compiles.

A class defined inside a function cannot be named in a package (Dynamo pickles a type by its
import path), so its guards do not serialize. With Dynamo's package on, the frame is left out
of the package (torch 2.11-2.13: CompilePackage.bypass_current_entry; torch 2.15:
bypass_current_compile), the refusal is counted once, and the compile goes on as without
packages. Real components: torch.compile on CPU, the artifact tier over a SQLite store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

JOB = """
import json, sys
import torch
from autotune.job import dynamo_package
from autotune.job.artifacts import ArtifactTier
from autotune.cache import Store, signing
from autotune.job.hook_stats import HookStats

store = Store(sys.argv[1])
tier = ArtifactTier(trusted=signing.NO_TRUSTED_KEYS, signer=None, device="cpu", stats=HookStats(),
                    call=lambda fn, _timeout: fn(store), submit=lambda work: work(), timeout=2.0)


def main():
    class Local(torch.nn.Module):  # defined in a function: a package cannot name its type
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.lin(x).relu()

    seam = dynamo_package.install(tier)
    try:
        model, x = Local(), torch.randn(2, 8)
        out = torch.compile(model)(x)
        print(json.dumps({"same": bool(torch.allclose(out, model(x))), "refused": seam.refused,
                          "stats_refused": tier.stats.packages_refused}))
    finally:
        seam.remove()


main()
"""


def test_a_frame_whose_guards_cannot_be_pickled_is_left_out_of_the_package_and_compiles(tmp_path: Path) -> None:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "-c", JOB, f"sqlite:///{tmp_path / 'cache.db'}"], capture_output=True,
                          text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {"same": True, "refused": 1, "stats_refused": 1}, done.stderr[-3000:]
    assert done.stderr.count("autotune: no Dynamo package for this model") == 1, done.stderr[-3000:]
