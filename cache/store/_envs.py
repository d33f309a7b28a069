"""Environment ids: every row hangs off an environment, resolved once per process."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, bindparam, select

from autotune.cache.errors import MalformedRow
from autotune.cache.models import environments as E
from autotune.cache.records import Environment
from autotune.cache.store._connection import StoreBase
from autotune.cache.store._reading import ENVIRONMENTS, env_from_row
from autotune.cache.store._rows import BATCH, chunks, env_values

_ENV_ID = select(E.c.id).where(E.c.key == bindparam("key"))


class EnvironmentsMixin(StoreBase):
    # -------------------------------------------------------------- env ids

    def _env_id(self, conn: Connection, env: Environment, env_key: str | None = None) -> int | None:
        env_key = env_key or env.key  # a sha256 per call: callers on the hot path pass it in
        env_id = self._env_ids.get(env_key)
        if env_id is None:
            env_id = conn.execute(_ENV_ID, {"key": env_key}).scalar_one_or_none()
            if env_id is not None:
                self._env_ids[env_key] = env_id
        return env_id

    def _env_id_for_write(self, conn: Connection, env: Environment) -> int:
        env_id = self._env_ids.get(env.key)
        if env_id is not None:
            return env_id
        # DO NOTHING (not DO UPDATE) so writers never hold a lock on the shared env row.
        conn.execute(self._insert(E).values(**env_values(env)).on_conflict_do_nothing())
        env_id = conn.execute(_ENV_ID, {"key": env.key}).scalar_one()
        self._env_ids[env.key] = env_id
        return env_id

    def _envs_by_id(self, conn: Connection, ids: Iterable[int]) -> dict[int, Environment | MalformedRow]:
        """The environments of these ids, each one read, or the error that says it cannot be."""
        found: dict[int, Environment | MalformedRow] = {}
        for chunk in chunks(sorted(set(ids)), BATCH):
            for row in conn.execute(ENVIRONMENTS.select(self.dialect).where(E.c.id.in_(chunk))):
                try:
                    found[row.id] = env_from_row(row, self.dialect)
                except MalformedRow as error:
                    found[row.id] = error
        return found

