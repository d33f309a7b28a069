"""What users of the store call: the warm-start hook, the sweep's actors and pool, and the
leases. ``autotune.cache.Store`` (``cache/store/``) is the implementation; code that only
uses a store takes one of these, so a check sees what it relies on, and a test can hand it
any object that has these methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from autotune.cache.records import (
    Artifact,
    ArtifactInfo,
    Environment,
    KeyedListing,
    Listing,
    MissRecord,
    TuningRequest,
    TuningResult,
)

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from autotune.cache.leases import Leases

T = TypeVar("T")


class Store(Protocol):
    """The kernel cache as its users see it. Reads of stored rows raise MalformedRow for a row
    that fails validation (``lookup``, ``get_artifact``) or leave it out of a listing, in its
    ``malformed``; every other failure is a CacheError."""

    read_only: bool

    @property
    def masked_url(self) -> str: ...

    def connect(self) -> None: ...

    def close(self) -> None: ...

    # winners
    def lookup(self, env: Environment, request_key: str) -> TuningResult | None: ...

    def results_for_env(self, env: Environment, status: str | None = ...) -> Listing[TuningResult]: ...

    def list_results(self, op: str | None = ..., device: str | None = ..., limit: int | None = ...,
                     status: str | None = ...) -> Listing[tuple[int, TuningResult]]: ...

    def cached_request_keys(self, env: Environment) -> set[str]: ...

    def busy_timed_request_keys(self, env: Environment) -> set[str]: ...

    def put_result(self, result: TuningResult) -> None: ...

    # misses
    def record_miss(self, env: Environment, request: TuningRequest, host: str | None = ...) -> None: ...

    def misses(self, env: Environment | None = ...) -> Listing[MissRecord]: ...

    # kernel configs and decisions (pointwise configs, fusion and padding verdicts, pass marks)
    def kernel_configs(self, env: Environment, prefix: str = ...) -> KeyedListing[dict[str, Any]]: ...

    def put_kernel_configs(self, env: Environment, items: dict[str, dict[str, Any]]) -> int: ...

    # compiled artifacts
    def get_artifact(self, kind: str, key: str, max_bytes: int = ...) -> Artifact | None: ...

    def put_artifact(self, artifact: Artifact) -> bool: ...

    def artifacts(self, kind: str | None = ..., device: str | None = ..., signer: str | None = ...,
                  limit: int | None = ...) -> Listing[ArtifactInfo]: ...

    # sweeps sharing a database
    def leases(self, holder: str | None = ..., seconds: float = ...) -> Leases: ...


class TransactionalStore(Store, Protocol):
    """A store whose write transactions the leases run their SQL in (with its retries)."""

    def _write(self, work: Callable[[Connection], T]) -> T: ...
