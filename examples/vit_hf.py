"""Hugging Face ViT-B/16, randomly initialised, for a GPU sweep: `autotune sweep examples/vit_hf.py`.

``transformers.ViTConfig()`` defaults (ViT-B/16: 12 layers, hidden 768, 12
heads, 224x224 images in 16x16 patches), built from the config (nothing is
downloaded: GPU machines have no network), with a 1000-class head. bf16 on
CUDA, fp32 on CPU, eval mode. Input: batch 8 of 3x224x224 images by default.
The module returned wraps ``ViTForImageClassification`` and returns the logits
tensor only, so the compiled graph has one plain output. The patch embedding
is a 16x16 stride-16 convolution; the rest are Linear layers (addmm).

transformers is imported inside ``example()`` so that this file imports on a
machine without it.
"""

from __future__ import annotations

import torch

DEFAULT_BATCH = 8
NUM_LABELS = 1000


class LogitsOnly(torch.nn.Module):
    """``model(pixel_values).logits``."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).logits


def example(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(f"examples/vit_hf.py needs transformers ({exc}); pip install transformers") from exc

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config = transformers.ViTConfig(num_labels=NUM_LABELS)  # ViT-B/16 at 224x224
    model = transformers.ViTForImageClassification(config).to(device=device, dtype=dtype).eval()
    pixels = torch.randn(batch_size or DEFAULT_BATCH, 3, config.image_size, config.image_size, device=device,
                         dtype=dtype)
    return LogitsOnly(model).eval(), (pixels,)
