"""Which process state changes Triton's backend hash (baked into every template's source)?

Prints the parts of torch.utils._triton.triton_hash_with_backend() (triton_key,
backend.hash(), target) in: this process after importing the worker code, a
fresh `python -c` child, a Ray task, and a child started from a Ray task with
the environment the sweep's workers use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROBE = r"""
import hashlib, json, os, sys
import torch
import autotune.workers.tune  # noqa: F401  what a tuning child imports first
from torch._inductor.runtime.triton_compat import triton_key
from torch.utils._triton import triton_backend, triton_hash_with_backend
b = triton_backend()
print("PROBE " + json.dumps({
    "full": triton_hash_with_backend()[:16],
    "triton_key": hashlib.sha256(triton_key().encode()).hexdigest()[:16],
    "backend_hash": b.hash(),
    "target": repr(b.target),
    "cwd": os.getcwd(),
}))
"""


def run_probe(env: dict[str, str] | None = None, cwd: str | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=cwd, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("PROBE "):
            return json.loads(line[6:])
    return {"error": out.stderr[-800:]}


def from_ray() -> dict:
    import ray

    ray.init(include_dashboard=False)

    @ray.remote(num_gpus=1)
    def task() -> dict:
        from autotune.workers.child import clean_environment

        here = run_probe(None)
        clean = run_probe(clean_environment())
        return {"ray_task_child_raw_env": here, "ray_task_child_clean_env": clean,
                "ray_cwd": os.getcwd(), "ray_sys_path": sys.path[:6]}

    return ray.get(task.remote())


if __name__ == "__main__":
    print("fresh child:", run_probe())
    print("fresh child, cwd=/tmp:", run_probe(cwd="/tmp"))
    print("fresh child, CUDA_VISIBLE_DEVICES=0:", run_probe({**os.environ, "CUDA_VISIBLE_DEVICES": "0"}))
    for key, value in from_ray().items():
        print(f"{key}: {value}")
