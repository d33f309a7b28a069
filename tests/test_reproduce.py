"""The worker's one-op graph takes the graph-wide decisions the capture recorded.

On an H100 a ViT's patch embedding (a 16x16/16 convolution) came back key_mismatch:
in the model Inductor kept NCHW (layout optimization is off when the graph has
>= 300 nodes per convolution), alone it chose channels-last and asked with other
strides. These run the real Inductor compile on CPU, where the same switch decides
whether the convolution's inputs are copied to channels-last first.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from autotune.cache.records import InputLayout, TuningRequest
from autotune.inductor_glue.capture import capture_file, fresh_inductor
from autotune.workers.reproduce import graph_config, one_op_graph

TINY = str(Path(__file__).parent / "models" / "tiny_mlp.py")


def _patch_embedding(layout_opt: bool | None) -> TuningRequest:
    conv = {"stride": [16, 16], "padding": [0, 0], "dilation": [1, 1], "transposed": False,
            "output_padding": [0, 0], "groups": 1}
    return TuningRequest(
        op="convolution", inputs_key="patch-embedding", precision="highest",
        inputs=(InputLayout((2, 3, 32, 32), (3072, 1024, 32, 1), 0, "torch.float32", "cpu"),
                InputLayout((8, 3, 16, 16), (768, 256, 16, 1), 0, "torch.float32", "cpu")),
        params={"aten": conv, "graph": {} if layout_opt is None else {"layout_opt": layout_opt}})


def _layout_copies(request: TuningRequest) -> int:
    """Kernels the compiled one-op graph runs besides the convolution: layout copies."""
    graph = one_op_graph(request, "cpu")
    with fresh_inductor(graph_config(request)):
        _, code = run_and_get_code(torch.compile(graph.fn), *graph.inputs)
    return code[0].count("async_compile.cpp_pybinding")


@pytest.mark.parametrize(("recorded", "copies"), [(False, 0), (True, 2)])
def test_one_op_convolution_keeps_the_models_layout_decision(recorded: bool, copies: int) -> None:
    assert _layout_copies(_patch_embedding(recorded)) == copies


def test_requests_recorded_before_the_decision_was_captured_are_reproduced_as_before() -> None:
    assert graph_config(_patch_embedding(None)) == {}
    assert _layout_copies(_patch_embedding(None)) == 2  # Inductor's own choice for a lone CPU conv


def test_capture_records_the_graphs_layout_decision() -> None:
    result = capture_file(TINY)
    assert all(r.params["graph"] == {"layout_opt": False} for r in result.requests)  # no convolution


def test_runtime_tuning_policies_nest_and_come_off() -> None:
    """The innermost policy decides which kernels tune at first run; leaving restores Inductor's."""
    from autotune.inductor_glue.capture import kernel_owner, no_runtime_tuning, tune_only_shard
    from autotune.inductor_glue.seams import COORDINATE_DESCENT

    autotuner_cls = COORDINATE_DESCENT.owner()
    original = autotuner_cls.__dict__["coordinate_descent_tuning"]
    kernels = []
    for name in ("triton_poi_0", "triton_poi_1", "triton_red_2", "triton_per_3"):
        kernel = object.__new__(autotuner_cls)  # a real autotuner, without compiling anything
        kernel.inductor_meta, kernel.fn = {"kernel_name": name}, None
        kernels.append(kernel)
    no_source = hashlib.sha1(b"").hexdigest()
    owners = [kernel_owner(f"{k.inductor_meta['kernel_name']}:{no_source}", 2) for k in kernels]
    launcher = object()
    with no_runtime_tuning():
        assert all(k.coordinate_descent_tuning(launcher) is launcher for k in kernels)
        with tune_only_shard(0, 2):
            for kernel, owner in zip(kernels, owners):
                if owner == 1:  # another shard's kernel: its launcher is kept untuned
                    assert kernel.coordinate_descent_tuning(launcher) is launcher
    assert autotuner_cls.__dict__["coordinate_descent_tuning"] is original


def test_capture_and_the_hook_share_one_coordinate_descent_patch_and_leave_in_any_order() -> None:
    """Both skip coordinate descent through one patch (inductor_glue/descent.py): whichever
    leaves first, the last to leave restores Inductor's method, and none stays wrapped."""
    from autotune.inductor_glue.capture import no_runtime_tuning
    from autotune.inductor_glue.seams import COORDINATE_DESCENT
    from autotune.job import kernel_configs

    autotuner_cls = COORDINATE_DESCENT.owner()
    original = autotuner_cls.__dict__["coordinate_descent_tuning"]
    kernel = object.__new__(autotuner_cls)
    kernel.inductor_meta, kernel.fn = {"kernel_name": "triton_poi_0"}, None
    launcher = object()
    capture = no_runtime_tuning()
    capture.__enter__()
    kernel_configs.push(lambda key, value: None)
    assert kernel.coordinate_descent_tuning(launcher) is launcher  # capture's rule still answers
    capture.__exit__(None, None, None)  # capture leaves first
    assert autotuner_cls.__dict__["coordinate_descent_tuning"] is not original  # the hook's rule stays
    kernel_configs.pop()
    assert autotuner_cls.__dict__["coordinate_descent_tuning"] is original


# ---------------------------------------------- symbolic sizes spelled as the model spelled them


def test_monomial_sizes_split_into_their_factors() -> None:
    from autotune.workers.symbolic import monomial

    hints = {"s27": 16, "s77": 2}
    assert monomial("s27*s77", hints) == [(16, "s27"), (2, "s77")]
    assert monomial("16*s77", hints) == [(16, None), (2, "s77")]
    assert monomial("s77**2", hints) == [(2, "s77"), (2, "s77")]
    assert monomial("s77*(s27 - 1)", hints) is None  # a slice's size: not carried (README, limits)
    assert monomial("s99", hints) is None  # a symbol without a recorded hint


@pytest.mark.parametrize("transposed", [False, True])
def test_a_carrier_holds_the_same_memory_and_unpacks_to_the_recorded_layout(transposed: bool) -> None:
    from autotune.workers.reproduce import make_input
    from autotune.workers.symbolic import carrier_for

    sizes, strides = ((32, 8), (1, 32)) if transposed else ((32, 8), (8, 1))
    layout = InputLayout(sizes, strides, 0, "torch.float32", "cpu", symbolic=(0,), exprs=("16*s77",))
    tensor = make_input(layout, "cpu", torch.Generator().manual_seed(0))
    carrier = carrier_for(tensor, layout, {"s77": 2})
    assert carrier is not None and [size for size, _ in carrier.factors] == ([8, 16, 2] if transposed else [16, 2, 8])
    packed = carrier.pack(tensor)
    assert packed.data_ptr() == tensor.data_ptr()  # a view: the builder's reference still applies
    unpacked = carrier.unpack(packed)
    assert unpacked.shape == tensor.shape and unpacked.stride() == tensor.stride()
    torch.testing.assert_close(unpacked, tensor, rtol=0, atol=0)


def test_a_carrier_as_large_as_its_memory_keeps_the_models_symbol_under_dynamic_true() -> None:
    """The Llama decoder's rotary ``mm`` (32x1 @ 1xS, fp32) under ``dynamic=True`` came back
    key_mismatch on an H100 (conformance run 116): asked with ``s84``, recorded with ``s41``.
    The carrier was a view of 512 elements shaped (512, 1); Dynamo gave the view's base a
    symbol first, and duck sizing handed it to the equal-sized dimension. Carriers now hold
    memory of their own (``own_memory``). CPU Inductor does not autotune this ``mm``, so this
    compiles the one-op graph with a backend that reads the symbols Dynamo made."""
    from autotune.workers.symbolic import symbol_numbers

    request = TuningRequest(
        op="mm", inputs_key="rotary", precision="highest",
        inputs=(InputLayout((32, 1), (1, 0), 0, "torch.float32", "cpu"),
                InputLayout((1, 512), (0, 1), 0, "torch.float32", "cpu", symbolic=(1,), exprs=("s41",))),
        params={"symbols": {"s41": 512, "s77": 4}})
    graph = one_op_graph(request, "cpu")
    assert graph.dynamic is True  # distinct hints: duck sizing, as dynamic=True compiles the model
    sizes: list[tuple[object, ...]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[object]) -> torch.fx.GraphModule:
        sizes.extend(tuple(n.meta["example_value"].shape) for n in gm.graph.nodes
                     if n.op == "placeholder" and isinstance(n.meta.get("example_value"), torch.Tensor))
        return gm

    torch._dynamo.reset()
    with symbol_numbers(graph.symbol_ids):
        out = torch.compile(graph.fn, backend=backend, dynamic=graph.dynamic)(*graph.inputs)
    torch.testing.assert_close(out, graph.reference())
    assert [tuple(str(s) for s in shape) for shape in sizes] == [("32", "1"), ("s41", "1")]
