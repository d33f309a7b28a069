"""A small mixture-of-experts block for a CPU warm start: Linear layers and a bmm over experts.

`autotune sweep examples/experts.py` tunes its GEMMs. Freezing is on, as `examples/mlp.py` has
it (C++ GEMM templates against MKL for each Linear and for the experts' bmm), so Inductor lowers
the graph again in every fresh process: the artifacts serve its C++ kernels and Inductor's
vector-ISA probes, not the lowering. `python -m benchmarks.startup --models experts` times
its first call against default mode and the floor.
"""

from __future__ import annotations

import torch
import torch._inductor.config

torch._inductor.config.freezing = True

EXPERTS = 4
D_MODEL = 128
D_HIDDEN = 256


class Experts(torch.nn.Module):
    """Tokens projected, dealt to experts in equal shares, each expert's MLP as two bmm, merged."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(D_MODEL, D_MODEL)
        self.w1 = torch.nn.Parameter(torch.randn(EXPERTS, D_MODEL, D_HIDDEN) / D_MODEL**0.5)
        self.w2 = torch.nn.Parameter(torch.randn(EXPERTS, D_HIDDEN, D_MODEL) / D_HIDDEN**0.5)
        self.out = torch.nn.Linear(D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.inp(x).reshape(EXPERTS, -1, D_MODEL)  # batch a multiple of EXPERTS
        hidden = torch.nn.functional.gelu(torch.bmm(tokens, self.w1))
        return self.out(torch.bmm(hidden, self.w2).reshape(-1, D_MODEL))


def example(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Experts().eval(), (torch.randn(batch_size or 64, D_MODEL),)
