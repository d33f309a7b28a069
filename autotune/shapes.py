"""How a request and its timings read to a person: one-line shapes, milliseconds, speedups.

Shared by both wings and the CLI (the hook's miss lines, the sweep's summary, ``autotune cache
ls``), so it stands at the top of autotune/, beneath them all. Pure: no database, GPU or Ray.
"""

from __future__ import annotations

from autotune.cache.records import TuningRequest

_DTYPES = {
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
    "float64": "fp64", "double": "fp64", "int8": "i8", "uint8": "u8", "int32": "i32",
    "float8_e4m3fn": "fp8e4m3", "float8_e5m2": "fp8e5m2",
}
_MATMUL_OPS = {"mm", "bmm", "int_mm", "_int_mm", "scaled_mm", "mm_plus_mm"}
_BIAS_MATMUL_OPS = {"addmm", "baddbmm"}  # inputs (bias, a, b): shown as a @ b + bias


def short_dtype(dtype: str) -> str:
    name = dtype.removeprefix("torch.")
    return _DTYPES.get(name, name)


def shape_summary(request: TuningRequest) -> str:
    """A readable one-liner: ``mm 1024x4096 @ 4096x1024 bf16``, ``conv 16x64x56x56 * 64x64x3x3 bf16``."""
    shapes = ["x".join(str(s) for s in layout.sizes) or "scalar" for layout in request.inputs]
    dtypes = "/".join(dict.fromkeys(short_dtype(layout.dtype) for layout in request.inputs))
    op = request.op
    if not shapes:
        body = request.inputs_key[:60]
    elif op == "packed_linear" and len(shapes) >= 2:
        # (x, packed weight, weight[out, in]): the packed blob's shape means nothing to a reader
        out_features, in_features = request.inputs[-1].sizes[:2]
        body, dtypes = f"{shapes[0]} @ {in_features}x{out_features}", short_dtype(request.inputs[0].dtype)
    elif op in _MATMUL_OPS and len(shapes) >= 2:
        body = f"{shapes[0]} @ {shapes[1]}"
    elif op in _BIAS_MATMUL_OPS and len(shapes) >= 3:
        body = f"{shapes[1]} @ {shapes[2]} + {shapes[0]}"
    elif op.startswith("conv") and len(shapes) >= 2:
        op, body = "conv", f"{shapes[0]} * {shapes[1]}"
    else:
        body = ", ".join(shapes)
    return " ".join(part for part in (op, body, dtypes) if part)


def fmt_ms(value: float | None) -> str:
    """A time as the sweep's summary and `autotune cache ls` print it."""
    return "-" if value is None else f"{value:.4f} ms"


def fmt_speedup(value: float | None) -> str:
    """A speedup over ATen as the sweep's summary and `autotune cache ls` print it."""
    return "-" if value is None else f"{value:.2f}x"
