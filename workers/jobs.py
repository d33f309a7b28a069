"""A tuning job and the result of one that never finished: plain data, no torch.

The Ray actor and the sweep driver handle jobs and results without compiling
anything; keeping these here spares their processes importing torch and
Inductor, which adds seconds to each actor's first job.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from autotune.cache.records import STATUS_FAILED, Environment, Provenance, TuningRequest, TuningResult


@dataclass(frozen=True)
class TuneJob:
    """Everything a worker needs to tune one request: plain data, shipped as JSON."""

    request: TuningRequest
    expected_env: Environment | None
    mode: str = "max-autotune"
    config_overrides: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    sweep_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "request": self.request.to_json(),
            "expected_env": self.expected_env.to_json() if self.expected_env else None,
            "mode": self.mode,
            "config_overrides": self.config_overrides,
            "device": self.device,
            "sweep_id": self.sweep_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TuneJob:
        env = data.get("expected_env")
        return cls(
            request=TuningRequest.from_json(data["request"]),
            expected_env=Environment.from_json(env) if env else None,
            mode=data.get("mode", "max-autotune"),
            config_overrides=dict(data.get("config_overrides") or {}),
            device=data.get("device", "cpu"),
            sweep_id=data.get("sweep_id"),
        )


def failed_result(job: TuneJob, reason: str, kind: str, seconds: float) -> TuningResult:
    """A request that never produced a result (its process died or hung)."""
    env = job.expected_env or Environment("unknown", "unknown", "", None, None, "", "")
    return TuningResult(
        env=env,
        request=job.request,
        candidates=(),
        winner_hash=None,
        status=STATUS_FAILED,
        error=f"{kind}: {reason}",
        provenance=Provenance(host=socket.gethostname(), sweep_id=job.sweep_id,
                              tuning_seconds=seconds, source="sweep"),
    )
