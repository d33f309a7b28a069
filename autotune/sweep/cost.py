"""What a sweep cost: its workers' busy time, in device-minutes, per model.

A worker is busy with a request from the moment its tuning process takes it until it answers
(``Provenance.tuning_seconds``: compiling and timing the candidates, checking the winner).
Summed over the requests this sweep tuned, that is what the sweep spent of its GPUs (CPUs on a
CPU sweep), whether the requests ran side by side or one after another. A request found by
several models counts once, for the first model whose capture found it; a logged miss, for
none. Plain data: no torch, no Ray, no database.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from autotune.cache.records import TuningResult


# What this module reads of a sweep's report (report.py's SweepReport and Outcome), written here,
# beneath the report that states its cost, so that neither imports the other.
class _Outcome(Protocol):
    @property
    def model(self) -> str | None: ...

    @property
    def result(self) -> TuningResult | None: ...


class SweepReport(Protocol):
    @property
    def device(self) -> str: ...

    @property
    def outcomes(self) -> Sequence[_Outcome]: ...

MISSES = "(logged misses)"


def busy_minutes(report: SweepReport) -> dict[str, float]:
    """Model file -> minutes the workers spent on its requests (those tuned by this sweep)."""
    minutes: dict[str, float] = {}
    for outcome in report.outcomes:
        seconds = outcome.result.provenance.tuning_seconds if outcome.result is not None else None
        if seconds is None:
            continue
        model = outcome.model or MISSES
        minutes[model] = minutes.get(model, 0.0) + seconds / 60.0
    return minutes


def unit(report: SweepReport) -> str:
    return "GPU-minutes" if report.device == "cuda" else "CPU-minutes"


def cost_json(report: SweepReport) -> dict[str, object]:
    """The cost as the sweep's JSON report gives it."""
    by_model = busy_minutes(report)
    return {"unit": unit(report), "total": round(sum(by_model.values()), 3),
            "models": {model: round(value, 3) for model, value in by_model.items()}}


def cost_line(report: SweepReport) -> str | None:
    """The summary's line, or None when the sweep tuned nothing."""
    by_model = busy_minutes(report)
    if not by_model:
        return None
    parts = ", ".join(f"{Path(model).name if model != MISSES else model} {value:.2f}"
                      for model, value in by_model.items())
    return f"cost: {sum(by_model.values()):.2f} {unit(report)} of worker time ({parts})"
