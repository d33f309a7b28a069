"""A training step of a small decoder-only LM: `autotune sweep examples/lm_train.py --train`.

Four pre-norm transformer blocks in plain torch (token and position embeddings,
causal attention through ``scaled_dot_product_attention``, a GELU MLP, an
untied LM head), fp32 parameters. On CUDA the forward runs under bf16 autocast
(d_model 768, 12 heads, vocab 8192, batch 8 x 512 tokens); on CPU in fp32 at
small sizes (d_model 128, vocab 1024, batch 4 x 64), so that a CPU
max-autotune compile ends in a couple of minutes.

The training-step contract (``python -m benchmarks.compile_time`` reads it):

- ``example(batch_size=None)`` returns ``(module, (tokens, targets))`` as every
  model file does, and ``module(tokens, targets)`` returns the scalar loss. The
  loss is inside the module, and autocast inside ``forward``, so that what
  ``autotune sweep --train`` compiles (the module, then ``loss.backward()``) is
  exactly the forward and backward graphs that training compiles.
- ``make_optimizer(module)`` builds the optimizer (AdamW here).
- ``train_step(model, optimizer, inputs)`` runs one step and returns the loss:
  forward, loss, backward, ``optimizer.step()``, ``zero_grad``. ``model`` is the
  compiled module; the benchmark replaces ``optimizer.step`` with a compiled one.

All classes are at module level: ``torch._dynamo.config.caching_precompile``
packages only code it can import again by name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Dims:
    vocab: int
    d_model: int
    n_heads: int
    n_layers: int
    seq_len: int
    batch: int


GPU_DIMS = Dims(vocab=8192, d_model=768, n_heads=12, n_layers=4, seq_len=512, batch=8)
CPU_DIMS = Dims(vocab=1024, d_model=128, n_heads=4, n_layers=4, seq_len=64, batch=4)
MLP_RATIO = 4
LEARNING_RATE = 3e-4


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not a multiple of n_heads={n_heads}")
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, MLP_RATIO * d_model)
        self.fc2 = nn.Linear(MLP_RATIO * d_model, d_model)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        q, k, v = self.qkv(x).split(d_model, dim=-1)
        q, k, v = (t.view(batch, seq, self.n_heads, d_model // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class DecoderLM(nn.Module):
    """Tokens and targets in, mean cross-entropy out."""

    def __init__(self, dims: Dims) -> None:
        super().__init__()
        self.tokens = nn.Embedding(dims.vocab, dims.d_model)
        self.positions = nn.Embedding(dims.seq_len, dims.d_model)
        self.blocks = nn.ModuleList(Block(dims.d_model, dims.n_heads) for _ in range(dims.n_layers))
        self.ln_f = nn.LayerNorm(dims.d_model)
        self.head = nn.Linear(dims.d_model, dims.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Autocast here, not around the call: the sweep calls the module bare and
        # must see the same bf16 GEMMs as training does.
        with torch.autocast(device_type=tokens.device.type, dtype=torch.bfloat16, enabled=tokens.is_cuda):
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.tokens(tokens) + self.positions(positions)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def dims_for(device: str) -> Dims:
    return GPU_DIMS if device == "cuda" else CPU_DIMS


def example(batch_size: int | None = None) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dims = dims_for(device)
    model = DecoderLM(dims).to(device).train()
    shape = (batch_size or dims.batch, dims.seq_len)
    tokens = torch.randint(0, dims.vocab, shape, device=device)
    targets = torch.randint(0, dims.vocab, shape, device=device)
    return model, (tokens, targets)


def small(batch_size: int | None = None) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """``example()`` with two blocks instead of four: the LM step of the distributed benchmark
    (``python -m benchmarks.distributed``), whose DDP and FSDP2 jobs and cold single-process
    compile must fit one device session."""
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dims = replace(dims_for(device), n_layers=2)
    model = DecoderLM(dims).to(device).train()
    shape = (batch_size or dims.batch, dims.seq_len)
    tokens = torch.randint(0, dims.vocab, shape, device=device)
    targets = torch.randint(0, dims.vocab, shape, device=device)
    return model, (tokens, targets)


def make_optimizer(module: nn.Module) -> torch.optim.Optimizer:
    # foreach: one multi-tensor update, which Inductor fuses into few kernels when
    # the step is compiled. The learning rate stays a float: a constant, no guard churn.
    return torch.optim.AdamW(module.parameters(), lr=LEARNING_RATE, weight_decay=0.1, foreach=True)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    loss = model(*inputs)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()
