"""The artifact tier through the store: write-once compiled artifacts (SQL in
``cache/artifacts_store.py``)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy import Connection

from autotune.cache import artifacts_store
from autotune.cache.errors import MalformedRow
from autotune.cache.models import artifacts as A
from autotune.cache.records import MAX_ARTIFACT_BYTES, Artifact, ArtifactInfo, Listing
from autotune.cache.store._connection import StoreBase, db_errors

log = logging.getLogger(__name__)


class ArtifactsMixin(StoreBase):
    # --------------------------------------------------------------- artifacts

    @db_errors
    def put_artifact(self, artifact: Artifact) -> bool:
        """Store a compiled artifact unless its (kind, key) is already stored.

        Write once: the first writer wins and the row never changes. Returns
        True when this call wrote it. The signature is stored as given: the store
        never verifies it (readers do, before loading anything).
        """
        self._require_writable()
        values = artifacts_store.row_values(artifact)
        return self._write(lambda conn: artifacts_store.insert_once(conn, self._insert(A), values))

    @db_errors
    def get_artifact(self, kind: str, key: str, max_bytes: int = MAX_ARTIFACT_BYTES) -> Artifact | None:
        """The artifact stored under (kind, key), payload and signature as stored, or None.

        One indexed query; works on read-only stores and with SELECT-only roles. A row that
        fails validation raises MalformedRow, a payload over ``max_bytes`` among them (its
        size is read first, the payload never).
        """
        return self._read(lambda conn: artifacts_store.get(conn, kind, key, max_bytes))

    @db_errors
    def has_artifact(self, kind: str, key: str) -> bool:
        """Whether (kind, key) is stored, without reading the payload."""
        return self._read(lambda conn: artifacts_store.exists(conn, kind, key))

    @db_errors
    def artifacts(
        self,
        kind: str | None = None,
        device: str | None = None,
        signer: str | None = None,
        limit: int | None = 100,
    ) -> Listing[ArtifactInfo]:
        """Stored artifacts newest first, without payloads; rows that fail validation are left
        out, each in the listing's ``malformed``.

        device is a case-insensitive substring; signer a key fingerprint, or
        "unsigned"; limit None or 0 lists all.
        """
        return self._read(lambda conn: artifacts_store.list_infos(conn, kind, device, signer, limit))

    def iter_artifacts(self) -> Iterator[Artifact]:
        """Every stored artifact in id order, one query and one payload at a time; a row that
        fails validation is left out with a warning."""
        last_id = 0
        while (found := self._artifact_after(last_id)) is not None:
            last_id, artifact = found
            if isinstance(artifact, MalformedRow):
                log.warning("%s", artifact)
                continue
            yield artifact

    @db_errors
    def _artifact_after(self, last_id: int) -> tuple[int, Artifact | MalformedRow] | None:
        return self._read(lambda conn: artifacts_store.next_after(conn, last_id))

    def _put_artifacts(self, artifacts: Iterable[Artifact]) -> tuple[int, int]:
        """(written, already stored), a bounded batch per transaction."""
        written = skipped = 0
        for batch in artifacts_store.batches(artifacts):
            rows = [artifacts_store.row_values(a) for a in batch]
            done = self._write(functools.partial(self._insert_artifact_rows, rows=rows))
            written, skipped = written + done, skipped + len(rows) - done
        return written, skipped

    def _insert_artifact_rows(self, conn: Connection, rows: list[dict[str, Any]]) -> int:
        """How many of rows were new (a stored artifact is kept as it is)."""
        return sum(artifacts_store.insert_once(conn, self._insert(A), row) for row in rows)

