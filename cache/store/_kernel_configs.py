"""Kernel configs: data-only pointwise/reduction configs keyed by (environment, key)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from autotune.cache.errors import MalformedRow
from autotune.cache.models import kernel_configs as K
from autotune.cache.records import Environment, KeyedListing, utcnow
from autotune.cache.store._connection import db_errors
from autotune.cache.store._envs import EnvironmentsMixin
from autotune.cache.store._reading import Reader, checking, kernel_config_from_values
from autotune.cache.store._rows import json_safe

KERNEL_CONFIGS = Reader(K.c.id, K.c.env_id, K.c.key, K.c.value)


class KernelConfigsMixin(EnvironmentsMixin):
    @db_errors
    def put_kernel_config(self, env: Environment, key: str, value: dict[str, Any]) -> None:
        """Store a data-only config (JSON object) under (env, key), replacing any old one."""
        if not isinstance(value, dict):
            raise TypeError(f"kernel config value must be a dict, got {type(value).__name__}")
        self.put_kernel_configs(env, {key: value})

    @db_errors
    def kernel_configs(self, env: Environment, prefix: str = "") -> KeyedListing[dict[str, Any]]:
        """Every kernel config stored for env whose key starts with prefix; rows that fail
        validation are left out, each in the listing's ``malformed``."""

        def work(conn: Connection) -> KeyedListing[dict[str, Any]]:
            found: KeyedListing[dict[str, Any]] = KeyedListing()
            env_id = self._env_id(conn, env)
            if env_id is None:
                return found
            query = KERNEL_CONFIGS.select(self.dialect).where(K.c.env_id == env_id)
            if prefix:
                query = query.where(K.c.key.startswith(prefix, autoescape=True))
            for row in conn.execute(query):
                try:
                    key, value = self._kernel_config(row)
                    found[key] = value
                except MalformedRow as error:
                    found.set_aside(error)
            return found

        return self._read(work)

    @db_errors
    def put_kernel_configs(self, env: Environment, items: dict[str, dict[str, Any]]) -> int:
        """Store many data-only configs for env in one transaction; returns how many."""
        for key, value in items.items():
            if not isinstance(value, dict):
                raise TypeError(f"kernel config {key!r} must be a dict, got {type(value).__name__}")
        rows = [(key, json_safe(value, "value")) for key, value in items.items()]
        if not rows:
            return 0

        def work(conn: Connection) -> int:
            env_id = self._env_id_for_write(conn, env)
            now = utcnow()
            for key, value in rows:
                insert = self._insert(K).values(env_id=env_id, key=key, value=value, updated_at=now)
                conn.execute(insert.on_conflict_do_update(
                    index_elements=[K.c.env_id, K.c.key],
                    set_={"value": insert.excluded.value, "updated_at": insert.excluded.updated_at},
                ))
            return len(rows)

        return self._write(work)

    @db_errors
    def get_kernel_config(self, env: Environment, key: str) -> dict[str, Any] | None:
        """The config stored under (env, key), or None; MalformedRow when its row fails validation."""

        def work(conn: Connection) -> dict[str, Any] | None:
            env_id = self._env_id(conn, env)
            if env_id is None:
                return None
            query = KERNEL_CONFIGS.select(self.dialect).where(K.c.env_id == env_id, K.c.key == key)
            row = conn.execute(query).one_or_none()
            return None if row is None else self._kernel_config(row)[1]

        return self._read(work)

    @db_errors
    def kernel_config_keys(self, prefix: str, limit: int = 100) -> list[str]:
        """Keys starting with prefix, in any environment (at most ``limit``): a record filed
        under one environment but found by its key alone (a stored capture, autotune/sweep/capture_reuse.py)."""

        def work(conn: Connection) -> list[str]:
            query = select(K.c.key).where(K.c.key.startswith(prefix, autoescape=True)).limit(limit)
            return [str(key) for key in conn.execute(query).scalars()]

        return self._read(work)

    @db_errors
    def find_kernel_config(self, key: str) -> dict[str, Any] | None:
        """The value stored under ``key`` in any environment (the newest where several hold it),
        or None; MalformedRow when its row fails validation."""

        def work(conn: Connection) -> dict[str, Any] | None:
            query = KERNEL_CONFIGS.select(self.dialect).where(K.c.key == key).order_by(K.c.updated_at.desc())
            row = conn.execute(query.limit(1)).one_or_none()
            return None if row is None else self._kernel_config(row)[1]

        return self._read(work)

    def _kernel_config(self, row: Any) -> tuple[str, dict[str, Any]]:
        with checking("kernel_configs", row.id):
            values = KERNEL_CONFIGS.values(row, self.dialect)
            return kernel_config_from_values(values["key"], values["value"])

