"""Four GPT-style transformer blocks in plain torch.nn, for a GPU sweep.

d_model 1024, 16 heads, MLP 4x, causal attention through
``scaled_dot_product_attention``, bf16, eval. The input is a float
(batch, seq, d_model) activation tensor rather than token ids, so the model is
just the blocks: every Linear is an addmm request (qkv, attention output, MLP up
and down), and attention itself goes to SDPA. Batch 8, sequence 512 by default.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

D_MODEL = 1024
N_HEADS = 16
N_LAYERS = 4
MLP_RATIO = 4
DEFAULT_BATCH = 8
SEQ_LEN = 512


class Block(nn.Module):
    def __init__(self, d_model: int = D_MODEL, n_heads: int = N_HEADS, mlp_ratio: int = MLP_RATIO) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not a multiple of n_heads={n_heads}")
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, mlp_ratio * d_model)
        self.fc2 = nn.Linear(mlp_ratio * d_model, d_model)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        head_dim = d_model // self.n_heads
        q, k, v = self.qkv(x).split(d_model, dim=-1)
        q, k, v = (t.view(batch, seq, self.n_heads, head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layers: int = N_LAYERS, d_model: int = D_MODEL, n_heads: int = N_HEADS,
                 mlp_ratio: int = MLP_RATIO) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d_model, n_heads, mlp_ratio) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)


def example(
    batch_size: int | None = None,
    *,
    seq_len: int = SEQ_LEN,
    dtype: torch.dtype = torch.bfloat16,
    device: str | None = None,
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = GPT().to(device=device, dtype=dtype).eval()
    x = torch.randn(batch_size or DEFAULT_BATCH, seq_len, D_MODEL, device=device, dtype=dtype)
    return model, (x,)
