"""A tiny model for tests: two distinct Linear requests, each with a C++ GEMM candidate."""

from __future__ import annotations

import torch
import torch._inductor.config

torch._inductor.config.freezing = True


def example(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16)).eval()
    return model, (torch.randn(batch_size or 8, 32),)


def repeated(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Three Linear(32, 32) layers: one unique request after dedupe."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(32, 32) for _ in range(3)]
    model = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2]).eval()
    return model, (torch.randn(batch_size or 8, 32),)


def same_shape_variants(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Linear(16, 16) + GELU, then Linear(16, 16): under a dynamic batch, freezing lowers them
    to mkldnn linear_unary with attr 'gelu' and 'none', one (op, inputs_key) for two kernels."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 16)).eval()
    return model, (torch.randn(batch_size or 8, 16),)


def activations(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Linear layers each followed by another activation that freezing fuses into mkldnn
    linear_unary under a dynamic batch: SiLU (a Llama MLP's gate, attr 'swish'), Hardswish,
    Hardsigmoid, Sigmoid and Tanh."""
    torch.manual_seed(0)
    acts = (torch.nn.SiLU(), torch.nn.Hardswish(), torch.nn.Hardsigmoid(), torch.nn.Sigmoid(), torch.nn.Tanh())
    layers = [module for act in acts for module in (torch.nn.Linear(16, 16), act)]
    return torch.nn.Sequential(*layers).eval(), (torch.randn(batch_size or 8, 16),)


def residual(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """x + Linear(LayerNorm(x)), a residual block's end: under a dynamic batch, freezing fuses
    the add into mkldnn linear_binary."""
    torch.manual_seed(0)

    class Residual(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.linear = torch.nn.LayerNorm(16), torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.linear(self.norm(x))

    return Residual().eval(), (torch.randn(batch_size or 8, 16),)


def chatty(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """example(), from a model file that prints to stdout as it builds (as many do)."""
    print(f"building the tiny MLP at batch {batch_size}")
    return example(batch_size)


@torch._dynamo.disable
def _stop_here() -> None:
    """Between two graphs, run eagerly: tell this very process to stop (SIGTERM), as a sweep
    cut at its deadline does to its end-to-end pass; only where TINY_STOP_PASS is set."""
    import os
    import signal

    if os.environ.get("TINY_STOP_PASS"):
        os.kill(os.getpid(), signal.SIGTERM)


class _StopsAfterItsGemms(torch.nn.Module):
    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.net(x)  # the first graph: both GEMMs, looked up (and timed, in the pass)
        _stop_here()
        return y * 2


def stops_its_pass(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """example()'s GEMMs, then a stop (SIGTERM) where TINY_STOP_PASS is set."""
    model, inputs = example(batch_size)
    return _StopsAfterItsGemms(model).eval(), inputs


def hangs_in_its_pass(batch_size: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """example(), except that building it hangs where TINY_HANG_PASS names a file: it is
    written first, so a test knows the pass has begun. A pass past its deadline."""
    import os
    import time
    from pathlib import Path

    if os.environ.get("TINY_HANG_PASS"):
        Path(os.environ["TINY_HANG_PASS"]).write_text("hanging")
        time.sleep(600)
    return example(batch_size)
