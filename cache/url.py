"""Where the cache lives: resolving a user-given URL (or path) to a SQLAlchemy URL."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_path() -> Path:
    """$XDG_CACHE_HOME/autotune/cache.db, falling back to ~/.cache/autotune/cache.db."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autotune" / "cache.db"


def default_cache_url() -> str:
    return f"sqlite:///{default_cache_path()}"


def resolve_cache_url(url: str | None = None) -> str:
    """The given url, else the default SQLite file. ``$AUTOTUNE_CACHE`` is read by the
    settings (autotune/settings.py), which hand their ``cache`` down here.

    A bare filesystem path is taken as an SQLite file, and the plain
    ``postgresql://`` / ``postgres://`` schemes are pointed at psycopg 3, the only
    PostgreSQL driver autotune depends on.
    """
    chosen = (url or "").strip() or default_cache_url()
    if "://" not in chosen:
        return f"sqlite:///{Path(chosen).expanduser().absolute()}"
    scheme, rest = chosen.split("://", 1)
    if scheme in ("postgresql", "postgres"):
        return f"postgresql+psycopg://{rest}"
    return chosen


def local_directory(url: str | None) -> Path:
    """A directory on this host that goes with the cache, for files such as a sweep's log:
    the SQLite file's own, else (a server, an in-memory database) $XDG_CACHE_HOME/autotune."""
    resolved = resolve_cache_url(url)
    scheme, _, rest = resolved.partition(":///")
    database = rest.split("?", 1)[0]
    if scheme == "sqlite" and database and database != ":memory:" and not database.startswith("file:"):
        return Path(database).expanduser().absolute().parent
    return default_cache_path().parent
