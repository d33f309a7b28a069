"""The conformance zoo's registry: which architectures, their libraries, batch sizes and
dynamic dimensions. It imports no torch, so a parent process can list and plan without it;
the models themselves are built by ``examples/zoo.py``. A model whose library is not
installed is reported ``unavailable``.

``write_stub(name, mode, directory)`` writes one entry as a model file for ``autotune sweep``
and the compile-time children: ``infer`` (eval, bf16 on CUDA, or the entry's dtype; on a CPU fp32 with freezing on,
which gives CPU GEMMs C++ template candidates) or ``train`` (a training step). On a CPU every
entry is a tiny configuration of its architecture; ``ci=True`` marks the subset CI runs.

    python -m benchmarks.zoo list
    python -m benchmarks.zoo stub resnet50 train /tmp/stubs
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

MODES = ("infer", "train")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# DYNAMIC_DIMS of the stubs: every input dimension the weights leave free, which is what a job
# compiling with dynamic=True makes dynamic. Whisper's encoder checks its 3000 frames in Python
# and torchvision's ViT its 224x224 image (torch._assert): marking those fails Dynamo's constraints.
IMAGE_DIMS: dict[int, tuple[int, ...]] = {0: (0, 2, 3)}  # batch, height, width
TOKEN_DIMS: dict[int, tuple[int, ...]] = {0: (0, 1)}  # batch, sequence
BATCH_DIMS: dict[int, tuple[int, ...]] = {0: (0,)}


@dataclass(frozen=True)
class Entry:
    name: str
    library: str  # what the builder needs: torchvision, transformers, timm or torch
    what: str
    gpu_batch: int
    cpu_batch: int
    ci: bool = False
    dynamic_dims: dict[int, tuple[int, ...]] | None = None  # None: an image model's
    modes: tuple[str, ...] = MODES

    def dims(self) -> dict[int, tuple[int, ...]]:
        return IMAGE_DIMS if self.dynamic_dims is None else self.dynamic_dims

    def batch(self, device: str) -> int:
        return self.gpu_batch if device == "cuda" else self.cpu_batch

    def available(self) -> bool:
        """Whether the library is installed, found without importing it (or torch)."""
        return importlib.util.find_spec(self.library) is not None


_ENTRIES = (
    Entry("resnet50", "torchvision", "ResNet-50, 224x224, channels_last", 16, 2),
    Entry("mobilenet_v3_large", "torchvision", "MobileNetV3-Large, 224x224, channels_last", 16, 2),
    Entry("efficientnet_b0", "torchvision", "EfficientNet-B0, 224x224, channels_last", 16, 2),
    Entry("convnext_tiny", "torchvision", "ConvNeXt-T, 224x224, channels_last", 16, 2),
    Entry("swin_t", "torchvision", "Swin-T (windowed attention), 224x224", 8, 2),
    Entry("vit_b_16", "torchvision", "ViT-B/16 (16x16 stride-16 patch conv), 224x224", 8, 2, dynamic_dims=BATCH_DIMS),
    Entry("bert", "transformers", "BERT-base, sequence 128, last_hidden_state", 8, 2, dynamic_dims=TOKEN_DIMS),
    Entry("t5", "transformers", "T5-small, encoder 128 + decoder 32 tokens, logits", 8, 2,
          dynamic_dims={0: (0, 1), 1: (0, 1)}),
    Entry("llama", "transformers", "Llama-style decoder: 4 layers, hidden 1024, GQA 16/8 heads, seq 512", 4, 2,
          dynamic_dims=TOKEN_DIMS),
    Entry("whisper_encoder", "transformers", "Whisper-base encoder on an 80x3000 log-mel input", 4, 2,
          dynamic_dims=BATCH_DIMS),
    Entry("gpt2", "transformers", "GPT-2 small, sequence 512, logits", 8, 2, dynamic_dims=TOKEN_DIMS),
    Entry("unet", "torch", "UNet-style encoder-decoder, hand-written, 256x256, channels_last", 8, 2),
    Entry("mlp_mixer", "torch", "MLP-Mixer-S/16, hand-written: token mixing on transposed activations", 16, 2, ci=True),
    Entry("dlrm", "torch", "DLRM-style recommender, hand-written: 26 embedding bags, pairwise bmm(t, t^T), odd-width "
          "MLPs, fp16", 2048, 4, dynamic_dims={0: (0,), 1: (0,)}),
    Entry("moe", "torch", "Mixture-of-experts layer, hand-written: 8 experts, top-2 routing, capacity 1.25, bmm "
          "experts, seq 512, bf16", 8, 2, dynamic_dims=BATCH_DIMS),
    Entry("timm_regnety_016", "timm", "timm regnety_016 (grouped convs, squeeze-excite), 224x224", 16, 2),
    Entry("timm_maxvit_tiny", "timm", "timm maxvit_tiny_rw_224 (MBConv + block/grid attention), 224x224", 8, 2),
)
ZOO: dict[str, Entry] = {entry.name: entry for entry in _ENTRIES}
CPU_SUBSET = tuple(entry.name for entry in _ENTRIES if entry.ci)

STUB = '''"""{name} ({library}), {what}: a zoo model file written by benchmarks/zoo.py."""

import sys

import torch

sys.path.insert(0, {examples!r})
import zoo  # noqa: E402  (examples/zoo.py)

zoo.configure({mode!r})

DYNAMIC_DIMS = {dims!r}  # what `autotune sweep --dynamic` makes dynamic


def example(batch_size=None):  # type: ignore[no-untyped-def]
    default = {gpu_batch} if torch.cuda.is_available() else {cpu_batch}
    return zoo.example({name!r}, {mode!r}, batch_size or default)
'''
TRAIN_STUB = '''

make_optimizer = zoo.make_optimizer


def train_step(model, optimizer, inputs):  # type: ignore[no-untyped-def]  (a def: how a training file is known)
    return zoo.train_step(model, optimizer, inputs)
'''


def write_stub(name: str, mode: str, directory: Path) -> Path:
    """A model file for one entry and mode; a training stub defines ``train_step`` at module level."""
    entry = ZOO[name]
    if mode not in entry.modes:
        raise ValueError(f"{name} does not support mode {mode!r} (it has {', '.join(entry.modes)})")
    text = STUB.format(name=name, library=entry.library, what=entry.what, mode=mode, examples=str(EXAMPLES),
                       dims=entry.dims(), gpu_batch=entry.gpu_batch, cpu_batch=entry.cpu_batch)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}_{mode}.py"
    path.write_text(text + (TRAIN_STUB if mode == "train" else ""))
    return path


def main(argv: list[str]) -> int:
    if argv[:1] == ["list"]:
        for e in _ENTRIES:
            state = "" if e.available() else f"  (unavailable: no {e.library})"
            print(f"{e.name:20} {e.library:13} {','.join(e.modes):11} {e.what}{state}")
        return 0
    if len(argv) == 4 and argv[0] == "stub" and argv[1] in ZOO and argv[2] in MODES:
        print(write_stub(argv[1], argv[2], Path(argv[3])))
        return 0
    print("usage: python -m benchmarks.zoo list | stub NAME {infer,train} DIRECTORY", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
