"""A zoo of public architectures, randomly initialised (nothing is downloaded): torchvision
ResNet-50, MobileNetV3-Large, EfficientNet-B0, ConvNeXt-T, Swin-T and ViT-B/16; transformers
BERT-base, T5-small, a Llama-style decoder, the Whisper-base encoder and GPT-2 small; a UNet,
an MLP-Mixer-S/16, a DLRM-style recommender and a mixture-of-experts layer in plain torch;
timm regnety_016 and maxvit_tiny_rw_224.

Each builder returns the bare network and a function of the batch size that makes its
inputs, at full size on CUDA and tiny on a CPU. ``example(name, mode, batch_size)`` turns
one into what a model file returns: for ``infer`` the network in eval mode, bf16 on CUDA
(fp16 for the recommender; fp32 on a CPU); for ``train`` the network wrapped in ``TrainLoss``
(fp32 parameters, autocast to that dtype inside ``forward`` on CUDA, the loss inside the
module), with ``make_optimizer``
and ``train_step`` as ``examples/lm_train.py`` defines them. torchvision, transformers and
timm are imported inside their builders.

The conformance benchmark writes a small model file per entry and mode that calls this one:

    python -m benchmarks.zoo stub resnet50 infer /tmp/stubs && autotune sweep /tmp/stubs/resnet50_infer.py
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch._inductor.config
from torch import nn
from torch.nn import functional as F

Inputs = tuple[torch.Tensor, ...]
LEARNING_RATE = 1e-4


@dataclass
class Built:
    net: nn.Module
    inputs: Callable[[int], Inputs]  # batch size -> inputs, fp32/int64 on the CPU
    channels_last: bool = False  # convolutional nets: the layout cuDNN and Inductor's conv templates prefer
    dtype: torch.dtype = torch.bfloat16  # on CUDA: inference's weights and activations, training's autocast


def configure(mode: str) -> None:
    """Model-file configuration at import. On a CPU, inference compiles with freezing on:
    without it a CPU Linear has one choice and nothing is tuned (as examples/mlp.py)."""
    if mode == "infer" and not torch.cuda.is_available():
        torch._inductor.config.freezing = True


# ------------------------------------------------------------------ hand-written (plain torch)


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, channels: int, token_hidden: int, channel_hidden: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, token_hidden), nn.GELU(), nn.Linear(token_hidden, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(channels, channel_hidden), nn.GELU(),
                                         nn.Linear(channel_hidden, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, tokens, channels)
        # Token mixing runs its Linear layers over the transposed activations: GEMM
        # inputs that are views with non-default strides.
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MLPMixer(nn.Module):
    """MLP-Mixer (Tolstikhin et al. 2021). ``classes=0`` drops the head (features only)."""

    def __init__(self, image: int, patch: int, channels: int, token_hidden: int, channel_hidden: int,
                 depth: int, classes: int) -> None:
        super().__init__()
        tokens = (image // patch) ** 2
        self.stem = nn.Conv2d(3, channels, patch, stride=patch)
        self.blocks = nn.Sequential(*(MixerBlock(tokens, channels, token_hidden, channel_hidden)
                                      for _ in range(depth)))
        self.norm = nn.LayerNorm(channels)
        self.head = nn.Linear(channels, classes) if classes else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x).flatten(2).transpose(1, 2))
        return self.head(self.norm(x).mean(dim=1))


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """A UNet-style segmentation net (Ronneberger et al. 2015): double 3x3 convs, max-pool
    down, transposed-conv up, skip connections concatenated, a 1x1 head."""

    def __init__(self, widths: tuple[int, ...], classes: int) -> None:
        super().__init__()
        self.down = nn.ModuleList(_double_conv(cin, cout) for cin, cout in zip((3,) + widths[:-1], widths))
        self.up = nn.ModuleList(nn.ConvTranspose2d(w, w // 2, 2, stride=2) for w in reversed(widths[1:]))
        self.merge = nn.ModuleList(_double_conv(w, w // 2) for w in reversed(widths[1:]))
        self.head = nn.Conv2d(widths[0], classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else nn.functional.max_pool2d(x, 2))
            skips.append(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips[:-1])):
            x = merge(torch.cat([up(x), skip], dim=1))
        return self.head(x)


def _mlp(widths: tuple[int, ...], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (cin, cout) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(cin, cout))
        if last_relu or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """A DLRM-style recommender (Naumov et al. 2019): a bottom MLP over the dense features,
    one embedding bag (summed) per sparse feature, the pairwise dot products of all these
    vectors as one batched matmul of a tensor with its own transpose, and a top MLP."""

    def __init__(self, dense: int, bottom: tuple[int, ...], top: tuple[int, ...], tables: int, rows: int,
                 dim: int) -> None:
        super().__init__()
        self.bottom = _mlp((dense, *bottom, dim), last_relu=True)
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        vectors = tables + 1
        pairs = torch.tril_indices(vectors, vectors, offset=-1)
        self.register_buffer("pairs", pairs, persistent=False)
        self.top = _mlp((dim + pairs.shape[1], *top, 1), last_relu=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:  # sparse: (batch, tables, bag)
        x = self.bottom(dense)
        t = torch.stack([x] + [bag(sparse[:, i]) for i, bag in enumerate(self.embeddings)], dim=1)
        # Both inputs are views of one buffer: Inductor's kernel reads it once.
        z = torch.bmm(t, t.transpose(1, 2))
        return self.top(torch.cat([x, z[:, self.pairs[0], self.pairs[1]]], dim=1))


class MoE(nn.Module):
    """A mixture-of-experts layer (Switch/GShard style): top-k routing, fixed-capacity
    dispatch (a token past its expert's capacity is dropped for that expert) and the expert
    MLPs as batched matmuls over (experts, capacity, dim), with a pre-norm and a residual.
    The capacity follows from the token count in integers, so it stays a size expression
    under a dynamic batch."""

    def __init__(self, dim: int, hidden: int, experts: int, k: int, capacity_factor: tuple[int, int]) -> None:
        super().__init__()
        self.experts, self.k, self.factor = experts, k, capacity_factor
        self.norm = nn.LayerNorm(dim)
        self.router = nn.Linear(dim, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, dim, hidden) / dim**0.5)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, dim) / hidden**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, seq, dim)
        tokens = self.norm(x).flatten(0, 1)
        n, dim = tokens.shape
        numerator, denominator = self.factor
        capacity = (n * self.k * numerator + self.experts * denominator - 1) // (self.experts * denominator)
        gate, expert = self.router(tokens).softmax(-1).topk(self.k, dim=-1)  # (n, k)
        gate = gate / gate.sum(-1, keepdim=True)
        # Slot-major: every token's first choice is placed before any second choice.
        flat_expert, flat_gate = expert.t().reshape(-1), gate.t().reshape(-1)
        onehot = F.one_hot(flat_expert, self.experts)
        position = (onehot.cumsum(0) * onehot).sum(-1) - 1
        keep = (position < capacity).to(tokens.dtype)
        slot = flat_expert * capacity + position.clamp(max=capacity - 1)
        source = torch.arange(n, device=x.device).repeat(self.k)
        dispatched = tokens.new_zeros(self.experts * capacity, dim).index_add(0, slot, tokens[source] * keep[:, None])
        hidden = F.gelu(torch.bmm(dispatched.view(self.experts, capacity, dim), self.w1))
        out = torch.bmm(hidden, self.w2).reshape(-1, dim)
        combined = tokens.new_zeros(n, dim).index_add(0, source, out[slot] * (flat_gate * keep)[:, None])
        return x + combined.view_as(x)


def _images(size: int) -> Callable[[int], Inputs]:
    return lambda batch: (torch.randn(batch, 3, size, size),)


def _tokens(vocab: int, *lengths: int) -> Callable[[int], Inputs]:
    return lambda batch: tuple(torch.randint(0, vocab, (batch, n)) for n in lengths)


def build_mlp_mixer(small: bool) -> Built:
    if small:  # one block whose four Linear layers share one shape; no head
        return Built(MLPMixer(16, 4, 16, 16, 16, depth=1, classes=0), _images(16))
    return Built(MLPMixer(224, 16, 512, 256, 2048, depth=8, classes=1000), _images(224))


def build_dlrm(small: bool) -> Built:
    """Odd MLP widths (a GEMM whose sizes are no multiple of the tile), 26 sparse features of
    bags of 4 indices and 13 dense features, as the Criteo set has; fp16 on CUDA."""
    if small:
        dense, tables, rows, dim, bag, bottom, top = 13, 4, 50, 8, 2, (15,), (9,)
    else:
        dense, tables, rows, dim, bag, bottom, top = 13, 26, 20000, 64, 4, (509, 253), (511, 255)
    net = DLRM(dense, bottom, top, tables, rows, dim)

    def inputs(batch: int) -> Inputs:
        return torch.randn(batch, dense), torch.randint(0, rows, (batch, tables, bag))

    return Built(net, inputs, dtype=torch.float16)


def build_moe(small: bool) -> Built:
    """8 experts, top-2, capacity factor 1.25, on (batch, 512, 1024) tokens; bf16 on CUDA."""
    if small:
        dim, hidden, experts, seq = 16, 24, 4, 8
    else:
        dim, hidden, experts, seq = 1024, 2816, 8, 512
    net = MoE(dim, hidden, experts, k=2, capacity_factor=(5, 4))
    return Built(net, lambda batch: (torch.randn(batch, seq, dim),))


def build_unet(small: bool) -> Built:
    widths, size = ((4, 8), 16) if small else ((64, 128, 256, 512), 256)
    return Built(UNet(widths, classes=2), _images(size), channels_last=True)


# ------------------------------------------------------------------ torchvision and timm


def _torchvision(name: str, channels_last: bool, small_image: int = 64, **small_kwargs: Any) -> Callable[[bool], Built]:
    """torchvision keeps each architecture's width on a CPU; only the image is small."""

    def build(small: bool) -> Built:
        import torchvision

        net = getattr(torchvision.models, name)(weights=None, **(small_kwargs if small else {}))
        return Built(net, _images(small_image if small else 224), channels_last)

    return build


def _timm(name: str, small_image: int = 64) -> Callable[[bool], Built]:
    def build(small: bool) -> Built:
        import timm

        net = timm.create_model(name, pretrained=False)
        return Built(net, _images(small_image if small else 224), channels_last=True)

    return build


# ------------------------------------------------------------------ transformers


class HFOutput(nn.Module):
    """A Hugging Face model called with keyword inputs, returning one plain tensor."""

    def __init__(self, model: nn.Module, names: tuple[str, ...], output: str, **fixed: Any) -> None:
        super().__init__()
        self.model, self.names, self.output, self.fixed = model, names, output, fixed

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(**dict(zip(self.names, inputs)), **self.fixed), self.output)


def build_bert(small: bool) -> Built:
    import transformers

    config = (transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=128, vocab_size=256, max_position_embeddings=64)
              if small else transformers.BertConfig())
    net = HFOutput(transformers.BertModel(config), ("input_ids",), "last_hidden_state")
    return Built(net, _tokens(config.vocab_size, 16 if small else 128))


def build_t5(small: bool) -> Built:
    import transformers

    config = (transformers.T5Config(d_model=64, d_ff=128, d_kv=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                                    vocab_size=256) if small else transformers.T5Config())
    net = HFOutput(transformers.T5ForConditionalGeneration(config), ("input_ids", "decoder_input_ids"), "logits",
                   use_cache=False)
    return Built(net, _tokens(config.vocab_size, *((16, 8) if small else (128, 32))))


def build_llama(small: bool) -> Built:
    import transformers

    sizes = (dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2) if small else
             dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                  num_attention_heads=16, num_key_value_heads=8))
    config = transformers.LlamaConfig(max_position_embeddings=1024, **sizes)
    net = HFOutput(transformers.LlamaForCausalLM(config), ("input_ids",), "logits", use_cache=False)
    return Built(net, _tokens(config.vocab_size, 16 if small else 512))


def build_whisper_encoder(small: bool) -> Built:
    import transformers
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    sizes = (dict(d_model=64, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=128, num_mel_bins=16,
                  max_source_positions=32) if small else
             dict(d_model=512, encoder_layers=6, encoder_attention_heads=8, encoder_ffn_dim=2048))  # whisper-base
    config = transformers.WhisperConfig(**sizes)
    frames = 2 * config.max_source_positions  # the encoder insists on exactly this many (3000 at full size)
    net = HFOutput(WhisperEncoder(config), ("input_features",), "last_hidden_state")
    return Built(net, lambda batch: (torch.randn(batch, config.num_mel_bins, frames),))


def build_gpt2(small: bool) -> Built:
    import transformers

    config = (transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=256, n_positions=64, bos_token_id=0,
                                      eos_token_id=0, use_cache=False)
              if small else transformers.GPT2Config(use_cache=False))
    net = HFOutput(transformers.GPT2LMHeadModel(config), ("input_ids",), "logits", use_cache=False)
    return Built(net, _tokens(config.vocab_size, 16 if small else 512))


BUILDERS: dict[str, Callable[[bool], Built]] = {
    "resnet50": _torchvision("resnet50", channels_last=True),
    "mobilenet_v3_large": _torchvision("mobilenet_v3_large", channels_last=True),
    "efficientnet_b0": _torchvision("efficientnet_b0", channels_last=True),
    "convnext_tiny": _torchvision("convnext_tiny", channels_last=True),
    "swin_t": _torchvision("swin_t", channels_last=False),
    "vit_b_16": _torchvision("vit_b_16", channels_last=False, small_image=32, image_size=32),
    "bert": build_bert,
    "t5": build_t5,
    "llama": build_llama,
    "whisper_encoder": build_whisper_encoder,
    "gpt2": build_gpt2,
    "unet": build_unet,
    "mlp_mixer": build_mlp_mixer,
    "dlrm": build_dlrm,
    "moe": build_moe,
    "timm_regnety_016": _timm("regnety_016"),
    "timm_maxvit_tiny": _timm("maxvit_tiny_rw_224", small_image=224),  # its 7x7 windows need 224
}


# ------------------------------------------------------------------ the model-file contract


class TrainLoss(nn.Module):
    """The network and a loss, for one training step: fp32 parameters, autocast (bf16, or
    the model's dtype) inside ``forward`` on CUDA (so ``autotune sweep --train``, which calls
    the module bare, sees the same GEMMs as training), and the mean square of the output as
    the loss: every output element gets a gradient, with no per-model targets to shape."""

    def __init__(self, net: nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.net, self.dtype = net, dtype

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=inputs[0].device.type, dtype=self.dtype, enabled=inputs[0].is_cuda):
            out = self.net(*inputs)
        return out.float().square().mean()


def example(name: str, mode: str, batch_size: int) -> tuple[nn.Module, Inputs]:
    """``(module, inputs)`` for zoo entry ``name`` in ``mode`` ("infer" or "train")."""
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    built = BUILDERS[name](device == "cpu")
    inputs = built.inputs(batch_size)
    # The model's dtype (bf16 but for fp16 ones) for inference on CUDA; training keeps fp32 parameters.
    dtype = built.dtype if device == "cuda" and mode == "infer" else torch.float32
    layout = torch.channels_last if built.channels_last else torch.contiguous_format
    net = built.net.to(device=device, dtype=dtype, memory_format=layout)
    inputs = tuple(_place(x, device, dtype, layout) for x in inputs)
    if mode == "infer":
        return net.eval(), inputs
    return TrainLoss(net, built.dtype).train(), inputs


def _place(x: torch.Tensor, device: str, dtype: torch.dtype, layout: torch.memory_format) -> torch.Tensor:
    x = x.to(device=device, dtype=dtype if x.is_floating_point() else x.dtype)
    return x.contiguous(memory_format=layout) if x.dim() == 4 else x


def make_optimizer(module: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(module.parameters(), lr=LEARNING_RATE, foreach=True)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: Inputs) -> torch.Tensor:
    loss = model(*inputs)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()
