"""A small token mixer for a training sweep under torchrun:
`autotune sweep examples/mixer.py --train --ddp` (the job: examples/ddp_train.py).

Two Linear layers and two batched matmuls between activations. On a GPU, Inductor tunes
all four (Triton templates against cuBLAS). On a CPU it tunes the batched matmuls, forward
and backward: it offers a C++ template against ATen for ``bmm`` of float32 activations,
where a Linear in training has one choice (its C++ template needs a frozen weight, and
freezing is for inference).
"""

from __future__ import annotations

import torch

DIM = 512


class Mixer(torch.nn.Module):
    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(dim, dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.proj(x))
        scores = torch.bmm(h, x.transpose(1, 2))  # (batch, seq, seq): every token against every other
        return self.out(torch.bmm(scores, h))


def example(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Mixer(), (torch.randn(batch_size or 2, 8, DIM),)
