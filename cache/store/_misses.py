"""Misses: requests a warm-started job could not find, logged for the next sweep."""

from __future__ import annotations

import socket

from sqlalchemy import Connection

from autotune.cache.errors import MalformedRow
from autotune.cache.models import misses as M
from autotune.cache.records import (
    Environment,
    Listing,
    MissRecord,
    TuningRequest,
    utcnow,
)
from autotune.cache.store._connection import db_errors
from autotune.cache.store._envs import EnvironmentsMixin
from autotune.cache.store._reading import MISSES, environment_of, miss_from_row
from autotune.cache.store._rows import request_values


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
    def misses(self, env: Environment | None = None) -> Listing[MissRecord]:
        """Logged misses, most frequent first; all environments unless env is given. Rows that
        fail validation are left out, each in the listing's ``malformed``."""

        def work(conn: Connection) -> Listing[MissRecord]:
            found: Listing[MissRecord] = Listing()
            query = MISSES.select(self.dialect).order_by(M.c.count.desc(), M.c.id)
            if env is not None:
                env_id = self._env_id(conn, env)
                if env_id is None:
                    return found
                query = query.where(M.c.env_id == env_id)
            rows = conn.execute(query).all()
            envs = self._envs_by_id(conn, (r.env_id for r in rows))
            for row in rows:
                try:
                    stored_env = environment_of("misses", row, envs)
                    found.append(miss_from_row(stored_env, row, self.dialect))
                except MalformedRow as error:
                    found.set_aside(error)
            return found

        return self._read(work)

