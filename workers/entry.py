"""A worker's entry: which tuner a job goes to. The default search times Inductor's own
candidates (workers/tune.py); a sweep's ``--search`` other than the default goes through
workers/search.py, which reuses tune.py's tuner with its own policy. Kept apart from both so
that neither imports the other's caller."""

from __future__ import annotations

from autotune.cache.records import TuningResult

from .jobs import TuneJob
from .search import searched, tune_searched
from .tune import TunePolicy, tune_with


def tune_request(job: TuneJob) -> TuningResult:
    """Tune ``job.request`` here; failures come back as a result, never raised."""
    if searched(job):
        return tune_searched(job)
    return tune_with(job, TunePolicy(device=job.device))
