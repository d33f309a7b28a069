"""Errors raised by the cache store.

Every message is one line that names the problem and, where there is one, the
fix, so the CLI can print it as is and a training job's log stays readable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

E = TypeVar("E", bound=BaseException)
T = TypeVar("T")


def one_line(error: BaseException) -> str:
    """The first line of the driver's message (SQLAlchemy appends SQL and a URL)."""
    orig = getattr(error, "orig", None) or error
    lines = [line.strip() for line in str(orig).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(orig).__name__


def find_cause(error: BaseException, kind: type[E]) -> E | None:
    """``error`` or the first exception of type ``kind`` it wraps: what a compile raised
    under torch's own wrappers (Dynamo's BackendCompilerFailed, Inductor's errors), which
    chain the original as ``__cause__``, ``__context__`` or ``inner_exception``."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        inner = getattr(current, "inner_exception", None)
        current = inner if isinstance(inner, BaseException) else (current.__cause__ or current.__context__)
    return None


class CacheError(Exception):
    """Base class of every error the store raises on purpose."""


class CacheUnavailable(CacheError):
    """The database cannot be reached or the URL is unusable."""


class CacheWriteRefused(CacheError):
    """The database refuses writes for good: disk full, read-only file or server,
    or a role without the privilege. Retrying cannot help; stop writing."""


class SchemaOutdated(CacheError):
    """The database schema is not the one this version of autotune expects."""


class ReadOnlyError(CacheError):
    """A write was attempted on a store opened with read_only=True."""


class ImportValidationError(CacheError):
    """A JSON Lines import file has a bad line; nothing was imported."""

    def __init__(self, line: int, problem: str) -> None:
        self.line = line
        self.problem = problem
        super().__init__(f"line {line}: {problem}")


class MalformedRow(CacheError):
    """A stored row that fails validation (a value of the wrong type, JSON of the wrong shape,
    a timing that is no time, a payload over the size cap). Readers treat the row as absent:
    a job misses it with one warning, a listing skips it and names it."""

    def __init__(self, table: str, row_id: object, problem: str) -> None:
        self.table = table
        self.row_id = row_id
        self.problem = problem
        super().__init__(f"{table} row {row_id} is malformed: {problem}; it is read as absent: "
                         "delete the row or store it again")

    def __reduce__(self) -> tuple[type[MalformedRow], tuple[str, object, str]]:
        return MalformedRow, (self.table, self.row_id, self.problem)


def or_malformed(read: Callable[[], T]) -> T | MalformedRow:
    """``read()``, or the MalformedRow it raised, handed back rather than raised: where any
    error means "the cache is broken" (the hook's bounded calls), a bad row is only a miss."""
    try:
        return read()
    except MalformedRow as error:
        return error
