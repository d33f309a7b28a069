"""``autotune.warm_start()`` that returns at once: the hook installs on a thread (an opt-in).

Only with ``AUTOTUNE_BACKGROUND_INSTALL=1``: by default the hook installs before ``warm_start()``
returns and nothing here runs. It is not the default because what makes it safe is
process-wide (the import gate replaces two functions of Python's import for the process, and
``torch.compile`` is swapped during the install), a fault in any of it lands in the user's
script, and its gain did not show in the whole-process figures (docs/guide.md).

Importing Inductor and installing the hook's seams take seconds, which a script spends
building its model, loading weights and data, setting up its process group. So the public
``warm_start()`` checks what it was given (settings, key files: errors still raise here),
holds ``torch.compile`` (autotune/job/compile_gate.py) and returns; a thread imports the hook and
installs it, the prefetch starting there. The first ``torch.compile`` waits for the install.
"""

from __future__ import annotations

import contextvars
import importlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.inductor_glue.selector_hold import Hold

from . import compile_gate, exit_wait, import_gate
from .script_pace import Pace, own_cpu_clock

if TYPE_CHECKING:
    from .hook import WarmStart
    from .hook_stats import HookStats

log = logging.getLogger(__name__)

# The torch modules the install imports, and through them nearly all it imports of torch's; the
# script's imports of torch's modules wait for these (autotune/job/import_gate.py).
# A CPU job's install adds what its vector-ISA probes import (_gated_imports).
GATED_IMPORTS = ("torch._inductor.compile_fx", "torch._inductor.select_algorithm")


class PendingWarmStart:
    """What ``warm_start()`` returns while the hook installs: each attribute waits for the
    install, then is the installed ``WarmStart``'s. An install that failed leaves the job
    unserved, with one warning, and empty stats; it never raises into the job."""

    def __init__(self, install: Callable[[], WarmStart], early: Callable[[], None] = lambda: None) -> None:
        self._timeline = _Timeline(began=time.perf_counter(), imports_waited_before=import_gate.waited_s())
        self._done = threading.Event()
        self._compile_waiting = threading.Event()  # a compile came before the install ended
        self._awaited = threading.Event()  # something else waits for the install to end
        self._exiting = threading.Event()  # the interpreter exits: what is left of the install is not done
        self._handle: WarmStart | None = None
        # The CPU clock of the thread that builds the model, then compiles, read here on that
        # thread (autotune/job/script_pace.py says why).
        self._script_clock = own_cpu_clock()
        release = compile_gate.hold(self._wait_to_compile)
        # In a copy of the script's context: torch 2.13 keeps an assigned config option per context,
        # and the install (the pattern passes it registers) must see the script's, not torch's defaults.
        thread = threading.Thread(target=contextvars.copy_context().run, args=(self._install, install, early, release),
                                  name="autotune-install", daemon=True)
        # Inductor's selector waits for the install too, from the moment Inductor is imported:
        # a script reaching it otherwise (add_feedback_saver, torch._dynamo.optimize) is served.
        self._held = Hold(thread)
        # The script's imports wait for the install's: torch's modules, imported by two threads
        # at once, hand each other unfinished modules (autotune/job/import_gate.py).
        self._open_imports = import_gate.close(thread)
        thread.start()
        exit_wait.finish_before_exit(thread, stop=self._exiting.set)

    def _install(self, install: Callable[[], WarmStart], early: Callable[[], None],
                 release: Callable[[], None]) -> None:
        timeline = self._timeline
        try:
            early()  # threads that run beside the imports below
            for name in _gated_imports():
                importlib.import_module(name)
            # Past these the install and the prewarm import little of torch's: the script's
            # imports need not wait for the rest.
            self._open_imports()
            if self._exiting.is_set():  # a script that ended before its install did: nothing to serve
                return
            self._handle = install()
            timeline.install_s = time.perf_counter() - timeline.began
            timeline.passes_prewarmed = self._prewarm()
            timeline.prewarm_s = time.perf_counter() - timeline.began - timeline.install_s
        except Exception as exc:  # noqa: BLE001 - a job never fails because of the cache
            # A script that ended mid-install: its imports meet the interpreter's exit (a module
            # registering an exit function is refused), and no compile is left to serve.
            report = log.debug if self._exiting.is_set() else log.warning
            report("autotune: the hook could not be installed (%s: %s); compiles run as plain "
                   "max-autotune", type(exc).__name__, exc)
            timeline.install_s = timeline.install_s or time.perf_counter() - timeline.began
        finally:
            self._open_imports()
            self._held.release()
            self._done.set()
            release()

    def _prewarm(self) -> int:
        """Inductor's pattern passes, registered while the script builds its model rather than in
        its first compile (which waits for this install, so never runs beside it); on a thread
        that outlives the process where it must (``prewarm_compile_passes`` says why). Once a
        compile waits, the rest are left to it: nothing is left to overlap, and a compile whose
        graphs the cache serves registers only the passes it runs. Each pass waits while the
        script is busy on a CPU (autotune/job/script_pace.py): a served compile may need none of
        them, and beside a busy script they would lengthen its building by their own length.
        Returns how many it registered."""
        from autotune.inductor_glue.env import default_device, prewarm_compile_passes

        def hurry() -> bool:
            return self._compile_waiting.is_set() or self._awaited.is_set() or self._exiting.is_set()

        def stop() -> bool:
            return self._compile_waiting.is_set() or self._exiting.is_set()

        pace = Pace(self._script_clock, hurry)
        return prewarm_compile_passes(default_device(), stop=stop, pace=pace.wait)

    def _wait_to_compile(self) -> None:
        """``torch.compile``'s wait (compile_gate.py): the compile is noted as waiting."""
        if self._done.is_set():
            return
        self._compile_waiting.set()
        began = time.perf_counter()
        self._done.wait()
        self._timeline.install_wait_s += time.perf_counter() - began

    def _wait(self) -> None:
        """Any other wait for the install (the handle's attributes): the passes stop yielding."""
        if not self._done.is_set():
            self._awaited.set()
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
        self._timeline.fill(stats)
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


def _gated_imports() -> tuple[str, ...]:
    """What the install imports while the script's imports of torch's modules wait: on a CPU job
    also what its vector-ISA probes import after the gate opens (the hook runs them where no
    GPU is seen: autotune/job/hook.py). Only there: their cpp_extension brings setuptools and
    Cython, which a GPU job's install and first compile never import, and which lengthened the
    script's wait at the gate (docs/internals.md)."""
    from autotune.inductor_glue.env import PROBE_MODULES, default_device

    return GATED_IMPORTS + (PROBE_MODULES if default_device() == "cpu" else ())


@dataclass
class _Timeline:
    """The install's figures for the handle's stats (hook_stats.py says what each means)."""

    began: float
    imports_waited_before: float  # the gate's total before this install: a second warm_start()
    install_s: float = 0.0
    prewarm_s: float = 0.0
    install_wait_s: float = 0.0
    passes_prewarmed: int = 0

    def fill(self, stats: HookStats) -> None:
        stats.install_s = self.install_s
        stats.prewarm_s = self.prewarm_s
        stats.install_wait_s = self.install_wait_s
        stats.import_wait_s = import_gate.waited_s() - self.imports_waited_before
        stats.passes_prewarmed = self.passes_prewarmed
