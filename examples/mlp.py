"""A small MLP for a CPU sweep: `autotune sweep examples/mlp.py`.

Freezing is on so that Inductor offers C++ GEMM templates against MKL for each
Linear layer (without it a CPU Linear has a single choice and nothing to tune).
"""

from __future__ import annotations

import torch
import torch._inductor.config

torch._inductor.config.freezing = True


class MLP(torch.nn.Module):
    def __init__(self, dims: tuple[int, ...] = (256, 512, 512, 128)) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = []
        for fan_in, fan_out in zip(dims, dims[1:]):
            layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.GELU()]
        self.net = torch.nn.Sequential(*layers[:-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def example(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = MLP().eval()
    return model, (torch.randn(batch_size or 64, 256),)
