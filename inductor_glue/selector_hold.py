"""Inductor's selector held for the hook while it installs on a thread.

A warm start that installs in the background (autotune/job/background.py) imports Inductor on its
thread while the script goes on. A script that reaches Inductor's selector meanwhile
(``select_algorithm.add_feedback_saver``, a compile through an entry point other than
``torch.compile``) would otherwise make Inductor create its own selector, which the install then
replaces, or which replaces the install's: either way a hook or a user's callback is lost.

So from the moment ``select_algorithm`` exists, a ``HeldSelector`` is Inductor's selector: placed
at once where the module is already imported, else as the last step of its import, under the
module's import lock, so that no thread sees the module without it. Whatever reaches it waits for
the install, then goes to the selector the install put in place (Inductor's own where the install
failed). This module imports nothing of Inductor's.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from . import seams


class HeldSelector:
    """Stands in for Inductor's selector until the install is done; then every use goes to the
    selector in place. ``previous`` is the selector it stood in for (the install's to keep)."""

    def __init__(self, module: ModuleType, previous: Any, done: threading.Event, installer: threading.Thread) -> None:
        self.previous = previous
        self._module = module
        self._done = done
        self._installer = installer

    def current(self) -> Any:
        """The selector to use: the installed one, once the install is done."""
        if threading.current_thread() is not self._installer:  # the install itself never waits on itself
            self._done.wait()
        selector = getattr(self._module, seams.SELECTOR_GLOBAL.name)
        if selector is self:  # the install failed, or is still running on this thread: Inductor's own
            if self.previous is None:
                self.previous = getattr(self._module, seams.ALGORITHM_SELECTOR_CACHE.name)()
            return self.previous
        return selector

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.current()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.current(), name)


def unwrap(selector: Any) -> Any:
    """The selector a hold stands in for; any other selector as it is."""
    return selector.previous if isinstance(selector, HeldSelector) else selector


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` at the end of one module's import, inside it (under its import lock)."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != self.name:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                _run_after(spec.loader, self.then)
                return spec
        return None


def _run_after(loader: Any, then: Callable[[ModuleType], None]) -> None:
    exec_module = loader.exec_module

    def exec_then(module: ModuleType) -> None:
        exec_module(module)
        then(module)

    loader.exec_module = exec_then  # this module's own loader: nothing else is loaded by it


class Hold:
    """Keeps Inductor's selector held from now until ``release()``; the installer thread's own
    uses of it never wait."""

    def __init__(self, installer: threading.Thread) -> None:
        self._done = threading.Event()
        self._installer = installer
        self._placed: HeldSelector | None = None
        self._finder: _AfterImport | None = None
        name = seams.SELECTOR_GLOBAL.module
        if name in sys.modules:  # imported (or being imported by another thread: this waits for it)
            self._place(importlib.import_module(name))
        else:
            self._finder = _AfterImport(name, self._place)
            sys.meta_path.insert(0, self._finder)

    def _place(self, module: ModuleType) -> None:
        self._forget_finder()
        name = seams.SELECTOR_GLOBAL.name
        # A torch without the seam does not serve GEMMs anyway; an install already done needs no hold.
        if not hasattr(module, name) or self._done.is_set():
            return
        self._placed = HeldSelector(module, getattr(module, name), self._done, self._installer)
        setattr(module, name, self._placed)

    def _forget_finder(self) -> None:
        finder, self._finder = self._finder, None
        if finder is not None and finder in sys.meta_path:
            sys.meta_path.remove(finder)

    def release(self) -> None:
        """The install is done (or failed): a selector still held goes back to what it stood in for."""
        self._forget_finder()
        placed = self._placed
        if placed is not None:
            module = placed._module
            if getattr(module, seams.SELECTOR_GLOBAL.name) is placed:
                setattr(module, seams.SELECTOR_GLOBAL.name, placed.previous)
        self._done.set()
