"""Capture on CPU: a real dry-run Inductor compile (freezing on) lists every request."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.inductor_glue.capture import Session, capture_file, compile_sessions
from autotune.inductor_glue.inductor import benchmark_count
from autotune.inductor_glue.modelfile import ModelFileError, load_model_file, module_name_for, parse_config_overrides

MODELS = Path(__file__).parent / "models"
TINY = str(MODELS / "tiny_mlp.py")


def test_capture_lists_each_linear_once_and_benchmarks_nothing() -> None:
    before = benchmark_count()
    result = capture_file(TINY)
    assert benchmark_count() == before  # dry run: nothing compiled or timed
    assert [r.op for r in result.requests] == ["packed_linear", "packed_linear"]
    assert result.env is not None and result.env.device_kind == "cpu"
    assert result.config_overrides.get("freezing") is True  # set by the model file at import
    for request in result.requests:
        assert len(request.choice_hashes) == 2  # MKL (ATen) and a C++ GEMM template
        assert request.inputs[0].sizes == (8, request.inputs[-1].sizes[1])


def test_capture_merges_identical_requests() -> None:
    result = capture_file(TINY, entry="repeated")
    assert result.total_lookups == 3
    assert len(result.requests) == 1


def test_capture_keeps_two_kernels_asked_under_one_inputs_key_apart() -> None:
    """A fused GELU and a plain Linear of one shape share Inductor's (op, inputs_key): the
    zoo's MLP-Mixer under dynamic=True stored one and missed the other at every warm start."""
    result = capture_file(TINY, entry="same_shape_variants", dynamic=True)
    assert result.total_lookups == 4  # two per compile: the marked graph's and dynamic=True's
    assert sorted(r.params["aten"]["attr"] for r in result.requests) == ["gelu", "none"]
    assert len({r.inputs_key for r in result.requests}) == 1 and len({r.key for r in result.requests}) == 2
    for request in result.requests:  # each keeps only its own candidates
        assert len(request.choice_hashes) == 2


@pytest.mark.slow
@pytest.mark.parametrize(("entry", "ops"), [("same_shape_variants", ["linear_unary", "linear_unary"]),
                                           ("residual", ["linear_binary"]),
                                           ("activations", ["linear_unary"] * 5)])
def test_a_worker_tunes_each_fused_linear_under_its_own_key(entry: str, ops: list[str]) -> None:
    """A fused GELU is reproduced as Linear + GELU, a fused residual add as Linear + add of
    another tensor (the zoo's MLP-Mixer asked for both under dynamic=True and missed them),
    a fused SiLU as Linear + SiLU (the zoo's Llama did), and so on; each tuned result
    carries the captured key and all its candidates."""
    from autotune.workers.entry import tune_request
    from autotune.workers.jobs import TuneJob

    captured = capture_file(TINY, entry=entry, dynamic=True)
    assert [r.op for r in captured.requests] == ops
    for request in captured.requests:
        result = tune_request(TuneJob(request=request, expected_env=captured.env, mode=captured.mode,
                                      config_overrides=captured.config_overrides, device="cpu"))
        assert (result.status, result.request.key) == ("ok", request.key), (request.params["aten"], result.error)


def test_capture_and_the_pass_compile_the_graphs_a_job_compiles_in_every_dynamic_mode() -> None:
    # Static sizes: the first size's model is called on the next (the automatic-dynamic
    # recompile), then the next size alone (its static graph).
    assert compile_sessions((8, 16), dynamic=False) == [Session((8, 16)), Session((16,))]
    assert compile_sessions((8,), dynamic=False) == [Session((8,))]
    # --dynamic: the marked graph and dynamic=True's, whose other dimensions are symbolic too.
    assert compile_sessions((8, 16), dynamic=True) == [
        Session((8,), "marked"), Session((16,), "marked"), Session((8,), "all"), Session((16,), "all")]


def test_capture_each_batch_size_and_the_dynamic_recompile_between_them() -> None:
    result = capture_file(TINY, batch_sizes=(1, 8))
    static = [r for r in result.requests if not any(i.symbolic for i in r.inputs)]
    dynamic = [r for r in result.requests if any(i.symbolic for i in r.inputs)]
    assert len(static) == 4 and sorted({r.inputs[0].sizes[0] for r in static}) == [1, 8]
    # A job calling the model at batch 1, then 8, recompiles it with a dynamic batch (hint 8).
    assert len(dynamic) == 2 and {(r.inputs[0].sizes[0], r.inputs[0].symbolic) for r in dynamic} == {(8, (0,))}


@pytest.mark.parametrize(
    ("model", "entry", "needle"),
    [("missing.py", "example", "no such file"), ("broken_import.py", "example", "failed to import"),
     ("no_entry.py", "example", "defines no function example()"),
     ("wrong_return.py", "example", "must return (module, example_inputs_tuple)")],
)
def test_model_file_contract_errors_are_one_line(model: str, entry: str, needle: str) -> None:
    with pytest.raises(ModelFileError) as error:
        load_model_file(MODELS / model, entry).build(None)
    assert needle in str(error.value) and "\n" not in str(error.value)


_DIMS_MODEL = """
import torch
DYNAMIC_DIMS = {dims}
def example(batch_size=None):
    return torch.nn.Linear(4, 4), (torch.randn(batch_size or 2, 3, 4), 0.5)
"""


@pytest.mark.parametrize(
    ("dims", "needle"),
    [("{2: (0,)}", "names input 2, but the example has 2 input(s)"),
     ("{1: (0,)}", "names input 1, which is a float, not a tensor"),
     ("{0: (0, 3)}", "names dimension 3, but input 0 has 3 (shape (2, 3, 4))"),
     ("{0: (-4,)}", "names dimension -4"),
     ("[0, 1]", "must be a dict from an example input's position"),
     ("{'x': (0,)}", "must map an input position (int) to an int or a tuple of ints"),
     ("{0: (0.5,)}", "must map an input position (int) to an int or a tuple of ints")],
)
def test_dynamic_dims_errors_are_one_line_with_the_fix(tmp_path: Path, dims: str, needle: str) -> None:
    path = tmp_path / "model.py"
    path.write_text(_DIMS_MODEL.format(dims=dims))
    with pytest.raises(ModelFileError) as error:
        load_model_file(path).build(None)
    message = str(error.value)
    assert needle in message and "DYNAMIC_DIMS" in message and ";" in message and "\n" not in message, message


def test_dynamic_dims_name_what_dynamic_marks(tmp_path: Path) -> None:
    """An int is one dimension, negatives count from the end; without DYNAMIC_DIMS, dim 0 of each tensor."""
    path = tmp_path / "model.py"
    path.write_text(_DIMS_MODEL.format(dims="{0: (1, -1)}"))
    model = load_model_file(path)
    _, inputs = model.build(None)
    assert model.marked_dims(inputs) == {0: (1, 2)}
    path.write_text(_DIMS_MODEL.format(dims="{0: 1}"))
    assert load_model_file(path).marked_dims(inputs) == {0: (1,)}
    path.write_text(_DIMS_MODEL.format(dims="None"))
    assert load_model_file(path).marked_dims(inputs) == {0: (0,)}


def test_inductor_config_overrides_are_typed_and_checked() -> None:
    assert parse_config_overrides(["freezing=1", "max_autotune_gemm_backends=ATEN"]) == {
        "freezing": True, "max_autotune_gemm_backends": "ATEN"}
    with pytest.raises(ModelFileError, match="not an option"):
        parse_config_overrides(["no_such_option=1"])


def test_a_model_file_is_imported_under_its_stem_as_a_training_script_imports_it(tmp_path: Path) -> None:
    # Dynamo's package names the model's module: the sweep and the job must agree on it.
    source = "import torch\n\ndef example(batch_size=None):\n    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)\n"
    for name in ("my_model", "json", "my-model"):
        (tmp_path / f"{name}.py").write_text(source)
    model = load_model_file(tmp_path / "my_model.py")
    assert model.factory.__module__ == "my_model"
    assert module_name_for(tmp_path / "json.py").startswith("autotune_model_")  # the standard library's json
    assert module_name_for(tmp_path / "my-model.py").startswith("autotune_model_")  # no importable name


def test_remote_capture_finds_what_a_local_capture_finds_and_files_no_padding_on_a_cpu() -> None:
    # The Ray task a GPU-less sweep host sends to a GPU node (called here without Ray): the
    # model file travels as text. On a CPU Inductor times no padding, so nothing is filed.
    from autotune.cache.records import TuningRequest
    from autotune.workers.actor import remote_capture

    local = capture_file(TINY)
    data = remote_capture(Path(TINY).read_text(), Path(TINY).name, {"device": "cpu"})
    assert [TuningRequest.from_json(r).key for r in data["requests"]] == [r.key for r in local.requests]
    assert (data["pad_decisions"], data["pad_env"]) == ({}, None)


def test_capture_describes_a_matmul_precision_set_per_backend() -> None:
    """torch 2.15's API sets the float32 matmul precision per backend, after which
    torch.get_float32_matmul_precision() raises; its selector keys timings by the per-backend
    settings, and a capture (and a job) describes its requests by them too."""
    import torch

    from autotune.inductor_glue import seams

    if seams.FP32_PRECISION_KEY.problem() is not None:
        pytest.skip("this torch's own selector reads the one precision setting, which raises once it is set "
                    "per backend (torch 2.15's reads them per backend)")
    before = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        expected = seams.FP32_PRECISION_KEY.resolve()()
        result = capture_file(TINY)
    finally:
        torch.backends.cuda.matmul.fp32_precision = before
    assert [r.op for r in result.requests] == ["packed_linear", "packed_linear"]
    assert "tf32" in expected and all(r.precision == expected for r in result.requests)
