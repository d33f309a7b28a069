"""autotune: ahead-of-time max-autotune sweeps and a shared SQL kernel cache for torch.compile.

``import autotune`` stays light: nothing heavy (torch, Ray, SQLAlchemy) is
imported until a function that needs it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["warm_start", "__version__"]

if TYPE_CHECKING:
    from .hook import WarmStart


def warm_start(cache: str | None = None, *, on_miss: str = "tune", write_back: bool = True,
               read_only: bool = False, **kwargs: Any) -> WarmStart:
    """Serve torch.compile's autotune lookups from the cache; see autotune.hook.warm_start."""
    from .hook import warm_start as _warm_start

    return _warm_start(cache, on_miss=on_miss, write_back=write_back, read_only=read_only, **kwargs)
