"""Symbolic sizes that are no product of symbols: parsed, rebuilt in the one-op graph,
tuned and served (workers/size_exprs.py, README's dynamic shapes).

A patch embedding under dynamic height and width asks with M = ``s77*((s53//4))**2``
(``dynamic=True``: a square image's sides share one symbol) or ``s77*((s0//4))*((s53//4))``
(``mark_dynamic``: one each); a sliced sequence with ``s77*(s27 - 1)``. The end-to-end
tests share one sweep of tests/models/tiny_patches.py, so they run on one xdist worker.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import dynamic_sweep
from test_hook import job

from autotune.cache import Store
from autotune.cache.records import InputLayout
from autotune.workers.size_exprs import UnsupportedExpression, evaluate, flat_carrier_for, parse

pytestmark = pytest.mark.xdist_group("tiny_patches")
PATCHES = str(Path(__file__).parent / "models" / "tiny_patches.py")


def test_an_expression_evaluates_as_python_would() -> None:
    hints = {"s77": 2, "s53": 16, "s27": 16}
    assert evaluate(parse("s77*((s53//4))**2"), hints) == 2 * (16 // 4) ** 2
    assert evaluate(parse("s77*(s27 - 1)"), hints) == 30
    assert evaluate(parse("-s27 + 3*(s53 % 5)"), hints) == -16 + 3


def test_a_power_is_rebuilt_as_a_product() -> None:
    """sympy prints a repeated factor as a power; a SymInt's ** would build another function."""
    assert parse("((s53//4))**2") == ("mul", ("floordiv", "s53", 4), ("floordiv", "s53", 4))


@pytest.mark.parametrize("expr", ["Max(s0, 4)", "s0/4", "s0**s1", "s0 if s1 else 2", "s0 +"])
def test_anything_else_is_refused(expr: str) -> None:
    with pytest.raises(UnsupportedExpression):
        parse(expr)


def _layout(sizes: tuple[int, ...], strides: tuple[int, ...], exprs: dict[int, str]) -> InputLayout:
    return InputLayout(sizes=sizes, strides=strides, offset=0, dtype="torch.float32", device="cpu",
                       symbolic=tuple(exprs), exprs=tuple(exprs.values()))


def test_a_product_with_a_sum_is_merged_by_minus_one() -> None:
    """Inductor expands every size a view is given (s77*(s27 - 1) -> s27*s77 - s77), and keeps
    the quotient it computes for -1 as it is: the carrier asks for -1 there, and only there."""
    hints = {"s77": 2, "s27": 16}
    carrier = flat_carrier_for(torch.empty(30, 32), _layout((30, 32), (32, 1), {0: "s77*(s27 - 1)"}), hints)
    assert carrier is not None
    assert carrier.split == ("s77", ("sub", "s27", 1), 32) and carrier.merged == (None, 32)
    patches = flat_carrier_for(torch.empty(32, 16), _layout((32, 16), (16, 1), {0: "s77*((s53//4))**2"}),
                               {"s77": 2, "s53": 16})
    assert patches is not None and None not in patches.merged


def test_a_carrier_refuses_what_it_cannot_rebuild() -> None:
    hints = {"s77": 2, "s27": 16}
    two_sums = _layout((30, 30), (30, 1), {0: "s77*(s27 - 1)", 1: "s77*(s27 - 1)"})
    assert flat_carrier_for(torch.empty(30, 30), two_sums, hints) is None  # one -1 per view
    wrong_size = _layout((31, 32), (32, 1), {0: "s77*(s27 - 1)"})
    assert flat_carrier_for(torch.empty(31, 32), wrong_size, hints) is None
    unknown = _layout((30, 32), (32, 1), {0: "s99*(s27 - 1)"})
    assert flat_carrier_for(torch.empty(30, 32), unknown, hints) is None
    strided = torch.empty(30, 64)[:, :32]
    assert flat_carrier_for(strided, _layout((30, 32), (64, 1), {0: "s77*(s27 - 1)"}), hints) is None


def test_only_named_dimensions_of_one_size_need_a_second_capture() -> None:
    """dynamic=True and mark_dynamic compile one graph unless two named dimensions share a
    size (sizes 0 and 1 are never symbols, so they never share one)."""
    from autotune.inductor_glue.capture import duck_differs

    image, tokens = torch.empty(2, 3, 16, 16), torch.empty(2, 16)
    assert duck_differs((image,), {0: (0, 2, 3)})
    assert not duck_differs((image,), {0: (0, 2)})
    assert duck_differs((image, tokens), {0: (0,), 1: (1,)}) is False
    assert duck_differs((image, tokens), {0: (2,), 1: (1,)})  # 16 and 16, in two inputs
    assert not duck_differs((torch.empty(1, 1, 5),), {0: (0, 1, 2)})


_SLICED = """
import torch
import torch._inductor.config
torch._inductor.config.freezing = True
DYNAMIC_DIMS = {0: (0, 1)}
def example(batch_size=None):
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 16).eval()
    return (lambda x: linear(x[:, 1:])), (torch.randn(batch_size or 2, 16, 32),)
"""


@pytest.mark.slow
def test_a_sliced_sequence_is_reproduced_from_its_expression(tmp_path: Path) -> None:
    """A sliced sequence gives M = s77*(s27 - 1), which no input dimension can carry; the
    worker rebuilds it from s77 and s27 and tunes it under the model's key (it was a
    key_mismatch, a documented limit, before)."""
    from autotune.inductor_glue.capture import capture_file
    from autotune.workers.entry import tune_request
    from autotune.workers.jobs import TuneJob

    path = tmp_path / "sliced.py"
    path.write_text(_SLICED)
    captured = capture_file(str(path), dynamic=True)
    (request,) = captured.requests
    assert request.inputs[0].exprs == ("s77*(s27 - 1)",)
    result = tune_request(TuneJob(request=request, expected_env=captured.env, mode=captured.mode,
                                  config_overrides=captured.config_overrides, device="cpu"))
    assert result.status == "ok", result.error
    assert len(result.candidates) == 2  # MKL and the C++ GEMM template, both timed


@pytest.fixture(scope="module")
def swept_patches(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`autotune sweep tiny_patches.py --dynamic`: batch, height and width symbolic."""
    return dynamic_sweep(PATCHES, tmp_path_factory.mktemp("patches"))


@pytest.mark.slow
def test_the_dynamic_sweep_captures_both_ways_a_square_image_is_made_dynamic(swept_patches: str) -> None:
    """Height and width have one size (16), so dynamic=True and mark_dynamic compile different
    graphs: the sweep captures and tunes both, each under the model's own expression."""
    with Store(swept_patches, read_only=True) as store:
        results = [r for _, r in store.list_results()]
    assert all(r.status == "ok" for r in results), [(r.status, r.error) for r in results]
    exprs = {r.request.inputs[0].exprs for r in results}
    assert exprs == {("s77*((s53//4))**2",), ("s77*((s0//4))*((s53//4))",)}, exprs


def _served(report: dict) -> tuple[int, int, int, int]:  # type: ignore[type-arg]
    return (report["stats"]["hits"], report["stats"]["misses"], report["benchmarks"], report["frames_compiled"])


@pytest.mark.slow
def test_dynamic_true_on_images_is_served_without_benchmarking(swept_patches: str, tmp_path: Path) -> None:
    """dynamic=True at 16x16, then 24x24 images on the same graph: no recompile, no benchmark."""
    report = job(tmp_path, "--cache", swept_patches, "--model", "tiny_patches", "--dynamic",
                 "--next-image-size", "24")
    assert _served(report) == (2, 0, 0, 1), report["stats"]
    torch.testing.assert_close(torch.load(report["output"]), torch.load(report["eager_output"]),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_mark_dynamic_on_images_is_served_without_benchmarking(swept_patches: str, tmp_path: Path) -> None:
    report = job(tmp_path, "--cache", swept_patches, "--model", "tiny_patches", "--mark-dynamic")
    assert _served(report) == (2, 0, 0, 1), report["stats"]
