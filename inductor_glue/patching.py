"""One way to put a wrapper around an Inductor method, and take it off again.

The hook, capture and the workers each wrap a few Inductor methods while they
are active, and may nest (a sweep's test installs a hook inside another).
``StackedPatch`` keeps a stack of values for the wrapper to consult; the
method is replaced on the first push and restored on the last pop.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


class StackedPatch(Generic[T]):
    def __init__(self, owner: Callable[[], type], name: str,
                 wrap: Callable[[Any, StackedPatch[T]], Any]) -> None:
        self._owner = owner  # imported lazily: torch is not loaded until a patch is used
        self._name = name
        self._wrap = wrap  # (original function, this patch) -> replacement
        self._stack: list[T] = []
        self._original: Any = None

    @property
    def top(self) -> T | None:
        return self._stack[-1] if self._stack else None

    def push(self, value: T) -> None:
        if self._original is None:
            cls = self._owner()
            self._original = cls.__dict__[self._name]
            setattr(cls, self._name, self._wrap(self._original, self))
        self._stack.append(value)

    def pop(self) -> None:
        if self._stack:
            self._stack.pop()
        if not self._stack and self._original is not None:
            setattr(self._owner(), self._name, self._original)
            self._original = None
