"""Fake but realistic records for tests and benchmarks (no GPU, no torch needed), and the
in-process sweep and warm start some end-to-end tests share (these import torch when called)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autotune.cache.records import (
    STATUS_OK,
    CandidateResult,
    Environment,
    InputLayout,
    Provenance,
    TuningRequest,
    TuningResult,
    digest,
)


def make_env(
    device_name: str = "NVIDIA H100 80GB HBM3",
    torch_version: str = "2.13.0+cu128",
    device_kind: str = "cuda",
    **overrides: Any,
) -> Environment:
    fields: dict[str, Any] = {
        "device_kind": device_kind,
        "device_name": device_name,
        "torch_version": torch_version,
        "triton_version": "3.5.0",
        "cuda_version": "12.8",
        "system_hash": digest("system", device_name, torch_version),
        "config_fingerprint": digest("config", "max_autotune"),
        "config": {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON"},
    }
    fields.update(overrides)
    return Environment(**fields)


def _contiguous(sizes: tuple[int, ...], dtype: str) -> InputLayout:
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= size
    return InputLayout(sizes=sizes, strides=tuple(reversed(strides)), offset=0, dtype=dtype, device="cuda")


def make_request(
    m: int = 1024,
    n: int = 1024,
    k: int = 4096,
    op: str = "mm",
    dtype: str = "torch.bfloat16",
    n_choices: int = 4,
) -> TuningRequest:
    if op == "convolution":
        inputs = (_contiguous((16, 64, m, m), dtype), _contiguous((n, 64, 3, 3), dtype))
        params: dict[str, Any] = {"stride": [1, 1], "padding": [1, 1], "groups": 1}
    elif op == "addmm":
        inputs = (_contiguous((n,), dtype), _contiguous((m, k), dtype), _contiguous((k, n), dtype))
        params = {"alpha": 1, "beta": 1}
    elif op == "bmm":
        inputs = (_contiguous((8, m, k), dtype), _contiguous((8, k, n), dtype))
        params = {}
    else:
        inputs = (_contiguous((m, k), dtype), _contiguous((k, n), dtype))
        params = {}
    inputs_key = repr([(i.sizes, i.strides, i.offset, i.dtype, i.device) for i in inputs])
    hashes = tuple(sorted(choice_hash(op, m, n, k, i) for i in range(n_choices)))
    return TuningRequest(
        op=op, inputs_key=inputs_key, precision="high", inputs=inputs, params=params, choice_hashes=hashes
    )


def choice_hash(op: str, m: int, n: int, k: int, i: int) -> str:
    return digest("choice", op, m, n, k, i)[:32]


def make_candidates(request: TuningRequest, times: list[float | None] | None = None) -> tuple[CandidateResult, ...]:
    """First candidate is ATen, the rest Triton templates; None time = failure."""
    hashes = request.choice_hashes
    times = times if times is not None else [1.0 - 0.1 * i for i in range(len(hashes))]
    cands = []
    for i, (h, t) in enumerate(zip(hashes, times)):
        aten = i == 0
        cands.append(
            CandidateResult(
                choice_hash=h,
                kind="aten" if aten else "triton",
                name=f"{request.op}" if aten else "triton_mm",
                description="" if aten else f"BLOCK_M={32 * i}, BLOCK_N=64, num_warps=4",
                template_id=None if aten else "mm",
                params={} if aten else {"BLOCK_M": 32 * i, "BLOCK_N": 64, "num_stages": 3},
                time_ms=t,
                failure_kind=None if t is not None else "compile_error",
                failure_message=None if t is not None else "ptxas error: out of registers",
            )
        )
    return tuple(cands)


def make_result(
    env: Environment | None = None,
    request: TuningRequest | None = None,
    times: list[float | None] | None = None,
    status: str = STATUS_OK,
    host: str = "worker-0",
    created_at: datetime | None = None,
    **request_kwargs: Any,
) -> TuningResult:
    env = env or make_env()
    request = request or make_request(**request_kwargs)
    cands = make_candidates(request, times)
    ok = [c for c in cands if c.time_ms is not None]
    winner = min(ok, key=lambda c: c.time_ms).choice_hash if ok and status == STATUS_OK else None
    return TuningResult(
        env=env,
        request=request,
        candidates=cands,
        winner_hash=winner,
        status=status,
        validation={"passed": True, "max_abs_err": 0.0039, "atol": 0.01, "rtol": 0.01} if winner else None,
        error=None if status == STATUS_OK else "no valid choice",
        provenance=Provenance(
            created_at=created_at or datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=timezone.utc),
            host=host,
            sweep_id="sweep-1",
            tuning_seconds=12.5,
            source="sweep",
        ),
    )


def help_without_torch(module: str, cwd: Any) -> str:
    """``python -m <module> --help``'s output, run in a fresh interpreter that then checks that
    printing the help imported no torch (a benchmark's parent process stays light)."""
    import subprocess
    import sys

    code = ("import runpy, sys\n"
            f"sys.argv = [{module.rsplit('.', 1)[-1]!r}, '--help']\n"
            "try:\n"
            f"    runpy.run_module({module!r}, run_name='__main__')\n"
            "except SystemExit:\n"
            "    pass\n"
            "assert 'torch' not in sys.modules, 'the parent imported torch'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout


def in_process_sweep(model: str, folder: Path) -> dict[str, Any]:
    """The sweep's work without Ray: capture ``model``, tune each request in this process as a
    worker tunes it, and store the results in a SQLite cache in ``folder``."""
    from autotune.cache import Store
    from autotune.inductor_glue.capture import capture_file
    from autotune.workers.entry import tune_request
    from autotune.workers.jobs import TuneJob

    captured = capture_file(model)
    results = [tune_request(TuneJob(request=r, expected_env=captured.env, mode=captured.mode,
                                    config_overrides=captured.config_overrides, device="cpu"))
               for r in captured.requests]
    url = f"sqlite:///{folder / 'cache.db'}"
    with Store(url) as store:
        store.put_results(results)
    return {"url": url, "requests": captured.requests, "results": results}


def serve_in_process(model: str, url: str) -> tuple[dict[str, Any], int, Any, Any]:
    """``model`` compiled in max-autotune under a warm start from ``url`` (``on_miss="error"``),
    in this process on fresh Inductor caches (a job in a process of its own costs another torch
    import and first-compile set-up, and proves nothing more): its hook stats, the benchmarks
    Inductor ran meanwhile, the compiled output and the eager one."""
    import torch

    import autotune
    from autotune.inductor_glue.capture import fresh_inductor
    from autotune.inductor_glue.inductor import benchmarks_run
    from autotune.inductor_glue.modelfile import load_model_file

    loaded = load_model_file(model)
    module, inputs = loaded.build(None)
    before = benchmarks_run()
    handle = autotune.warm_start(url, on_miss="error")
    try:
        with fresh_inductor(loaded.config_overrides), torch.no_grad():
            output = torch.compile(module, mode="max-autotune")(*inputs)
        stats = handle.stats.as_dict()
    finally:
        handle.uninstall()
    ran = benchmarks_run() - before
    with torch.no_grad():
        return stats, ran, output, module(*inputs)
