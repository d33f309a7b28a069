"""Hugging Face GPT-2 small, randomly initialised, for a GPU sweep.

``transformers.GPT2Config()`` defaults (12 layers, d_model 768, 12 heads,
vocab 50257), built from the config (nothing is downloaded), bf16, eval, KV
cache off. Input: token ids, batch 8 x sequence 512 by default. The module
returned wraps ``GPT2LMHeadModel`` and returns the logits tensor only, so the
compiled graph has one plain output. GPT-2's Conv1D layers lower to addmm; the
LM head is an mm against the 50257-wide embedding.

transformers is imported inside ``example()`` so that this file imports on a
machine without it.
"""

from __future__ import annotations

import torch

DEFAULT_BATCH = 8
SEQ_LEN = 512


class LogitsOnly(torch.nn.Module):
    """``model(input_ids).logits``, without the KV cache."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def example(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(
            f"examples/gpt2_hf.py needs transformers ({exc}); pip install transformers"
        ) from exc

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = transformers.GPT2Config(use_cache=False)  # GPT-2 small: n_layer=12, n_embd=768
    model = transformers.GPT2LMHeadModel(config).to(device=device, dtype=torch.bfloat16).eval()
    input_ids = torch.randint(0, config.vocab_size, (batch_size or DEFAULT_BATCH, SEQ_LEN), device=device)
    return LogitsOnly(model).eval(), (input_ids,)
