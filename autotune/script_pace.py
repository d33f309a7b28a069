"""Work the background install may skip goes only while the script leaves the interpreter idle.

The install on a thread (autotune/background.py) overlaps the script's model building. Work the
first compile needs (the hook, the prefetch) must be done by then, whatever it costs the script.
Work it may not need, Inductor's pattern passes (a compile whose graphs the cache serves whole
runs none of them), is worth doing only in time the script leaves free: while it sleeps, waits for
I/O, a lock or the GPU. Run beside a script that is busy in Python, the two take turns on the GIL
and the script's building takes longer by the work's length. So before each piece of such work
the install samples the script thread's CPU clock and waits while the script is busy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# One sample: the install sleeps this long (holding no GIL) and reads how much of it the script
# spent on a CPU. A script that used less than BUSY_SHARE of it is idle.
WINDOW_S = 0.05
BUSY_SHARE = 0.2
# How long one piece of work waits at most; past it, it runs beside the busy script. A script
# whose other thread waits for the install (Inductor's selector is held until it ends) while its
# own thread spins for that thread's result must not wait for good.
MAX_WAIT_S = 10.0


def cpu_clock(thread: threading.Thread) -> int | None:
    """The thread's CPU-time clock, None where the platform has none (macOS, Windows) or the
    thread is not running. Asked only of a live thread: the pthread handle it is read from must
    not be used once the thread has ended, whereas a read of the clock it gives (the kernel's
    thread) fails cleanly then."""
    getter = getattr(time, "pthread_getcpuclockid", None)
    if getter is None or thread.ident is None or not thread.is_alive():
        return None
    try:
        clock: int = getter(thread.ident)
        time.clock_gettime(clock)
    except (OSError, ValueError, OverflowError):
        return None
    return clock


def wait_while_busy(script: threading.Thread, stop: Callable[[], bool], window_s: float = WINDOW_S,
                    busy_share: float = BUSY_SHARE, max_wait_s: float = MAX_WAIT_S) -> None:
    """Return once ``script`` spent less than ``busy_share`` of a ``window_s`` sample on a CPU,
    once ``stop()`` is true, after ``max_wait_s``, or at once where its CPU clock cannot be read.
    Never raises."""
    clock = cpu_clock(script)
    if clock is None:
        return
    deadline = time.monotonic() + max_wait_s
    try:
        while not stop() and time.monotonic() < deadline:
            before = time.clock_gettime(clock)
            time.sleep(window_s)
            if time.clock_gettime(clock) - before < busy_share * window_s:
                return
    except OSError:  # the thread ended: nothing left to yield to
        return


def pace_for(script: threading.Thread, stop: Callable[[], bool]) -> Callable[[], None]:
    """``wait_while_busy`` for ``script``, as a pace for ``prewarm_compile_passes``."""
    return lambda: wait_while_busy(script, stop)
