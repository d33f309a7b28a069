"""While the hook installs on a thread, other threads' imports wait for its imports to end.

Only with the install on a thread (``AUTOTUNE_BACKGROUND_INSTALL=1``, an opt-in): the default
start-up never puts the gate into Python's import.

torch's modules import each other in cycles that work when one thread imports them. Two
threads importing them at once hand each other partly executed modules: Python breaks a
cycle of module locks by giving one thread the other's unfinished module, or by raising in it.
A thread importing Inductor while the script imported ``torch._dynamo`` and its kin failed the
script's import ("cannot import name ... from partially initialized module"), and its own, in
many of the processes measured (``docs/internals.md``).

So while the gate is closed (``close``), a thread other than the hook's (whose names
start with ``autotune-``) that imports a module of torch's or of the packages its compile
imports (``GATED_PACKAGES``), not yet fully imported, waits for it to open first. Everything
else a script does (importing its own modules and other libraries, building its model,
loading weights and data) still runs beside the install. A wait never outlasts its use:

- it ends at once where the install is waiting for a module lock that the waiting thread
  holds (the waiting thread was inside an import of its own);
- it ends where the install has imported nothing new for ``STALL_S``: the install may be
  waiting for some other lock the script holds (logging's, while ``dictConfig`` imports a
  handler), and a wait the gate cannot see through must not become a hang.

The gate wraps ``_find_and_load`` and ``_lock_unlock_module`` of ``importlib._bootstrap``, the
two functions CPython calls for a module that is missing or still executing (a complete one
never reaches them). They are CPython's, declared with ``_blocking_on`` and a spec's
``_initializing`` in ``inductor_glue/seams.py``. Both have had these names and arguments since Python 3.3 (checked
on 3.11 and 3.12); a Python without them is left alone (``install()`` says so, and the hook then installs before
``warm_start()`` returns).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

THREAD_PREFIX = "autotune-"  # the hook's threads: never held
# Top-level packages whose modules the install imports and which import each other in cycles.
GATED_PACKAGES = frozenset({"torch", "functorch", "torchgen", "triton", "sympy"})
STALL_S = 1.0  # the install imported nothing new for this long: it may wait for the waiter
_POLL_S = 0.02

_bootstrap: Any = sys.modules.get("_frozen_importlib")
_lock = threading.Lock()
_original: dict[str, Any] = {}
_open = threading.Event()
_open.set()
_importer: list[threading.Thread] = []  # the closed gate's importing thread
_waits = 0  # imports that waited for the gate, for tests and the log
_waited_s = 0.0  # their seconds, for the hook's stats


def install() -> bool:
    """Put the gate into Python's import (idempotent); False where this Python lacks its hooks."""
    with _lock:
        if _original:
            return True
        functions = {name: getattr(_bootstrap, name, None) for name in ("_find_and_load", "_lock_unlock_module")}
        if any(function is None for function in functions.values()) or not hasattr(_bootstrap, "_blocking_on"):
            log.debug("autotune: this Python's import has no place for the gate")
            return False
        _original.update(functions)
        _bootstrap._find_and_load = _find_and_load
        _bootstrap._lock_unlock_module = _lock_unlock_module
        return True


def uninstall() -> None:
    """Python's own functions again (tests; a job keeps the gate, open)."""
    with _lock:
        for name, function in _original.items():
            setattr(_bootstrap, name, function)
        _original.clear()


def close(importer: threading.Thread) -> Callable[[], None]:
    """Close the gate for ``importer`` (the install's thread, not started yet: nothing of the
    caller's may slip in before it); returns the opening, which the importer calls once."""
    with _lock:
        _importer[:] = [importer]
        _open.clear()

    def open_gate() -> None:
        with _lock:
            if _importer and _importer[0] is importer:
                _importer.clear()
                _open.set()

    return open_gate


def waits() -> int:
    return _waits


def waited_s() -> float:
    """Seconds imports have waited for the gate in this process."""
    return _waited_s


def _find_and_load(name: str, import_: Any) -> Any:
    _wait_for_the_gate(name)
    return _original["_find_and_load"](name, import_)


def _lock_unlock_module(name: str) -> Any:
    _wait_for_the_gate(name)
    return _original["_lock_unlock_module"](name)


def _wait_for_the_gate(name: str) -> None:
    if _open.is_set() or name.partition(".")[0] not in GATED_PACKAGES or _complete(name) \
            or threading.current_thread().name.startswith(THREAD_PREFIX):
        return
    global _waits, _waited_s
    with _lock:
        _waits += 1
    me = threading.get_ident()
    began = time.monotonic()
    seen, since, why = len(sys.modules), began, "its imports are done"
    while not _open.wait(_POLL_S):
        if _importer_waits_for(me):
            why = "the install waits for this thread's import"
            break
        if len(sys.modules) != seen:
            seen, since = len(sys.modules), time.monotonic()
        elif time.monotonic() - since > STALL_S:
            why = "the install imported nothing more"
            break
    waited = time.monotonic() - began
    with _lock:
        _waited_s += waited
    log.debug("autotune: importing %s waited %.2f s for the hook's install (%s)", name, waited, why)


def _complete(name: str) -> bool:
    module = sys.modules.get(name)
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)


def _importer_waits_for(me: int) -> bool:
    """Whether the install is waiting for a module lock that thread ``me`` holds."""
    importer = _importer[0].ident if _importer else None
    waiting = _bootstrap._blocking_on.get(importer) if importer is not None else None
    if waiting is None:
        return False
    locks = list(waiting) if isinstance(waiting, list) else [waiting]
    return any(getattr(lock, "owner", None) == me for lock in locks)
