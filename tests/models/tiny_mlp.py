"""A tiny model for tests: two distinct Linear requests, each with a C++ GEMM candidate."""

from __future__ import annotations

import torch
import torch._inductor.config

torch._inductor.config.freezing = True


def example(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)).eval()
    return model, (torch.randn(batch_size or 8, 32),)


def repeated(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Three Linear(32, 32) layers: one unique request after dedupe."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(32, 32) for _ in range(3)]
    model = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2]).eval()
    return model, (torch.randn(batch_size or 8, 32),)
