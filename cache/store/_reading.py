"""Rows -> records, every row checked: a value of the wrong type, JSON of the wrong shape or a
timing that is no time makes its row a MalformedRow naming its table and id. A reader treats
such a row as absent (a job misses it, a listing sets it aside); it never fails the query
around it, nor the compile that asked.

On SQLite a column holds whatever anyone wrote into it, and SQLAlchemy decodes some columns
(JSON, timestamps, blobs) as it fetches, so one undecodable value would fail the whole
query: there those columns are fetched as stored and decoded here, one row at a time.
PostgreSQL enforces its column types itself (its json is always valid JSON).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.types import NullType

from autotune.cache.errors import MalformedRow
from autotune.cache.models import candidates as C
from autotune.cache.models import environments as E
from autotune.cache.models import misses as M
from autotune.cache.models import requests as R
from autotune.cache.records import (
    SEARCH_DEFAULT,
    STATUS_OK,
    CandidateResult,
    Environment,
    InputLayout,
    MissRecord,
    Provenance,
    TuningRequest,
    TuningResult,
)
from autotune.cache.validation import (
    CANDIDATE,
    ENV,
    NULL,
    Spec,
    check,
    check_fields,
    check_kernel_config,
    check_request,
    is_int,
    stored_repeats,
    stored_spread,
    stored_time_ms,
)

_SQLITE = sqlite.dialect()
_STR, _OPT_STR, _OPT_NUM = (str,), (str, NULL), (int, float, NULL)

_RESULT: Spec = {
    "status": (_STR, True),
    "winner_hash": (_OPT_STR, True),
    "validation": ((dict, NULL), True),
    "error": (_OPT_STR, True),
    "host": (_STR, True),
    "sweep_id": (_OPT_STR, True),
    "tuning_seconds": (_OPT_NUM, True),
    "source": (_STR, True),
    "fallback_reason": (_OPT_STR, False),
    "search": (_OPT_STR, False),
}
_REQUEST_FIELDS = ("op", "inputs_key", "precision", "inputs", "params", "choice_hashes")
# A candidate's fields but its time, which stored_time_ms checks; all of them are in its row.
_CANDIDATE: Spec = {name: (types, True) for name, (types, _) in CANDIDATE.items()
                    if name not in ("time_ms", "spread", "repeats")}


Selected = sa.Column[Any] | sa.Label[Any]  # a column, or an expression named like one


@functools.cache
def _sqlite_decoder(column: Selected) -> Callable[[Any], Any] | None:
    return column.type.dialect_impl(_SQLITE).result_processor(_SQLITE, None)


class Reader:
    """Some columns of one table, selected so that a bad value fails only its own row."""

    def __init__(self, *columns: Selected) -> None:
        self.columns = columns
        self._decoders = [(c.name, decode) for c in columns if (decode := _sqlite_decoder(c)) is not None]
        raw = {name for name, _ in self._decoders}
        self._sqlite_columns = [sa.type_coerce(c, NullType()).label(c.name) if c.name in raw else c
                                for c in columns]

    def select(self, dialect: str) -> sa.Select[Any]:
        return sa.select(*(self._sqlite_columns if dialect == "sqlite" else self.columns))

    def values(self, row: Any, dialect: str) -> dict[str, Any]:
        """The row's values by column name, decoded; ValueError names a column that cannot be."""
        data = dict(row) if isinstance(row, Mapping) else row._asdict()
        if dialect == "sqlite":
            for name, decode in self._decoders:
                try:
                    data[name] = decode(data[name])
                except Exception as exc:
                    raise ValueError(f"column {name} holds {_short(data[name])}, which cannot be read "
                                     f"({type(exc).__name__})") from None
        return data


REQUESTS = Reader(*R.c)
CANDIDATES = Reader(*C.c)
ENVIRONMENTS = Reader(*E.c)
MISSES = Reader(*M.c)


@contextmanager
def checking(table: str, row_id: Any) -> Iterator[None]:
    """Report whatever is wrong with a row while it becomes a record as a MalformedRow."""
    try:
        yield
    except MalformedRow:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise MalformedRow(table, row_id, str(exc)) from None


def env_from_row(row: Any, dialect: str) -> Environment:
    with checking("environments", _id(row)):
        values = ENVIRONMENTS.values(row, dialect)
        data = {name: values[name] for name in ENV}
        data["config"] = {} if data["config"] is None else data["config"]
        check(data, ENV, "environment")
        return Environment(**data)


def environment_of(table: str, row: Any, envs: Mapping[int, Environment | MalformedRow]) -> Environment:
    """The environment a row hangs off (``envs``: EnvironmentsMixin._envs_by_id), or the
    MalformedRow that keeps the row from being read."""
    env = envs.get(row.env_id)
    if isinstance(env, MalformedRow):
        raise env
    if env is None:
        raise MalformedRow(table, row.id, f"its environment (row {row.env_id}) is missing")
    return env


def request_from_values(values: Mapping[str, Any]) -> TuningRequest:
    data = {name: values[name] for name in _REQUEST_FIELDS}
    for name, empty in (("inputs", []), ("params", {}), ("choice_hashes", [])):
        data[name] = empty if data[name] is None else data[name]
    check_request(data)
    # Built directly (not from_json, which sorts) so choice_hashes keep their order.
    return TuningRequest(
        op=data["op"],
        inputs_key=data["inputs_key"],
        precision=data["precision"],
        inputs=tuple(InputLayout.from_json(i) for i in data["inputs"]),
        params=data["params"],
        choice_hashes=tuple(data["choice_hashes"]),
    )


def candidate_from_row(row: Any, dialect: str) -> CandidateResult:
    values = CANDIDATES.values(row, dialect)
    where = f"candidates row {values.get('id')}"
    if values["params"] is None:
        values["params"] = {}
    check_fields(values, _CANDIDATE, where)
    return CandidateResult(
        choice_hash=values["choice_hash"],
        kind=values["kind"],
        name=values["name"],
        description=values["description"],
        template_id=values["template_id"],
        params=values["params"],
        time_ms=stored_time_ms(values["time_ms"], f"{where}: time_ms"),
        failure_kind=values["failure_kind"],
        failure_message=values["failure_message"],
        spread=stored_spread(values.get("spread"), f"{where}: spread"),
        repeats=stored_repeats(values.get("repeats"), f"{where}: repeats"),
    )


def result_from_rows(env: Environment, row: Any, cands: Iterable[Any], dialect: str) -> TuningResult:
    """The result of one requests row and its candidates rows (MalformedRow names the request)."""
    with checking("requests", _id(row)):
        values = REQUESTS.values(row, dialect)
        check({name: values[name] for name in _RESULT}, _RESULT, "request")
        stored_spread(values.get("winner_spread"), "winner_spread")
        candidates = tuple(candidate_from_row(c, dialect) for c in cands)
        if values["status"] == STATUS_OK and all(c.time_ms is None for c in candidates):
            raise ValueError("its status is ok, yet no candidate has a time (each is null or infinite)")
        return TuningResult(
            env=env,
            request=request_from_values(values),
            candidates=candidates,
            winner_hash=values["winner_hash"],
            status=values["status"],
            validation=values["validation"],
            error=values["error"],
            provenance=Provenance(
                created_at=_timestamp(values, "created_at"),
                host=values["host"],
                sweep_id=values["sweep_id"],
                tuning_seconds=values["tuning_seconds"],
                source=values["source"],
                search=values.get("search") or SEARCH_DEFAULT,
            ),
            fallback_reason=values.get("fallback_reason"),
        )


def miss_from_row(env: Environment, row: Any, dialect: str) -> MissRecord:
    with checking("misses", _id(row)):
        values = MISSES.values(row, dialect)
        if not is_int(values["count"]):
            raise ValueError(f"count is {_short(values['count'])}, not an integer")
        if not isinstance(values["host"], str):
            raise ValueError(f"host is {_short(values['host'])}, not a string")
        return MissRecord(
            env=env,
            request=request_from_values(values),
            first_seen=_timestamp(values, "first_seen"),
            last_seen=_timestamp(values, "last_seen"),
            count=values["count"],
            host=values["host"],
        )


def kernel_config_from_values(key: Any, value: Any) -> tuple[str, dict[str, Any]]:
    """A kernel config's key and value, as ``check_kernel_config`` holds them (the node
    share checks what it receives with the same function)."""
    check_kernel_config(key, value)
    return key, value


def _timestamp(values: Mapping[str, Any], name: str) -> datetime:
    value = values[name]
    if not isinstance(value, datetime):
        raise ValueError(f"{name} is {_short(value)}, not a timestamp")
    return value


def _id(row: Any) -> Any:
    return row["id"] if isinstance(row, Mapping) else getattr(row, "id", "?")


def _short(value: Any, width: int = 60) -> str:
    """A stored value for a message: its repr (control characters escaped), shortened."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"
