"""A job that runs the model `autotune sweep examples/mlp.py` tuned: compile, one call, done.

As it stands it is a plain torch.compile job: `autotune run examples/mlp_job.py` runs it
with the warm-start hook, and `examples/mlp_job_warm.py` is the same job with the hook in
its code. It imports the model from the file the sweep read, under the same name (`mlp`),
and calls it as the sweep's capture did (on the GPU if there is one, without gradients),
so its compile asks for exactly the kernels the sweep tuned.
"""

from __future__ import annotations

import time

import mlp  # examples/mlp.py: `python examples/mlp_job.py` puts examples/ on sys.path
import torch


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"  # where `autotune sweep` tunes by default
    model, inputs = mlp.example()
    compiled = torch.compile(model.to(device), mode="max-autotune")
    started = time.perf_counter()
    with torch.no_grad():  # the graph the sweep captured: inference, frozen weights
        output = compiled(*(x.to(device) for x in inputs))
    print(f"first call (compile included): {time.perf_counter() - started:.1f} s, "
          f"output {tuple(output.shape)}")


if __name__ == "__main__":
    main()
