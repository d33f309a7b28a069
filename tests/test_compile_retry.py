"""A graph whose compile with the cache's kernels fails is compiled again with ATen's for its GEMMs
(autotune/job/compile_retry.py): the job runs, with one warning, instead of failing because of the cache.

The failure is a real one: on a CPU (torch 2.13) the C++ GEMM template that wins the zoo DLRM
training step's backward bmm in isolation fails in the step's graph, where an epilogue is fused
into it. On a torch where it does not fail, nothing is retried and the test says so.

Tuned alone, the template wins those bmms by about 5x. CI once skipped this test all the same:
the graph compiled without failing, most likely because ATen's kernel came out ahead when timed
on the busy 2-core host. So the stored results keep the template as the winner wherever it was
a candidate. Every time stored is one the worker measured, except the template's, which is
lowered to half the fastest of the others only when it did not win."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import torch

import autotune
from autotune.cache import Store
from autotune.cache.records import TuningResult
from autotune.inductor_glue.capture import capture_model, fresh_inductor
from autotune.inductor_glue.modelfile import load_model_file
from autotune.workers.entry import tune_request
from autotune.workers.jobs import TuneJob
from benchmarks import zoo


def _step(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], compiled: bool) -> list[torch.Tensor]:
    """One forward and backward of the training step: the gradients."""
    module.zero_grad()
    run = torch.compile(module, mode="max-autotune") if compiled else module
    loss = run(*inputs)
    loss.backward()
    return [p.grad.clone() for p in module.parameters() if p.grad is not None]


def _template_wins(result: TuningResult) -> TuningResult:
    """``result`` with its C++ template candidate, if it timed one, made the fastest."""
    template = next((c for c in result.candidates if c.kind == "cpp" and c.ok), None)
    times = [c.time_ms for c in result.candidates if c.ok and c is not template]
    if template is None or not times:
        return result
    faster = dataclasses.replace(template, time_ms=min(template.time_ms or 0.0, min(times) / 2))
    candidates = tuple(faster if c is template else c for c in result.candidates)
    return dataclasses.replace(result, candidates=candidates, winner_hash=template.choice_hash)


def test_a_graph_that_fails_with_served_kernels_compiles_again_with_aten(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    stub = zoo.write_stub("dlrm", "train", tmp_path)
    model = load_model_file(stub)
    captured = capture_model(model, device="cpu", train=True)
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    with Store(url) as store:
        store.put_results([_template_wins(tune_request(TuneJob(request=r, expected_env=captured.env, mode=captured.mode,
                                                               config_overrides=captured.config_overrides, device="cpu")))
                           for r in captured.requests])
    module, inputs = model.build(None)
    expected = _step(module, inputs, compiled=False)
    handle = autotune.warm_start(url, on_miss="aten")
    try:
        with fresh_inductor(model.config_overrides), caplog.at_level(logging.WARNING, logger="autotune"):
            grads = _step(module, inputs, compiled=True)
        stats = handle.stats
    finally:
        handle.uninstall()
    assert all(torch.allclose(g, e, rtol=1e-3, atol=1e-3) for g, e in zip(grads, expected))
    if stats.compiles_retried == 0:
        pytest.skip(f"torch {torch.__version__} compiled the served template without failing: nothing to retry")
    assert stats.hits >= 1 and stats.compiles_retried == 1
    assert sum("compiling it again with ATen" in r.getMessage() for r in caplog.records) == 1
