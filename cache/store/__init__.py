"""The persistent, shared kernel cache: SQLite or PostgreSQL behind one Store.

Many sweep workers on several hosts write at once and training jobs read at
compile time, so every write is an idempotent upsert inside one transaction
(retried on benign races and a restarting server), and the read path is two
indexed queries with the environment id cached in memory.

Split by concern, in the manner of optuna's ``_rdb`` storage; ``Store``
composes the mixins, each a module here:

- ``_connection``: engines, transactions, retries, error translation (``_engine``: URLs, SQLite settings)
- ``_migration``: the schema check on first use, migrations under a lock, ``upgrade``
- ``_envs``: environment ids; ``_results``: requests and results, the hot lookup
- ``_kernel_configs``, ``_misses``, ``_artifacts``: one table (or tier) each
- ``_maintenance``: stats, prune, JSON Lines export and import
- ``leases()``: the sweeps' leases on requests (``cache/leases.py``)
- ``_rows``: rows <-> records
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.cache.store._connection import WRITE_RETRY_S, StoreBase
from autotune.cache.store._engine import SQLITE_BUSY_TIMEOUT_S
from autotune.cache.store._maintenance import (
    ExportReport,
    ImportReport,
    MaintenanceMixin,
)
from autotune.cache.store._migration import MIGRATION_WAIT_S, MigrationMixin
from autotune.cache.store._misses import MissesMixin
from autotune.cache.store._results import _PG_LOOKUP

if TYPE_CHECKING:
    from autotune.cache.leases import Leases

__all__ = [
    "MIGRATION_WAIT_S",
    "SQLITE_BUSY_TIMEOUT_S",
    "WRITE_RETRY_S",
    "_PG_LOOKUP",
    "ExportReport",
    "ImportReport",
    "Store",
]


class Store(MaintenanceMixin, MissesMixin, MigrationMixin, StoreBase):
    """The kernel cache. Cheap to construct: it connects on first use.

    Picklable (Ray ships it to workers): only the configuration travels and the
    engine is recreated lazily in the receiving process.
    """

    def leases(self, holder: str | None = None, seconds: float = 60.0) -> Leases:
        """Leases of one sweep (``holder``) on this database's requests; see cache/leases.py."""
        from autotune.cache.leases import Leases, new_holder_id

        return Leases(self, holder or new_holder_id(), seconds)
