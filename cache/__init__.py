"""The shared kernel cache: typed records and the SQL store that keeps them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.cache.errors import (
    CacheError,
    CacheUnavailable,
    CacheWriteRefused,
    ImportValidationError,
    ReadOnlyError,
    SchemaOutdated,
)
from autotune.cache.records import (
    ARTIFACT_KINDS,
    FAILURE_KINDS,
    STATUSES,
    Artifact,
    ArtifactInfo,
    CandidateResult,
    Environment,
    InputLayout,
    MissRecord,
    Provenance,
    TuningRequest,
    TuningResult,
)
from autotune.cache.url import default_cache_url, resolve_cache_url

if TYPE_CHECKING:
    from autotune.cache.store import ExportReport, ImportReport, Store

# The store pulls in SQLAlchemy and Alembic (about a second): imported on first use,
# so that installing the warm-start hook, which only needs the records, stays cheap.
_FROM_STORE = ("ExportReport", "ImportReport", "Store")


def __getattr__(name: str) -> Any:
    if name in _FROM_STORE:
        from autotune.cache import store

        return getattr(store, name)
    raise AttributeError(f"module 'cache' has no attribute {name!r}")

__all__ = [
    "ARTIFACT_KINDS",
    "FAILURE_KINDS",
    "STATUSES",
    "Artifact",
    "ArtifactInfo",
    "CacheError",
    "CacheUnavailable",
    "CacheWriteRefused",
    "CandidateResult",
    "Environment",
    "ExportReport",
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
