"""Where the cache lives: resolving a user-given URL (or path) to a SQLAlchemy URL."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "AUTOTUNE_CACHE"


def default_cache_path() -> Path:
    """$XDG_CACHE_HOME/autotune/cache.db, falling back to ~/.cache/autotune/cache.db."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "autotune" / "cache.db"


def default_cache_url() -> str:
    return f"sqlite:///{default_cache_path()}"


def resolve_cache_url(url: str | None = None) -> str:
    """Explicit url > $AUTOTUNE_CACHE > the default SQLite file.

    A bare filesystem path is taken as an SQLite file, and the plain
    ``postgresql://`` / ``postgres://`` schemes are pointed at psycopg 3, the only
    PostgreSQL driver autotune depends on.
    """
    chosen = (url or "").strip() or os.environ.get(ENV_VAR, "").strip() or default_cache_url()
    if "://" not in chosen:
        return f"sqlite:///{Path(chosen).expanduser().absolute()}"
    scheme, rest = chosen.split("://", 1)
    if scheme in ("postgresql", "postgres"):
        return f"postgresql+psycopg://{rest}"
    return chosen
