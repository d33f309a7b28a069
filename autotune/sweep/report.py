"""What a sweep is asked and what it returns: its options, each request's outcome, the report,
and the progress interface the CLI implements (autotune/sweep/view.py). Plain data: no torch,
no Ray, no database."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from autotune.cache.records import STATUS_OK, Environment, TuningRequest, TuningResult
from autotune.inductor_glue.distributed import DistributedSpec
from autotune.shapes import shape_summary

from .cost import cost_json

if TYPE_CHECKING:  # the pass's report: end_to_end.py imports torch's side of the pass
    from .end_to_end import EndToEndReport

log = logging.getLogger(__name__)

STATUS_CACHED = "cached"
# Never started: the cache refused a write, so the sweep stopped (see SweepReport.store_error).
STATUS_NOT_RUN = "not_run"
STATUS_ELSEWHERE = "elsewhere"  # tuned by another sweep on the same database meanwhile


@dataclass
class SweepOptions:
    model_path: str | None
    entry: str = "example"
    batch_sizes: tuple[int | None, ...] = (None,)
    dynamic: bool = False  # DYNAMIC_DIMS (default: the batch dimension) dynamic from the first call (inductor_glue.capture)
    inductor_config: tuple[str, ...] = ()
    train: bool = False
    force: bool = False
    dry_run: bool = False
    misses: bool = False
    more_models: tuple[str, ...] = ()  # further model files: one queue, their union tuned once
    # --ddp/--fsdp: capture and the pass compile as one rank of that job (inductor_glue/distributed.py)
    distributed: DistributedSpec | None = None

    @property
    def model_paths(self) -> list[str]:
        paths = ([self.model_path] if self.model_path else []) + list(self.more_models)
        return list(dict.fromkeys(paths))


@dataclass
class ModelCapture:
    """One model's part of a sweep: how many requests its capture found."""

    path: str
    requests: int = 0  # unique within this model
    new: int = 0  # not found by an earlier model of the sweep
    lookups: int = 0
    seconds: float = 0.0
    reused_from: str | None = None  # when the stored capture this sweep replayed was made (capture_reuse)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "requests": self.requests, "new": self.new, "lookups": self.lookups,
                "seconds": round(self.seconds, 3), "reused_from": self.reused_from}


@dataclass
class Outcome:
    """One request's row in the closing table."""

    request: TuningRequest
    status: str  # "cached", "elsewhere", "planned", "not_run", or a TuningResult status
    result: TuningResult | None = None
    node: str | None = None  # the Ray node that tuned it
    stored: bool = True  # False: tuned, but the cache refused to keep it
    model: str | None = None  # the first model file whose capture found it (None: a logged miss)

    def to_json(self) -> dict[str, Any]:
        winner = self.result.winner if self.result else None
        return {
            "op": self.request.op,
            "shapes": shape_summary(self.request),
            "request_key": self.request.key,
            "status": self.status,
            "winner": winner.name if winner else None,
            "winner_params": winner.params if winner else None,
            "winner_ms": winner.time_ms if winner else None,
            "aten_ms": self.result.aten_time_ms if self.result else None,
            "speedup_over_aten": self.result.speedup_over_aten if self.result else None,
            "candidates": len(self.result.candidates) if self.result else None,
            "error": self.result.error if self.result else None,
            "tuning_seconds": self.result.provenance.tuning_seconds if self.result else None,
            "node": self.node,
            "stored": self.stored,
            "model": self.model,
        }


@dataclass
class SweepReport:
    sweep_id: str
    env: Environment | None
    device: str
    outcomes: list[Outcome] = field(default_factory=list)
    capture_seconds: float = 0.0
    wall_seconds: float = 0.0
    # From the sweep's start until Ray, the actors and their warm children were ready
    # (0.0 when nothing was tuned); it overlaps the capture.
    startup_seconds: float = 0.0
    # From the pool being ready until the last GEMM result arrived.
    tuning_seconds: float = 0.0
    dry_run: bool = False
    pointwise: EndToEndReport | None = None  # GPU sweeps: the pointwise/reduction pass
    models: list[ModelCapture] = field(default_factory=list)
    requeued: int = 0  # jobs started again after their worker was lost (its node died)
    adopted: int = 0  # lanes that took a spare tuning process started before Ray (workers/spares.py)
    # The cache's one-line error when it refused to store a result; the sweep stopped there.
    store_error: str | None = None
    # One line per stored row the sweep read and left out, as it failed validation (--misses).
    malformed_rows: list[str] = field(default_factory=list)
    # Seconds from the sweep's start to each of its milestones, in order (profiling the serial part).
    timeline: dict[str, float] = field(default_factory=dict)

    def mark(self, milestone: str, seconds: float | None) -> None:
        if seconds is not None and milestone not in self.timeline:
            self.timeline[milestone] = round(seconds, 3)

    def count(self, *statuses: str) -> int:
        return sum(1 for o in self.outcomes if o.status in statuses)

    @property
    def found(self) -> int:
        return len(self.outcomes)

    @property
    def cached(self) -> int:
        return self.count(STATUS_CACHED)

    @property
    def tuned(self) -> int:
        return self.count(STATUS_OK)

    @property
    def elsewhere(self) -> int:
        return self.count(STATUS_ELSEWHERE)

    @property
    def captured(self) -> int:
        """Requests over every model before de-duplication (the union is ``found``)."""
        return sum(m.requests for m in self.models)

    @property
    def failed(self) -> int:
        """Requests whose tuning failed (not those left undone because the cache refused writes)."""
        return self.found - self.cached - self.tuned - self.elsewhere - self.count("planned", STATUS_NOT_RUN)

    @property
    def not_stored(self) -> int:
        """Requests tuned (or failed) whose result the cache refused to keep."""
        return sum(1 for o in self.outcomes if not o.stored)

    @property
    def not_run(self) -> int:
        return self.count(STATUS_NOT_RUN)

    @property
    def stored(self) -> int:
        """Results written to the cache by this sweep."""
        return sum(1 for o in self.outcomes if o.stored and o.result is not None)

    def timed_busy(self) -> list[TuningResult]:
        """The results this sweep's workers timed on a busy host (workers/noise.py)."""
        return [o.result for o in self.outcomes if o.result is not None and _timed_busy(o.result)]

    def busy_line(self) -> str | None:
        """One line where the host was busy while candidates were timed: how many of those
        requests stored ATen for it (their results are timed again by a sweep on a quiet host)."""
        busy = self.timed_busy()
        if not busy:
            return None
        fell_back = sum(1 for r in busy if r.fallback_reason is not None)
        loads = [r.validation["timing"].get("others_per_core") for r in busy if r.validation]
        load = max((x for x in loads if isinstance(x, (int, float))), default=None)
        beside = f" ({load:.1f} other ready threads per core)" if load is not None else ""
        return (f"busy host{beside}: {len(busy)} request(s) timed under load, {fell_back} fell back to ATen "
                "for it; a sweep on a quiet host times them again")

    def refused(self) -> dict[str, int]:
        """Candidates this sweep's workers could not time, by reason (out_of_resources,
        compile_error, ...): data, counted, never printed one by one."""
        counts: dict[str, int] = {}
        for outcome in self.outcomes:
            for candidate in outcome.result.candidates if outcome.result else ():
                if candidate.time_ms is None:
                    reason = candidate.failure_kind or "benchmark_error"
                    counts[reason] = counts.get(reason, 0) + 1
        return dict(sorted(counts.items(), key=lambda item: -item[1]))

    def to_json(self) -> dict[str, Any]:
        return {
            "sweep_id": self.sweep_id,
            "device": self.device,
            "device_name": self.env.device_name if self.env else None,
            "environment": self.env.to_json() if self.env else None,
            "dry_run": self.dry_run,
            "totals": {
                "found": self.found,
                "cached": self.cached,
                "tuned": self.tuned,
                "failed": self.failed,
                "stored": self.stored,
                "not_stored": self.not_stored,
                "not_run": self.not_run,
                "elsewhere": self.elsewhere,
                "requeued": self.requeued,
                "spares_adopted": self.adopted,
                "captured": self.captured,
                "deduplicated": self.found,
                "capture_seconds": round(self.capture_seconds, 3),
                "startup_seconds": round(self.startup_seconds, 3),
                "tuning_seconds": round(self.tuning_seconds, 3),
                "wall_seconds": round(self.wall_seconds, 3),
                "candidates_refused": self.refused(),
                "timed_busy": len(self.timed_busy()),
                "fell_back_to_aten": sum(1 for o in self.outcomes if o.result and o.result.fallback_reason),
            },
            "cost": cost_json(self),
            "pointwise": self.pointwise.to_json() if self.pointwise else None,
            "store_error": self.store_error,
            "malformed_rows": self.malformed_rows,
            "timeline": dict(sorted(self.timeline.items(), key=lambda item: item[1])),
            "models": [m.to_json() for m in self.models],
            "requests": [o.to_json() for o in self.outcomes],
        }


def _timed_busy(result: TuningResult) -> bool:
    timing = (result.validation or {}).get("timing")
    return isinstance(timing, dict) and timing.get("busy") is True


class Progress(Protocol):
    """What the sweep reports as it goes (the CLI shows it; autotune/sweep/view.py)."""

    def stage(self, message: str) -> None:
        """A phase begins: start-up, a model's capture, waiting for the workers."""

    def start(self, total: int, description: str) -> None:
        """A phase of ``total`` steps begins: the tuning, the end-to-end passes."""

    def advance(self, done: Outcome | str) -> None:
        """One step of it is done: a request's outcome, or the model whose pass ended."""


class Silent:
    """Progress for a sweep run without a console: phases go to the log."""

    def stage(self, message: str) -> None:
        log.info(message)

    def start(self, total: int, description: str) -> None:
        log.info("%s: %d to do", description, total)

    def advance(self, done: Outcome | str) -> None:
        pass
