"""Misses: requests a warm-started job could not find, logged for the next sweep."""

from __future__ import annotations

import socket

from sqlalchemy import Connection, select

from autotune.cache.models import environments as E
from autotune.cache.models import misses as M
from autotune.cache.records import Environment, MissRecord, TuningRequest, utcnow
from autotune.cache.store._connection import db_errors
from autotune.cache.store._envs import EnvironmentsMixin
from autotune.cache.store._rows import env_from_row, miss_from_row, request_values

class MissesMixin(EnvironmentsMixin):
    @db_errors
    def record_miss(
        self, env: Environment, request: TuningRequest, host: str | None = None
    ) -> None:
        """Log a request the cache could not answer (upsert: count += 1, last_seen = now)."""
        now = utcnow()
        host = socket.gethostname() if host is None else host

        def work(conn: Connection) -> None:
            values = {
                **request_values(request),
                "env_id": self._env_id_for_write(conn, env),
                "first_seen": now,
                "last_seen": now,
                "count": 1,
                "host": host,
            }
            insert = self._insert(M).values(**values)
            conn.execute(
                insert.on_conflict_do_update(
                    index_elements=[M.c.env_id, M.c.key],
                    set_={
                        "count": M.c.count + 1,
                        "last_seen": insert.excluded.last_seen,
                        "host": insert.excluded.host,
                        "inputs": insert.excluded.inputs,
                        "params": insert.excluded.params,
                        "choice_hashes": insert.excluded.choice_hashes,
                    },
                )
            )

        self._write(work)

    @db_errors
    def misses(self, env: Environment | None = None) -> list[MissRecord]:
        """Logged misses, most frequent first; all environments unless env is given."""

        def work(conn: Connection) -> list[MissRecord]:
            query = select(M).order_by(M.c.count.desc(), M.c.id)
            if env is not None:
                env_id = self._env_id(conn, env)
                if env_id is None:
                    return []
                query = query.where(M.c.env_id == env_id)
            rows = conn.execute(query).all()
            env_rows = conn.execute(select(E).where(E.c.id.in_({r.env_id for r in rows}))).all()
            envs = {e.id: env_from_row(e) for e in env_rows}
            return [miss_from_row(envs[r.env_id], r) for r in rows]

        return self._read(work)

