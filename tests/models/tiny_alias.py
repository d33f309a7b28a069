"""A tiny model whose batched matmuls read one buffer twice: a tensor with its own transpose
(a recommender's pairwise feature interaction, ``bmm(t, t.transpose(1, 2))``) and an input
with itself (``bmm(x, x)``). On CPU a bmm gets a C++ template candidate without freezing."""

from __future__ import annotations

import torch


class Interactions(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.relu(x)  # an intermediate buffer, as a model's embeddings are
        pairwise = torch.bmm(t, t.transpose(1, 2))
        return pairwise + torch.bmm(x, x)  # the input, twice


def example(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Interactions().eval(), (torch.randn(batch_size or 4, 8, 8),)
