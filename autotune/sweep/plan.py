"""Planning: which captured requests still need tuning. Pure: no database, GPU or Ray."""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.cache.records import TuningRequest


@dataclass
class Plan:
    to_tune: list[TuningRequest] = field(default_factory=list)
    cached: list[TuningRequest] = field(default_factory=list)

    @property
    def found(self) -> int:
        return len(self.to_tune) + len(self.cached)


def dedupe(requests: list[TuningRequest]) -> list[TuningRequest]:
    """Merge identical requests (same op, inputs_key, precision), keeping first-seen order."""
    merged: dict[str, TuningRequest] = {}
    for request in requests:
        seen = merged.get(request.key)
        if seen is None:
            merged[request.key] = request
        elif set(request.choice_hashes) - set(seen.choice_hashes):
            hashes = tuple(sorted(set(seen.choice_hashes) | set(request.choice_hashes)))
            merged[request.key] = TuningRequest(seen.op, seen.inputs_key, seen.precision,
                                                seen.inputs, seen.params, hashes)
    return list(merged.values())


def make_plan(requests: list[TuningRequest], cached_keys: set[str], force: bool = False) -> Plan:
    """Split requests into those to tune and those the cache already answers."""
    plan = Plan()
    for request in dedupe(requests):
        if not force and request.key in cached_keys:
            plan.cached.append(request)
        else:
            plan.to_tune.append(request)
    return plan


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


TUNE = "tune"
CACHED = "cached"


@dataclass
class PlanStream:
    """The plan made one request at a time, as capture finds them, across models.

    Requests are the same when their environment (device, versions, Inductor config)
    and their key (op, inputs, precision) are: the union of several models' requests
    is tuned once.
    """

    force: bool = False
    seen: dict[tuple[str, str], TuningRequest] = field(default_factory=dict)

    def add(self, request: TuningRequest, env_key: str, cached_keys: set[str]) -> str | None:
        """TUNE, CACHED, or None for a request seen before."""
        key = (env_key, request.key)
        if key in self.seen:
            return None
        self.seen[key] = request
        return CACHED if request.key in cached_keys and not self.force else TUNE


def fmt_ms(value: float | None) -> str:
    """A time as the sweep's summary and `autotune cache ls` print it."""
    return "-" if value is None else f"{value:.4f} ms"


def fmt_speedup(value: float | None) -> str:
    """A speedup over ATen as the sweep's summary and `autotune cache ls` print it."""
    return "-" if value is None else f"{value:.2f}x"
