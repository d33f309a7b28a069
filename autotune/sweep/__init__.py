"""The sweep's wing: ``autotune sweep MODEL.py``, from capture to the report.

Capture (capture_lanes.py), the plan (plan.py), the queue and its leases (queue.py), the tuning on
Ray workers, the end-to-end pass (end_to_end.py, with its marks, readiness, resumption and remote
lanes) and the report (report.py, view.py, log_file.py). What to tune is the strategy
(strategy.py); how it runs, the runner (runner.py), which wires its parts over one shared state
(context.py): the planner (planning.py), the capture (capture_run.py), the tuning on Ray
(tuning_run.py) and the end-to-end passes (pass_run.py). It may import the job's wing (the
end-to-end pass compiles as a job does); the job never imports it (tests/test_layout.py).

The names below are handed on lazily, so that importing one module of the wing (the report, the
log file) does not import the runner's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runner import run_sweep, spare_count
    from .strategy import pass_costs

_HANDED_ON = {"run_sweep": ".runner", "spare_count": ".runner", "pass_costs": ".strategy"}
__all__ = ["pass_costs", "run_sweep", "spare_count"]  # the keys of _HANDED_ON


def __getattr__(name: str) -> Any:
    if name in _HANDED_ON:
        return getattr(importlib.import_module(_HANDED_ON[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
