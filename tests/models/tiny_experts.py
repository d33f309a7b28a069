"""A tiny mixture-of-experts' expert layer: a bmm of activations with a frozen weight, as a
MoE's experts compute ``bmm(hidden, w2)``. Inference on a CPU with freezing on (the zoo's
setting there): the weight is a constant of the graph, and Inductor's C++ bmm template packs
it into blocks as it compiles, so its source differs from the same bmm on an input."""

from __future__ import annotations

import torch

torch._inductor.config.freezing = True  # taken as the model file's config, and restored


class Experts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 24, 16) / 24**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(torch.relu(x), self.w)


def example(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Experts().eval(), (torch.randn(4, batch_size or 10, 24),)
