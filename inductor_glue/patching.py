"""One way to put a wrapper around an Inductor method, and take it off again.

The hook, capture and the workers each wrap a few Inductor methods while they
are active, and may nest (a sweep's test installs a hook inside another).
``StackedPatch`` keeps a stack of values for the wrapper to consult; the
method is replaced on the first push and restored on the last pop. Its target
is a declared seam (``inductor_glue/seams.py``), and one seam has one patch:
two wrappers of one method, each restoring what it found, undo each other
when they come off out of order.

A seam this torch lacks is not patched: its feature is off (``autotune doctor``
says so, and ``warm_start()`` warns once), and nothing else changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .seams import Seam, SeamMissing

T = TypeVar("T")

log = logging.getLogger(__name__)

_PATCHED: set[str] = set()  # seam paths that have their StackedPatch


class StackedPatch(Generic[T]):
    def __init__(self, seam: Seam, wrap: Callable[[Any, StackedPatch[T]], Any]) -> None:
        if seam.path in _PATCHED:
            raise ValueError(f"{seam.path} already has its patch: push a value on that one")
        _PATCHED.add(seam.path)
        self.seam = seam  # resolved lazily: torch is not loaded until a patch is used
        self._wrap = wrap  # (original function, this patch) -> replacement
        self._stack: list[T] = []
        self._original: Any = None

    @property
    def top(self) -> T | None:
        return self._stack[-1] if self._stack else None

    @property
    def values(self) -> tuple[T, ...]:
        """Every value pushed and not popped, innermost last."""
        return tuple(self._stack)

    def push(self, value: T) -> None:
        if self._original is None:
            try:
                owner, original = self.seam.owner(), self.seam.resolve()
            except SeamMissing as exc:
                log.debug("not patched: %s", exc)  # its feature is off; doctor and warm_start say so
            else:
                self._original = original
                setattr(owner, self.seam.name, self._wrap(original, self))
        self._stack.append(value)

    def pop(self, value: Any = None) -> None:
        """Take off the latest push, or with ``value`` the latest push of that value (its
        pusher may leave before one that came in after it)."""
        if value is not None and value in self._stack:
            del self._stack[len(self._stack) - 1 - self._stack[::-1].index(value)]
        elif self._stack:
            self._stack.pop()
        if not self._stack and self._original is not None:
            setattr(self.seam.owner(), self.seam.name, self._original)
            self._original = None
