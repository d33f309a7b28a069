"""A tiny patch-embedding model for dynamic image sizes: a 4x4 stride-4 convolution cuts
a square image into patches, then Linear layers run over the tokens.

With height and width dynamic, the GEMMs ask with M = batch * (height//4) * (width//4):
no product of symbols. Under ``dynamic=True`` the square image's height and width share
one symbol (``s77*((s53//4))**2``); marked with ``mark_dynamic`` they get one each
(``s77*((s0//4))*((s53//4))``). `autotune sweep --dynamic` captures both, and the
workers rebuild each expression from the symbols (workers/size_exprs.py).
"""

from __future__ import annotations

import torch
import torch._inductor.config

torch._inductor.config.freezing = True

# Input 0 is an image (batch, 3, height, width): all but the channels vary in a job.
DYNAMIC_DIMS = {0: (0, 2, 3)}


class Patches(torch.nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, dim, 4, stride=4)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.stem(x).flatten(2).transpose(1, 2)  # (batch, patches, dim)
        return self.down(torch.relu(self.up(tokens)))


def example(batch_size: int | None = None, image_size: int = 16) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Patches().eval(), (torch.randn(batch_size or 2, 3, image_size, image_size),)
