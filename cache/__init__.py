"""The shared kernel cache: typed records and the SQL store that keeps them."""

from __future__ import annotations

from cache.errors import (
    CacheError,
    CacheUnavailable,
    ImportValidationError,
    ReadOnlyError,
    SchemaOutdated,
)
from cache.records import (
    FAILURE_KINDS,
    STATUSES,
    CandidateResult,
    Environment,
    InputLayout,
    MissRecord,
    Provenance,
    TuningRequest,
    TuningResult,
)
from cache.store import ImportReport, Store
from cache.url import default_cache_url, resolve_cache_url

__all__ = [
    "FAILURE_KINDS",
    "STATUSES",
    "CacheError",
    "CacheUnavailable",
    "CandidateResult",
    "Environment",
    "ImportReport",
    "ImportValidationError",
    "InputLayout",
    "MissRecord",
    "Provenance",
    "ReadOnlyError",
    "SchemaOutdated",
    "Store",
    "TuningRequest",
    "TuningResult",
    "default_cache_url",
    "resolve_cache_url",
]
