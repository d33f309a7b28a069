"""``autotune.warm_start()`` that returns at once: the hook installs on a thread.

Importing Inductor and installing the hook's seams take seconds, which a script spends
building its model, loading weights and data, setting up its process group. So the public
``warm_start()`` checks what it was given (settings, key files: errors still raise here),
holds ``torch.compile`` (autotune/compile_gate.py) and returns; a thread imports the hook and
installs it, the prefetch starting there. The first ``torch.compile`` waits for the install.
"""

from __future__ import annotations

import contextvars
import importlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autotune.inductor_glue.selector_hold import Hold

from . import compile_gate, import_gate

if TYPE_CHECKING:
    from .hook import WarmStart
    from .hook_stats import HookStats

log = logging.getLogger(__name__)

# The torch modules the install imports, and through them nearly all it imports of torch's; the
# script's imports of torch's modules wait for these (autotune/import_gate.py).
GATED_IMPORTS = ("torch._inductor.compile_fx", "torch._inductor.select_algorithm", "torch.utils.cpp_extension")


class PendingWarmStart:
    """What ``warm_start()`` returns while the hook installs: each attribute waits for the
    install, then is the installed ``WarmStart``'s. An install that failed leaves the job
    unserved, with one warning, and empty stats; it never raises into the job."""

    def __init__(self, install: Callable[[], WarmStart]) -> None:
        self._began = time.perf_counter()
        self._install_s = 0.0
        self._install_wait_s = 0.0  # torch.compile's waits for the install
        self._passes_prewarmed = 0
        self._done = threading.Event()
        self._compile_waiting = threading.Event()  # a compile came before the install ended
        self._handle: WarmStart | None = None
        self._script = threading.current_thread()  # the thread that builds the model, then compiles
        release = compile_gate.hold(self._wait_to_compile)
        # In a copy of the script's context: torch 2.13 keeps an assigned config option per context,
        # and the install (the pattern passes it registers) must see the script's, not torch's defaults.
        thread = threading.Thread(target=contextvars.copy_context().run, args=(self._install, install, release),
                                  name="autotune-install", daemon=True)
        # Inductor's selector waits for the install too, from the moment Inductor is imported:
        # a script reaching it otherwise (add_feedback_saver, torch._dynamo.optimize) is served.
        self._held = Hold(thread)
        # The script's imports wait for the install's: torch's modules, imported by two threads
        # at once, hand each other unfinished modules (autotune/import_gate.py).
        self._open_imports = import_gate.close(thread)
        thread.start()

    def _install(self, install: Callable[[], WarmStart], release: Callable[[], None]) -> None:
        try:
            for name in GATED_IMPORTS:
                importlib.import_module(name)
            # Past these the install and the prewarm import little of torch's: the script's
            # imports need not wait for the rest.
            self._open_imports()
            self._handle = install()
            self._passes_prewarmed = self._prewarm(stop=self._compile_waiting.is_set, script=self._script)
        except Exception as exc:  # noqa: BLE001 - a job never fails because of the cache
            log.warning("autotune: the hook could not be installed (%s: %s); compiles run as plain "
                        "max-autotune", type(exc).__name__, exc)
        finally:
            self._install_s = time.perf_counter() - self._began
            self._open_imports()
            self._held.release()
            self._done.set()
            release()

    @staticmethod
    def _prewarm(stop: Callable[[], bool], script: threading.Thread) -> int:
        """Inductor's pattern passes, registered while the script builds its model rather than in
        its first compile (which waits for this install, so never runs beside it); on a thread
        that outlives the process where it must (``prewarm_compile_passes`` says why). Once a
        compile waits, the rest are left to it: nothing is left to overlap, and a compile whose
        graphs the cache serves registers only the passes it runs. Each pass waits while the
        script is busy on a CPU (autotune/script_pace.py): a served compile may need none of
        them, and beside a busy script they would lengthen its building by their own length."""
        from autotune.inductor_glue.env import default_device, prewarm_compile_passes

        from .script_pace import pace_for

        return prewarm_compile_passes(default_device(), stop=stop, pace=pace_for(script, stop))

    def _wait_to_compile(self) -> None:
        """``torch.compile``'s wait (compile_gate.py): the compile is noted as waiting."""
        if self._done.is_set():
            return
        self._compile_waiting.set()
        began = time.perf_counter()
        self._done.wait()
        self._install_wait_s += time.perf_counter() - began

    def _wait(self) -> None:
        self._done.wait()

    def resolved(self) -> WarmStart | None:
        """The installed hook, once it is (None where its install failed)."""
        self._wait()
        return self._handle

    @property
    def stats(self) -> HookStats:
        handle = self.resolved()
        if handle is None:
            from .hook_stats import HookStats

            stats = HookStats(errors=1)
        else:
            stats = handle.stats
        stats.install_s = self._install_s
        stats.install_wait_s = self._install_wait_s
        stats.import_wait_s = import_gate.waited_s()
        stats.passes_prewarmed = self._passes_prewarmed
        return stats

    def uninstall(self) -> None:
        handle = self.resolved()
        if handle is not None:
            handle.uninstall()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        handle = self.resolved()
        if handle is None:
            raise AttributeError(f"{name}: the warm start's hook could not be installed")
        return getattr(handle, name)

    def __enter__(self) -> PendingWarmStart:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def __repr__(self) -> str:
        return repr(self._handle) if self._done.is_set() else "WarmStart(installing)"
