"""Files in Inductor's local cache dir, which the hook and the sweep fill from the SQL cache.

Inductor's compile workers read that dir while we write it, so every file lands
whole (written beside it, then renamed) or not at all.
"""

from __future__ import annotations

import os
import threading


def inductor_cache_dir() -> str:
    from torch._inductor.runtime.runtime_utils import cache_dir

    return cache_dir()


def write_atomic(path: str, payload: bytes, mode: int = 0o644) -> None:
    """Write ``payload`` to ``path``: a concurrent reader sees the old file or the whole new one."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(temporary, "wb") as handle:
        handle.write(payload)
    os.chmod(temporary, mode)
    os.replace(temporary, path)
