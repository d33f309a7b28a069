"""Requests and results: the upsert of a tuned request with its candidates, and
every read of them (the hook's lookup is the hot path)."""

from __future__ import annotations

import functools
import json
import logging
import math
from collections import namedtuple
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, bindparam, delete, exc, func, select
from sqlalchemy.dialects import postgresql

from autotune.cache.errors import MalformedRow
from autotune.cache.models import candidates as C
from autotune.cache.models import misses as M
from autotune.cache.models import requests as R
from autotune.cache.records import STATUS_OK, Environment, Listing, TuningResult, utcnow
from autotune.cache.store._connection import db_errors
from autotune.cache.store._envs import EnvironmentsMixin
from autotune.cache.store._reading import (
    CANDIDATES,
    REQUESTS,
    environment_of,
    result_from_rows,
)
from autotune.cache.store._rows import (
    BATCH,
    candidate_values,
    chunks,
    dedupe,
    env_filter,
    result_values,
)

log = logging.getLogger(__name__)

# SQLite's lookup (PostgreSQL's is _PG_LOOKUP): rows as stored, each checked as it becomes a record.
_LOOKUP_REQUEST = REQUESTS.select("sqlite").where(R.c.env_id == bindparam("env_id"), R.c.key == bindparam("key"))
_LOOKUP_CANDIDATES = (
    CANDIDATES.select("sqlite").where(C.c.request_id == bindparam("request_id")).order_by(C.c.position)
)
_CANDIDATE_FIELDS = (
    "id", "choice_hash", "kind", "name", "description", "template_id",
    "params", "time_ms", "failure_kind", "failure_message", "spread", "repeats",
)  # fmt: skip
# How PostgreSQL's JSON writes the float8 values JSON has no number for.
_PG_FLOAT_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _pg_lookup_statement() -> sa.Select[Any]:
    """PostgreSQL: the request row and its candidates (as one JSON array) in one
    statement, so a lookup is one round trip and sees one consistent snapshot.
    (Not on SQLite: its JSON prints doubles with 15 digits, so times would not
    round-trip exactly; there a lookup is two in-process queries instead.)"""
    cand = C.alias("c")
    pairs: list[Any] = []
    for name in _CANDIDATE_FIELDS:
        pairs += [sa.literal_column(f"'{name}'"), cand.c[name]]
    obj = func.json_build_object(*pairs)
    cands = (
        select(func.json_agg(postgresql.aggregate_order_by(obj, cand.c.position), type_=sa.JSON))
        .where(cand.c.request_id == R.c.id)
        .scalar_subquery()
    )
    return select(R, cands.label("candidates_json")).where(
        R.c.env_id == bindparam("env_id"), R.c.key == bindparam("key")
    )


_PG_LOOKUP = _pg_lookup_statement()
_PG_LOOKUP_SQL = str(_PG_LOOKUP.compile(dialect=postgresql.psycopg.dialect()))
_PgLookupRow = namedtuple("_PgLookupRow", [*(c.name for c in R.c), "candidates_json"])  # type: ignore[misc]


class ResultsMixin(EnvironmentsMixin):
    # ------------------------------------------------------------------ writes

    @db_errors
    def put_result(self, result: TuningResult) -> None:
        """Store (or replace) one result; clears any logged miss for it."""
        self.put_results([result])

    @db_errors
    def put_results(self, results: Iterable[TuningResult]) -> int:
        """Store many results, a batch per transaction; returns how many were given."""
        self._require_writable()
        # The last result for a key wins; a fixed order keeps PostgreSQL lock order
        # the same in every writer, so overlapping batches do not deadlock.
        unique = {(r.env.key, r.request.key): r for r in results}
        ordered = [unique[k] for k in sorted(unique)]
        for batch in chunks(ordered, BATCH):
            self._write(functools.partial(self._put_batch, batch=batch))
        return len(ordered)

    def _put_batch(self, conn: Connection, batch: Sequence[TuningResult]) -> None:
        now = utcnow()
        for result in batch:
            self._put(conn, result, now)

    def _put(self, conn: Connection, result: TuningResult, now: datetime) -> None:
        env_id = self._env_id_for_write(conn, result.env)
        values = result_values(result, env_id, now)
        insert = self._insert(R).values(**values)
        insert = insert.on_conflict_do_update(
            index_elements=[R.c.env_id, R.c.key],
            set_={name: insert.excluded[name] for name in values if name not in ("env_id", "key")},
        ).returning(R.c.id)
        request_id = conn.execute(insert).scalar_one()
        candidates = dedupe(result.candidates)
        # A re-tune replaces the candidate set: drop the ones not in the new result.
        # Each DELETE runs only when there is something to delete, so a write-back
        # role without DELETE on candidates can still store a new result.
        stale = C.c.choice_hash.not_in([c.choice_hash for c in candidates])
        if _exists(conn, C, C.c.request_id == request_id, stale):
            conn.execute(delete(C).where(C.c.request_id == request_id, stale))
        if candidates:
            rows = [candidate_values(c, i, request_id) for i, c in enumerate(candidates)]
            insert = self._insert(C)
            insert = insert.on_conflict_do_update(
                index_elements=[C.c.request_id, C.c.choice_hash],
                set_={name: insert.excluded[name] for name in rows[0] if name != "choice_hash"},
            )
            conn.execute(insert, rows)
        answered = (M.c.env_id == env_id, M.c.key == result.request.key)
        if _exists(conn, M, *answered):
            _clear_miss(conn, delete(M).where(*answered))

    # ------------------------------------------------------------------- reads

    @db_errors
    def lookup(self, env: Environment, request_key: str) -> TuningResult | None:
        """The stored result (any status) for (env, request key), or None. Hot path.

        Raises MalformedRow for a stored row that fails validation (the caller treats it as absent).
        """
        return self._read(lambda conn: self._lookup(conn, env, request_key))

    def _lookup(self, conn: Connection, env: Environment, key: str) -> TuningResult | None:
        env_key = env.key
        cached = env_key in self._env_ids
        env_id = self._env_id(conn, env, env_key)
        if env_id is None:
            return None
        params = {"env_id": env_id, "key": key}
        if self.dialect == "postgresql":
            row = _pg_lookup_row(conn, params)
            cands: list[Any] = [_pg_candidate(c) for c in (row.candidates_json if row else None) or ()]
        else:  # SQLite reads run in one transaction: both queries see one snapshot
            row = conn.execute(_LOOKUP_REQUEST, params).one_or_none()
            cands = [] if row is None else list(conn.execute(_LOOKUP_CANDIDATES, {"request_id": row.id}))
        if row is None:
            if cached:
                # The env may have been pruned and re-created under a new id.
                self._env_ids.pop(env_key, None)
            return None
        return result_from_rows(env, row, cands, self.dialect)

    @db_errors
    def get(self, request_id: int) -> TuningResult | None:
        """The result stored under an integer row id (as listed by list_results); MalformedRow
        when that row fails validation."""
        found = self._read(lambda conn: self._results_for(conn, self._requests().where(R.c.id == request_id)))
        if found.malformed:
            raise found.malformed[0]
        return found[0][1] if found else None

    @db_errors
    def list_results(
        self,
        op: str | None = None,
        device: str | None = None,
        limit: int | None = None,
        status: str | None = None,
    ) -> Listing[tuple[int, TuningResult]]:
        """(row id, result) pairs in id order, optionally filtered; rows that fail validation
        are left out, each in the listing's ``malformed``."""
        query = self._requests().order_by(R.c.id)
        if op:
            query = query.where(R.c.op == op)
        if status:
            query = query.where(R.c.status == status)
        device_envs = env_filter(None, device) if device else None
        if device_envs is not None:
            query = query.where(R.c.env_id.in_(device_envs))
        if limit:
            query = query.limit(limit)
        return self._read(lambda conn: self._results_for(conn, query))

    def iter_results(self, batch: int = 1000) -> Iterator[tuple[int, TuningResult]]:
        """Every stored result in id order, a batch per query (for export); a row that fails
        validation is left out with a warning."""
        last_id = 0
        while (page := self._results_after(last_id, batch)) is not None:
            last_id, found = page
            for error in found.malformed:
                log.warning("%s", error)
            yield from found

    @db_errors
    def _results_after(self, last_id: int, batch: int) -> tuple[int, Listing[tuple[int, TuningResult]]] | None:
        """The last id of the next ``batch`` requests rows, and their results; None past the end."""

        def work(conn: Connection) -> tuple[int, Listing[tuple[int, TuningResult]]] | None:
            ids = conn.execute(select(R.c.id).where(R.c.id > last_id).order_by(R.c.id).limit(batch)).scalars().all()
            if not ids:
                return None
            return ids[-1], self._results_for(conn, self._requests().where(R.c.id.in_(ids)).order_by(R.c.id))

        return self._read(work)

    def _requests(self) -> sa.Select[Any]:
        return REQUESTS.select(self.dialect)

    def _results_for(self, conn: Connection, query: sa.Select[Any]) -> Listing[tuple[int, TuningResult]]:
        """The results of the requests rows ``query`` selects (``_requests()``), each row checked."""
        found: Listing[tuple[int, TuningResult]] = Listing()
        rows = conn.execute(query).all()
        if not rows:
            return found
        envs = self._envs_by_id(conn, (r.env_id for r in rows))
        cands: dict[int, list[Any]] = {r.id: [] for r in rows}
        for chunk in chunks([r.id for r in rows], BATCH):
            query = CANDIDATES.select(self.dialect).where(C.c.request_id.in_(chunk))
            for cand in conn.execute(query.order_by(C.c.request_id, C.c.position)):
                cands[cand.request_id].append(cand)
        for row in rows:
            try:
                env = environment_of("requests", row, envs)
                found.append((row.id, result_from_rows(env, row, cands[row.id], self.dialect)))
            except MalformedRow as error:
                found.set_aside(error)
        return found

    @db_errors
    def cached_request_keys(self, env: Environment) -> set[str]:
        """Keys of requests stored with status ok for env (work a sweep can skip)."""

        def work(conn: Connection) -> set[str]:
            env_id = self._env_id(conn, env)
            if env_id is None:
                return set()
            query = select(R.c.key).where(R.c.env_id == env_id, R.c.status == STATUS_OK)
            return set(conn.execute(query).scalars())

        return self._read(work)

    @db_errors
    def busy_timed_request_keys(self, env: Environment) -> set[str]:
        """Keys of requests stored ok for env whose candidates were timed on a busy host
        (``validation["timing"]["busy"]``, workers/noise.py): a sweep on a quiet host times
        them again, and its result replaces theirs."""

        def work(conn: Connection) -> set[str]:
            env_id = self._env_id(conn, env)
            if env_id is None:
                return set()
            query = sa.select(R.c.key, sa.type_coerce(R.c.validation, sa.Text).label("validation")).where(
                R.c.env_id == env_id, R.c.status == STATUS_OK, R.c.validation.is_not(None))
            return {row.key for row in conn.execute(query) if _timed_busy(row.validation)}

        return self._read(work)

    @db_errors
    def results_for_env(self, env: Environment, status: str | None = STATUS_OK) -> Listing[TuningResult]:
        """Every result stored for env (status ok unless told), with candidates; rows that fail
        validation are left out, each in the listing's ``malformed``.

        The warm-start hook reads this once per process to learn which Triton
        configs won, so it can skip generating the ones that lost.
        """

        def work(conn: Connection) -> Listing[TuningResult]:
            env_id = self._env_id(conn, env)
            if env_id is None:
                return Listing()
            query = self._requests().where(R.c.env_id == env_id).order_by(R.c.id)
            if status:
                query = query.where(R.c.status == status)
            found = self._results_for(conn, query)
            return Listing((result for _, result in found), found.malformed)

        return self._read(work)


def _pg_lookup_row(conn: Connection, params: dict[str, Any]) -> Any | None:
    """Run the PostgreSQL lookup on the driver's cursor directly.

    SQLAlchemy's per-statement machinery is a large share of a lookup's CPU
    time here, on the compile-time hot path. Errors still come out as
    SQLAlchemy's exception classes, and a dead connection is invalidated, as
    conn.execute() would do.
    """
    import psycopg  # the postgresql+psycopg dialect has already imported it

    driver: Any = conn.connection.driver_connection
    try:
        with driver.cursor() as cursor:
            cursor.execute(_PG_LOOKUP_SQL, params)
            record = cursor.fetchone()
    except psycopg.Error as error:
        dead = driver.closed or driver.broken
        if dead:
            conn.invalidate(error)
        raise exc.DBAPIError.instance(
            _PG_LOOKUP_SQL, params, error, psycopg.Error, connection_invalidated=dead
        ) from error
    if record is None:
        return None
    row: Any = _PgLookupRow(*record)
    # The driver returns the session's time zone; records use UTC.
    return row._replace(created_at=_utc(row.created_at), updated_at=_utc(row.updated_at))


def _pg_candidate(data: dict[str, Any]) -> dict[str, Any]:
    """A candidate as PostgreSQL's JSON gave it, its float8 time back as a float."""
    words = {name: _PG_FLOAT_WORDS[value] for name in ("time_ms", "spread")
             if isinstance(value := data.get(name), str) and value in _PG_FLOAT_WORDS}
    return {**data, **words} if words else data


def _timed_busy(validation: Any) -> bool:
    """A stored validation's ``timing.busy`` flag; anything unreadable is not busy."""
    try:
        data = json.loads(validation) if isinstance(validation, str) else validation
        return isinstance(data, dict) and isinstance(data.get("timing"), dict) and data["timing"].get("busy") is True
    except ValueError:
        return False


def _exists(conn: Connection, table: sa.Table, *where: sa.ColumnElement[bool]) -> bool:
    return conn.execute(select(sa.literal(1)).select_from(table).where(*where).limit(1)).first() is not None


def _clear_miss(conn: Connection, statement: sa.Delete) -> None:
    """Delete the miss a result answers. A write-back role has no DELETE (by design):
    then the miss stays logged (a sweep skips it, and its next store clears it) and
    the result is still stored, thanks to the savepoint."""
    if conn.dialect.name != "postgresql":
        conn.execute(statement)
        return
    try:
        with conn.begin_nested():
            conn.execute(statement)
    except exc.ProgrammingError as error:
        if getattr(error.orig, "sqlstate", None) != "42501":  # insufficient_privilege
            raise
        log.debug("no DELETE privilege on misses; the answered miss stays logged")


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)

