"""Records -> rows: pure conversions and small helpers shared by the store's mixins (rows ->
records, each row checked, are in ``_reading``)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import func, select

from autotune.cache.models import environments as E
from autotune.cache.records import (
    CandidateResult,
    Environment,
    TuningRequest,
    TuningResult,
    utcnow,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

BATCH = 500  # results per write transaction / ids per IN (...) list


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def env_filter(torch_version: str | None, device: str | None) -> sa.Select[Any] | None:
    """Ids of environments matching the filters, or None when there is no filter."""
    where = []
    if torch_version:
        where.append(E.c.torch_version == torch_version)
    if device:
        needle = device.lower()
        where.append(
            sa.or_(
                func.lower(E.c.device_name).contains(needle, autoescape=True),
                func.lower(E.c.device_kind) == needle,
            )
        )
    return select(E.c.id).where(*where) if where else None


def json_safe(value: Any, where: str) -> Any:
    """JSON data only: reject other objects, and store non-finite floats as null
    (PostgreSQL's json type has no NaN or Infinity)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        log.warning("cache stores non-finite %s=%r as null", where, value)
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"{where} is a {type(value).__name__}; the cache stores JSON data only")


def finite_or_none(value: float | None, where: str) -> float | None:
    """A spread to store: a finite number >= 0, else null (a reader would refuse the row)."""
    if value is None or (math.isfinite(value) and value >= 0):
        return value
    log.warning("cache stores %s=%r as null", where, value)
    return None


def dedupe(candidates: Sequence[CandidateResult]) -> list[CandidateResult]:
    seen: dict[str, CandidateResult] = {}
    for cand in candidates:
        if cand.choice_hash in seen:
            log.warning("duplicate candidate %s in one result; keeping the first", cand.choice_hash)
            continue
        seen[cand.choice_hash] = cand
    return list(seen.values())


def same(a: TuningResult, b: TuningResult) -> bool:
    """Equal including the fields dataclass equality ignores (params, config)."""
    return (
        a == b
        and a.request.params == b.request.params
        and [c.params for c in a.candidates] == [c.params for c in b.candidates]
    )


def env_values(env: Environment) -> dict[str, Any]:
    return {
        "key": env.key,
        "device_kind": env.device_kind,
        "device_name": env.device_name,
        "torch_version": env.torch_version,
        "triton_version": env.triton_version,
        "cuda_version": env.cuda_version,
        "system_hash": env.system_hash,
        "config_fingerprint": env.config_fingerprint,
        "config": json_safe(env.config, "env.config"),
        "created_at": utcnow(),
    }


def request_values(request: TuningRequest) -> dict[str, Any]:
    return {
        "key": request.key,
        "op": request.op,
        "inputs_key": request.inputs_key,
        "precision": request.precision,
        "inputs": [layout.to_json() for layout in request.inputs],
        "params": json_safe(request.params, "request.params"),
        "choice_hashes": list(request.choice_hashes),
    }


def result_values(result: TuningResult, env_id: int, now: datetime) -> dict[str, Any]:
    prov = result.provenance
    return {
        **request_values(result.request),
        "env_id": env_id,
        "status": result.status,
        "winner_hash": result.winner_hash,
        "validation": json_safe(result.validation, "validation"),
        "error": result.error,
        "created_at": prov.created_at,
        "updated_at": now,
        "host": prov.host,
        "sweep_id": prov.sweep_id,
        "tuning_seconds": prov.tuning_seconds,
        "source": prov.source,
        "winner_spread": finite_or_none(result.winner_spread, "winner_spread"),
        "fallback_reason": result.fallback_reason,
        "search": prov.search,
    }


def candidate_values(cand: CandidateResult, position: int, request_id: int) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "position": position,
        "choice_hash": cand.choice_hash,
        "kind": cand.kind,
        "name": cand.name,
        "description": cand.description,
        "template_id": cand.template_id,
        "params": json_safe(cand.params, f"candidate {cand.name} params"),
        "time_ms": cand.time_ms,
        "failure_kind": cand.failure_kind,
        "failure_message": cand.failure_message,
        "spread": finite_or_none(cand.spread, f"candidate {cand.name} spread"),
        "repeats": cand.repeats,
    }
