"""A tiny model Dynamo can package (torch's caching_precompile): its classes and helpers
live at module level and nothing is frozen (a frozen mkldnn weight cannot be pickled)."""

from __future__ import annotations

import torch


def activation(x: torch.Tensor) -> torch.Tensor:
    # A helper in this module: Dynamo inlines it and records this module's source in the package.
    return torch.nn.functional.gelu(x) * 0.5 + x * 0.5


class TinyNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(activation(self.up(x)))


def example(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return TinyNet().eval(), (torch.randn(batch_size or 8, 32),)
