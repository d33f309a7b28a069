"""A tiny model for distributed-job tests: two batched matmuls between activations.

On a CPU, Inductor offers a C++ template against ATen for ``bmm`` of float32 activations,
frozen weights or not, so this model asks for autotuning in a training step and under
DDP or FSDP2, where a CPU Linear (whose template needs a frozen, constant weight) has a
single choice. Two Linear layers of 1 MiB each: with ``bucket_cap_mb=1`` DDP puts each in
its own bucket and Dynamo's DDPOptimizer splits the graph between them (a cap below 1 MiB,
DDP's first bucket, is refused by DDPOptimizer).
"""

from __future__ import annotations

import torch


class Mixer(torch.nn.Module):
    def __init__(self, dim: int = 512) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(dim, dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.proj(x))
        scores = torch.bmm(h, x.transpose(1, 2))  # (batch, seq, seq)
        return self.out(torch.bmm(scores, h))


def example(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Mixer(), (torch.randn(batch_size or 2, 8, 512),)
