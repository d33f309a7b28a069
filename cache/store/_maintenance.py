"""Maintenance: stats, prune, and JSON Lines export/import."""

from __future__ import annotations

import dataclasses
import functools
import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa
from sqlalchemy import Connection, delete, func, select

from autotune.cache import artifacts_store, jsonl, schema
from autotune.cache.errors import MalformedRow
from autotune.cache.models import artifacts as A
from autotune.cache.models import candidates as C
from autotune.cache.models import environments as E
from autotune.cache.models import kernel_configs as K
from autotune.cache.models import misses as M
from autotune.cache.models import requests as R
from autotune.cache.records import Environment, TuningResult, utcnow
from autotune.cache.store._artifacts import ArtifactsMixin
from autotune.cache.store._connection import db_errors
from autotune.cache.store._kernel_configs import KERNEL_CONFIGS, KernelConfigsMixin
from autotune.cache.store._reading import environment_of
from autotune.cache.store._results import ResultsMixin
from autotune.cache.store._rows import BATCH, chunks, env_filter, same

log = logging.getLogger(__name__)

ExportReport = jsonl.ExportReport


@dataclass(frozen=True)
class ImportReport:
    imported: int  # results written (new or changed)
    unchanged: int  # results already stored with the same values
    kernel_configs: int = 0  # pointwise/reduction configs written (replacing equal keys)
    artifacts: int = 0  # artifacts written
    artifacts_skipped: int = 0  # artifacts whose (kind, key) was already stored (write once)

    @property
    def total(self) -> int:
        return self.imported + self.unchanged


class MaintenanceMixin(ResultsMixin, KernelConfigsMixin, ArtifactsMixin):
    @db_errors
    def prune(
        self,
        torch_version: str | None = None,
        device: str | None = None,
        older_than: timedelta | None = None,
        dry_run: bool = False,
    ) -> int:
        """Remove matching requests (all filters must hold; none given matches all).

        device matches the device name as a case-insensitive substring, or the
        device kind exactly; older_than compares with when the row was last
        written. Misses matching the same filters go too, and environments left
        with nothing in them, and artifacts matching them (see prune_artifacts).
        Returns the number of requests (to be) removed; count artifacts with
        prune_artifacts(..., dry_run=True) first.
        """
        if not dry_run:
            self._require_writable("prune")
        env_ids = env_filter(torch_version, device)
        cutoff = utcnow() - older_than if older_than is not None else None
        req_where: list[sa.ColumnElement[bool]] = [R.c.env_id.in_(env_ids)] if env_ids is not None else []
        miss_where: list[sa.ColumnElement[bool]] = [M.c.env_id.in_(env_ids)] if env_ids is not None else []
        if cutoff is not None:
            req_where.append(R.c.updated_at < cutoff)
            miss_where.append(M.c.last_seen < cutoff)
        count_query = select(func.count()).select_from(R).where(*req_where)
        artifact_where = artifacts_store.filters(torch_version, device, older_than)
        if dry_run:
            return self._read(lambda conn: conn.execute(count_query).scalar_one())

        def work(conn: Connection) -> int:
            removed = conn.execute(count_query).scalar_one()
            conn.execute(delete(C).where(C.c.request_id.in_(select(R.c.id).where(*req_where))))
            conn.execute(delete(R).where(*req_where))
            conn.execute(delete(M).where(*miss_where))
            conn.execute(delete(A).where(*artifact_where))
            conn.execute(
                delete(E).where(
                    *(~sa.exists().where(t.c.env_id == E.c.id) for t in (R, M, K))
                )
            )
            return removed

        removed = self._write(work)
        self._env_ids.clear()
        log.info("pruned %d cached requests", removed)
        return removed

    @db_errors
    def prune_artifacts(
        self,
        torch_version: str | None = None,
        device: str | None = None,
        older_than: timedelta | None = None,
        dry_run: bool = False,
    ) -> int:
        """Remove matching artifacts only (all filters must hold; none given matches all).

        torch_version matches exactly, device as a case-insensitive substring of
        the artifact's device, older_than compares with when it was written.
        Returns the number of artifacts (to be) removed.
        """
        where = artifacts_store.filters(torch_version, device, older_than)
        if dry_run:
            return self._read(lambda conn: artifacts_store.count(conn, where))
        self._require_writable("prune")
        removed = self._write(lambda conn: artifacts_store.delete(conn, where))
        log.info("pruned %d cached artifacts", removed)
        return removed

    @db_errors
    def stats(self) -> dict[str, Any]:
        """Row counts, schema revision, masked URL and size on disk."""

        def work(conn: Connection) -> dict[str, Any]:
            def count(table: sa.Table) -> int:
                return conn.execute(select(func.count()).select_from(table)).scalar_one()

            by_status: dict[str, int] = {
                status: n for status, n in conn.execute(select(R.c.status, func.count()).group_by(R.c.status))
            }
            return {
                "url": self.masked_url,
                "backend": self.dialect,
                "schema_revision": schema.current_revision(conn),
                "environments": count(E),
                "requests": sum(by_status.values()),
                "requests_by_status": dict(sorted(by_status.items())),
                "candidates": count(C),
                "misses": count(M),
                "miss_events": conn.execute(select(func.coalesce(func.sum(M.c.count), 0))).scalar_one(),
                "kernel_configs": count(K),
                "kernel_configs_by_kind": self._kernel_config_kinds(conn),
                **artifacts_store.stats(conn),
                "size_bytes": self._size_bytes(conn),
            }

        return self._read(work)

    def _kernel_config_kinds(self, conn: Connection) -> dict[str, int]:
        """kernel_configs rows counted by the part of their key before the first ':' (the
        hook files pointwise configs, fusion and padding verdicts under their own prefixes)."""
        position = (func.strpos(K.c.key, ":") if self.dialect == "postgresql" else func.instr(K.c.key, ":"))
        kind = sa.case((position > 0, func.substr(K.c.key, 1, position - 1)), else_=sa.literal("-"))
        rows = conn.execute(select(kind, func.count()).group_by(kind)).all()
        return {str(name): int(n) for name, n in sorted(rows)}

    def _size_bytes(self, conn: Connection) -> int | None:
        if self.dialect == "postgresql":
            size = sa.text("SELECT pg_total_relation_size(CAST(:name AS regclass))")
            return int(sum(conn.execute(size, {"name": t.name}).scalar_one() for t in (E, R, C, M, K, A)))
        path = self._sqlite_path()
        if path is None:
            return None
        files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
        return sum(f.stat().st_size for f in files if f.exists())

    @db_errors
    def export_jsonl(self, fp: IO[str]) -> ExportReport:
        """Write a header line, one TuningResult per line, every kernel config, then
        every artifact (read and written one at a time); returns the counts."""
        results = (result for _, result in self.iter_results())
        return jsonl.write(fp, results, self._all_kernel_configs(), self.iter_artifacts())

    def _all_kernel_configs(self) -> list[jsonl.KernelConfig]:
        """Every kernel config; a row that fails validation is left out with a warning."""

        def work(conn: Connection) -> list[jsonl.KernelConfig]:
            envs = self._envs_by_id(conn, conn.execute(select(E.c.id)).scalars())
            found = []
            for row in conn.execute(KERNEL_CONFIGS.select(self.dialect).order_by(K.c.id)):
                try:
                    env = environment_of("kernel_configs", row, envs)
                    found.append(jsonl.KernelConfig(env, *self._kernel_config(row)))
                except MalformedRow as error:
                    log.warning("%s", error)
            return found

        return self._read(work)

    @db_errors
    def import_jsonl(self, fp: IO[str]) -> ImportReport:
        """Validate every line, then store the results, kernel configs and artifacts;
        re-importing changes nothing.

        Raises ImportValidationError (line number and problem) before writing
        anything if any line is bad. Artifacts keep their signatures as they are
        (readers verify them); a (kind, key) already stored is left alone.
        """
        self._require_writable("import into")
        with _rewindable(fp) as source:
            start = source.tell()
            contents = jsonl.read(source)
            report = self._import_contents(contents)
            written = skipped = 0
            if contents.artifacts:
                # A second pass: the first one only checked the artifacts, so that
                # at most one payload (tens of MB) is in memory at a time.
                source.seek(start)
                written, skipped = self._put_artifacts(jsonl.read_artifacts(source))
        return dataclasses.replace(report, artifacts=written, artifacts_skipped=skipped)

    def _import_contents(self, contents: jsonl.Contents) -> ImportReport:
        unique = {(r.env.key, r.request.key): r for r in contents.results}
        ordered = [unique[k] for k in sorted(unique)]
        imported = 0
        for batch in chunks(ordered, BATCH):
            imported += self._write(functools.partial(self._import_batch, batch=batch))
        by_env: dict[str, tuple[Environment, dict[str, dict[str, Any]]]] = {}
        for config in contents.kernel_configs:
            by_env.setdefault(config.env.key, (config.env, {}))[1][config.key] = config.value
        configs = sum(self.put_kernel_configs(env, items) for env, items in by_env.values())
        return ImportReport(imported=imported, unchanged=len(ordered) - imported, kernel_configs=configs)

    def _import_batch(self, conn: Connection, batch: Sequence[TuningResult]) -> int:
        now, written = utcnow(), 0
        for result in batch:
            try:
                existing = self._lookup(conn, result.env, result.request.key)
            except MalformedRow:  # the import writes a good row in its place
                existing = None
            if existing is None or not same(existing, result):
                self._put(conn, result, now)
                written += 1
        return written


@contextmanager
def _rewindable(fp: IO[str]) -> Iterator[IO[str]]:
    """fp itself if it can seek back, else a temporary copy of it (stdin, a pipe):
    import reads the file twice rather than hold every artifact in memory."""
    try:
        seekable = fp.seekable() and fp.tell() >= 0
    except (OSError, ValueError, AttributeError):
        seekable = False
    if seekable:
        yield fp
        return
    with tempfile.TemporaryFile("w+", encoding="utf-8") as copy:
        shutil.copyfileobj(fp, copy)
        copy.seek(0)
        yield copy

