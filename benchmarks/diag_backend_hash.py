"""Which environment variables change Triton's backend hash (baked into every template's source)?

Prints torch.utils._triton.triton_hash_with_backend() computed in fresh processes
under several environments, and inside a Ray task with num_gpus=1.
"""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = "import torch.utils._triton as t; print(t.triton_hash_with_backend())"
CASES = {
    "plain": {},
    "CUDA_VISIBLE_DEVICES=0": {"CUDA_VISIBLE_DEVICES": "0"},
    "OMP_NUM_THREADS=1": {"OMP_NUM_THREADS": "1"},
    "both": {"CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "1"},
}


def probe(extra: dict[str, str]) -> str:
    env = {**os.environ, **extra}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    return (out.stdout.strip() or out.stderr.strip().splitlines()[-1])[:24]


def in_ray() -> str:
    import ray

    ray.init(include_dashboard=False)

    @ray.remote(num_gpus=1)
    def task() -> tuple[str, str]:
        import torch.utils._triton as t

        return t.triton_hash_with_backend()[:24], repr({k: v for k, v in os.environ.items() if "CUDA" in k or "TRITON" in k or k == "PATH"})

    return repr(ray.get(task.remote()))


if __name__ == "__main__":
    for name, extra in CASES.items():
        print(f"{name:28s} {probe(extra)}")
    print(f"{'ray task num_gpus=1':28s} {in_ray()}")
    print("driver env:", {k: v for k, v in os.environ.items() if "CUDA" in k or "TRITON" in k or k == "PATH"})
