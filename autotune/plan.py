"""Planning: which captured requests still need tuning. Pure: no database, GPU or Ray."""

from __future__ import annotations

from dataclasses import dataclass, field

from cache.records import TuningRequest


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


def shape_summary(request: TuningRequest) -> str:
    """A readable one-liner such as ``mm 1024x4096 @ 4096x1024 bf16``."""
    dtype = request.inputs[0].dtype.removeprefix("torch.") if request.inputs else ""
    short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)
    dims = ["x".join(map(str, layout.sizes)) for layout in request.inputs]
    if request.op in ("mm", "bmm") and len(dims) >= 2:
        body = f"{dims[0]} @ {dims[1]}"
    elif request.op in ("addmm", "baddbmm") and len(dims) >= 3:
        body = f"{dims[1]} @ {dims[2]} + {dims[0]}"
    elif request.op == "convolution" and len(dims) >= 2:
        body = f"{dims[0]} * {dims[1]}"
    elif request.op == "packed_linear" and len(dims) >= 3:
        out_features, in_features = request.inputs[-1].sizes[:2]
        body = f"{dims[0]} @ {in_features}x{out_features}"
    else:
        body = ", ".join(dims)
    op = "conv" if request.op == "convolution" else request.op
    return f"{op} {body} {short}".strip()
