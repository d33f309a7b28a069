"""The conformance model zoo: public architectures built from random-init configs.

Nothing is downloaded: torchvision models are built with ``weights=None``, Hugging
Face models from their config classes, timm models with ``pretrained=False``. This
module is the registry only and imports no torch, so a parent process can list and
plan without it; the builders live in ``zoo.models`` and import their library
when called. A model whose library is not installed is reported ``unavailable``.

Every entry becomes a model file for ``autotune sweep`` and
``benchmarks/compile_time.py`` through ``write_stub(name, mode, directory)``:

- ``infer``: the model in eval mode, bf16 on CUDA, fp32 on a CPU (with Inductor's
  freezing on, which gives CPU GEMMs C++ template candidates), returning one tensor;
- ``train``: a training step (the contract of ``examples/lm_train.py``): fp32
  parameters, bf16 autocast inside ``forward`` on CUDA, a loss inside the module,
  ``make_optimizer`` (AdamW) and a module-level ``train_step``.

On a CPU every entry uses a tiny configuration of the same architecture, so that a
CPU max-autotune compile takes seconds; ``ci=True`` marks the CPU subset that CI runs.

    python benchmarks/zoo/__init__.py list
    python benchmarks/zoo/__init__.py stub resnet50 train /tmp/stubs
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

MODES: tuple[str, ...] = ("infer", "train")
PACKAGE_DIR = Path(__file__).resolve().parent


# DYNAMIC_DIMS of the stubs: every input dimension the weights do not fix, which is what
# a job compiling with dynamic=True makes dynamic (README, dynamic shapes). Whisper's
# encoder checks its 3000 frames in Python, and torchvision's ViT its 224x224 image
# (torch._assert), which fixes them: marking them dynamic fails Dynamo's constraints
# (seen on an H100, run 66).
IMAGE_DIMS: dict[int, tuple[int, ...]] = {0: (0, 2, 3)}  # batch, height, width
TOKEN_DIMS: dict[int, tuple[int, ...]] = {0: (0, 1)}  # batch, sequence
BATCH_DIMS: dict[int, tuple[int, ...]] = {0: (0,)}


@dataclass(frozen=True)
class Entry:
    name: str
    library: str  # the package the builder needs: torchvision, transformers, timm or torch
    what: str  # one line for the report
    gpu_batch: int
    cpu_batch: int
    modes: tuple[str, ...] = MODES
    ci: bool = False  # in the CPU subset that CI runs
    dynamic_dims: dict[int, tuple[int, ...]] | None = None  # the stub's DYNAMIC_DIMS (None: images)

    def dims(self) -> dict[int, tuple[int, ...]]:
        return IMAGE_DIMS if self.dynamic_dims is None else self.dynamic_dims

    def batch(self, device: str) -> int:
        return self.gpu_batch if device == "cuda" else self.cpu_batch

    def available(self) -> bool:
        """Whether the library is installed, found without importing it (or torch)."""
        return importlib.util.find_spec(self.library) is not None


_ENTRIES: tuple[Entry, ...] = (
    Entry("resnet50", "torchvision", "ResNet-50, 224x224, channels_last", 16, 2),
    Entry("mobilenet_v3_large", "torchvision", "MobileNetV3-Large, 224x224, channels_last", 16, 2),
    Entry("efficientnet_b0", "torchvision", "EfficientNet-B0, 224x224, channels_last", 16, 2),
    Entry("convnext_tiny", "torchvision", "ConvNeXt-T, 224x224, channels_last", 16, 2),
    Entry("swin_t", "torchvision", "Swin-T (windowed attention), 224x224", 8, 2),
    Entry("vit_b_16", "torchvision", "ViT-B/16 (16x16 stride-16 patch conv), 224x224", 8, 2,
          dynamic_dims=BATCH_DIMS),
    Entry("bert", "transformers", "BERT-base (BertConfig()), sequence 128, last_hidden_state", 8, 2,
          dynamic_dims=TOKEN_DIMS),
    Entry("t5", "transformers", "T5-small (T5Config()), encoder 128 + decoder 32 tokens, logits", 8, 2,
          dynamic_dims={0: (0, 1), 1: (0, 1)}),
    Entry("llama", "transformers", "Llama-style decoder: 4 layers, hidden 1024, GQA 16/8 heads, seq 512, logits",
          4, 2, dynamic_dims=TOKEN_DIMS),
    Entry("whisper_encoder", "transformers", "Whisper-base encoder on an 80x3000 log-mel input, last_hidden_state",
          4, 2, dynamic_dims=BATCH_DIMS),
    Entry("gpt2", "transformers", "GPT-2 small (GPT2Config()), sequence 512, logits", 8, 2,
          dynamic_dims=TOKEN_DIMS),
    Entry("unet", "torch", "UNet-style encoder-decoder, hand-written (timm has none), 256x256, channels_last",
          8, 2),
    Entry("mlp_mixer", "torch", "MLP-Mixer-S/16, hand-written: token-mixing MLPs on transposed activations",
          16, 2, ci=True),
    Entry("timm_regnety_016", "timm", "timm regnety_016 (grouped convs, squeeze-excite), 224x224", 16, 2),
    Entry("timm_maxvit_tiny", "timm", "timm maxvit_tiny_rw_224 (MBConv + block/grid attention), 224x224", 8, 2),
)
ZOO: dict[str, Entry] = {entry.name: entry for entry in _ENTRIES}
CPU_SUBSET: tuple[str, ...] = tuple(entry.name for entry in _ENTRIES if entry.ci)

STUB = '''"""{name} ({library}), {what}: a zoo model file (benchmarks/zoo wrote it)."""

from __future__ import annotations

import sys

sys.path.insert(0, {benchmarks!r})

from zoo import models  # noqa: E402

models.configure({mode!r})

DYNAMIC_DIMS = {dims!r}  # what `autotune sweep --dynamic` makes dynamic


def example(batch_size: int | None = None):  # type: ignore[no-untyped-def]
    return models.example({name!r}, {mode!r}, batch_size)
'''
TRAIN_STUB = '''

make_optimizer = models.make_optimizer


def train_step(model, optimizer, inputs):  # type: ignore[no-untyped-def]
    return models.train_step(model, optimizer, inputs)
'''


def write_stub(name: str, mode: str, directory: Path) -> Path:
    """A model file for one entry and mode; a training stub defines ``train_step`` at
    module level, which is how compile_time.py and the sweep's callers recognise one."""
    entry = ZOO[name]
    if mode not in entry.modes:
        raise ValueError(f"{name} does not support mode {mode!r} (it has {', '.join(entry.modes)})")
    text = STUB.format(name=name, library=entry.library, what=entry.what, mode=mode,
                       benchmarks=str(PACKAGE_DIR.parent), dims=entry.dims())
    if mode == "train":
        text += TRAIN_STUB
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}_{mode}.py"
    path.write_text(text)
    return path


def main(argv: list[str]) -> int:
    if argv[:1] == ["list"]:
        for entry in _ENTRIES:
            state = "" if entry.available() else f"  (unavailable: no {entry.library})"
            print(f"{entry.name:20} {entry.library:13} {','.join(entry.modes):11} {entry.what}{state}")
        return 0
    if len(argv) == 4 and argv[0] == "stub" and argv[1] in ZOO and argv[2] in MODES:
        print(write_stub(argv[1], argv[2], Path(argv[3])))
        return 0
    print("usage: zoo list | zoo stub NAME {infer,train} DIRECTORY", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
