"""ResNet-50 for a GPU sweep: `autotune sweep examples/resnet50.py`.

torchvision's ResNet-50, randomly initialised (no weights are downloaded), in
bf16 and channels_last, eval mode. Batch 8 of 3x224x224 images by default: a
small batch keeps the sweep short (its shapes are tuned, not its throughput).
Max-autotune offers Triton conv templates against cuDNN for every convolution
and Triton mm templates for the final Linear (addmm).

torchvision is imported inside ``example()`` so that this file imports on a
machine without it.
"""

from __future__ import annotations

import torch

DEFAULT_BATCH = 8


def example(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    try:
        import torchvision
    except ImportError as exc:
        raise ImportError(
            f"examples/resnet50.py needs torchvision ({exc}); install the torchvision build that "
            "matches your torch (e.g. pip install torchvision --index-url "
            "https://download.pytorch.org/whl/cu130)"
        ) from exc

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torchvision.models.resnet50(weights=None)
    model = model.to(device=device, dtype=torch.bfloat16, memory_format=torch.channels_last).eval()
    x = torch.randn(batch_size or DEFAULT_BATCH, 3, 224, 224, device=device, dtype=torch.bfloat16)
    return model, (x.contiguous(memory_format=torch.channels_last),)
