"""``torch.compile`` waits while a warm start installs the hook in the background.

Only with the install on a thread (``AUTOTUNE_BACKGROUND_INSTALL=1``, an opt-in): the default
start-up leaves ``torch.compile`` alone.

``warm_start()`` returns at once and imports Inductor and installs its seams on a thread, so
that the script builds its model meanwhile. Nothing may compile before the seams are in place
(it would tune, unserved): until then ``torch.compile`` is a wrapper that waits for them, and
the original comes back once no install is in flight. A script that calls ``torch.compile``
right away waits as long as a synchronous warm start would have taken.

Only ``torch.compile`` is held here. Entry points that reach Inductor otherwise
(``torch._dynamo.optimize``, ``torch._inductor.aot_compile``) before the install ends still wait
for it at their first GEMM, in Inductor's selector (inductor_glue/selector_hold.py); what they
compile before that (their graphs from the artifact tier, say) goes unserved.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_waits: list[Callable[[], None]] = []
_original: Any = None


def hold(wait: Callable[[], None]) -> Callable[[], None]:
    """Make ``torch.compile`` call ``wait`` first; returns the release, which the installer calls
    when it is done (once, whatever happened)."""
    import torch

    global _original
    with _lock:
        _waits.append(wait)
        if _original is None:
            _original = torch.compile
            torch.compile = _gated(_original)

    def release() -> None:
        global _original
        with _lock:
            if wait in _waits:
                _waits.remove(wait)
            original: Any = _original
            if not _waits and original is not None:
                if getattr(torch.compile, "__wrapped__", None) is original:  # nobody replaced it since
                    vars(torch)["compile"] = original
                _original = None

    return release


def _gated(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:
        with _lock:
            waits = list(_waits)
        for wait in waits:
            wait()
        return original(*args, **kwargs)

    return compile
