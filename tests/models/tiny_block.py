"""A tiny transformer-ish block for dynamic-shape tests: Linear layers on (batch, seq, dim)
inputs, with batch and sequence length named dynamic for `autotune sweep --dynamic`.

Its GEMMs ask with M = seq*batch (``s27*s77`` in the graph's symbols), an expression a
one-op graph on a 2-D input does not have by itself. ReLU and no residual: on CPU,
freezing would fuse GELU or a residual add into mkldnn linear_unary / linear_binary
(reproduced too: tests/test_capture.py), and this model keeps to the plainest case.
"""

from __future__ import annotations

import torch
import torch._inductor.config

torch._inductor.config.freezing = True

# Input 0 is (batch, seq, dim): batch and sequence length vary in a job, dim is the model's.
DYNAMIC_DIMS = {0: (0, 1)}


class Block(torch.nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))


def example(batch_size: int | None = None, seq_len: int = 16) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Batch and sequence length differ (2 and 16): with dynamic=True, Dynamo gives equal
    sizes one symbol, while marked dimensions each get their own."""
    torch.manual_seed(0)
    return Block().eval(), (torch.randn(batch_size or 2, seq_len, 32),)
