"""Two Linear layers over one token count, written two ways (ConvNeXt-T's case, small).

Under ``dynamic=True`` a square image's sides share one symbol, and the first layer's
tokens number ``s77*((s53//4))**2``. The second layer's tokens come from a reshape whose
row count Python computes as ``(h * w) // w``: the same number, which Inductor keeps as
``s77*((s53//4))*(((((s53//4))**2)//((s53//4))))`` (sympy does not cancel a power by
floor division). Both ask Inductor with one ``inputs_key`` (it holds size hints only),
but their kernels differ by that expression: two requests, each to be tuned and served.
ConvNeXt-T's later blocks ask so: a job missed them on H100s (runs 120-128) until the
selector kept the two apart (found on an H200, run 129).
"""

from __future__ import annotations

import torch
import torch._inductor.config

torch._inductor.config.freezing = True  # the C++ GEMM template needs constant weights

# Input 0 is an image (batch, 3, height, width): all but the channels vary in a job.
DYNAMIC_DIMS = {0: (0, 2, 3)}


class TwoWidths(torch.nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, dim, 4, stride=4)
        self.first = torch.nn.Linear(dim, dim)
        self.second = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        batch, channels, height, width = x.shape
        tokens = self.first(x.flatten(2).transpose(1, 2))
        rows = (height * width) // width  # height, in the form a view's -1 gives it
        again = torch.relu(x).reshape(batch, channels, rows * width).transpose(1, 2)
        return tokens + self.second(again)


def example(batch_size: int | None = None, image_size: int = 16) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return TwoWidths().eval(), (torch.randn(batch_size or 2, 3, image_size, image_size),)
