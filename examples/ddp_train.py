"""A training job under torchrun: DDP over the model `autotune sweep examples/mixer.py --train --ddp` swept.

    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py

Each rank trains examples/mixer.py for a few steps, compiled with mode="max-autotune", on
gloo over the CPU, or on NCCL with one GPU per rank where torch sees GPUs. The warm-start
hook goes in first, on every rank: local rank 0 reads the cache and serves the node's other
ranks. Each rank prints its stats line at the end.
"""

from __future__ import annotations

import autotune

handle = autotune.warm_start()  # AUTOTUNE_CACHE, else ~/.cache/autotune/cache.db

import os  # noqa: E402  (the hook goes in before anything compiles)
import sys  # noqa: E402

import mixer  # noqa: E402  (examples/mixer.py, under the name the sweep imported it by)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

STEPS = 3


def main() -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)
    rank = dist.get_rank()

    model, (x,) = mixer.example()  # the module and input shape the sweep captured
    ddp = DistributedDataParallel(model.to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    compiled = torch.compile(ddp, mode="max-autotune")
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)  # each rank its own batches
    for step in range(STEPS):
        inputs = torch.randn(x.shape, generator=generator).to(device)
        targets = torch.randn(x.shape, generator=generator).to(device)
        loss = torch.nn.functional.mse_loss(compiled(inputs), targets)
        loss.backward()  # DDP all-reduces the gradients across ranks
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _say(f"rank {rank}: step {step} loss {loss.item():.4f}")

    dist.barrier()  # every rank done before local rank 0, which serves the node's others, leaves
    _say(f"rank {rank}: autotune: {handle.stats}")
    dist.destroy_process_group()


def _say(line: str) -> None:
    """One line in one write: the ranks share torchrun's stdout, and a line written in two
    parts (its text, then its newline) ran into the other rank's."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
