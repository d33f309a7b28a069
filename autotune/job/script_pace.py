"""Work the background install may skip goes mostly while the script leaves the CPU idle.

The install on a thread (autotune/job/background.py; the opt-in, ``AUTOTUNE_BACKGROUND_INSTALL=1``:
the default start-up has no such work and never paces) overlaps the script's model building. Work the
first compile needs (the hook, the prefetch) must be done by then, whatever it costs the script.
Work it may not need, Inductor's pattern passes (a compile whose graphs the cache serves whole
runs none of them), is worth doing only in time the script leaves free: while it sleeps, reads
files or the network, or waits on a lock or another process. Beside a script busy in Python the
two take turns on the GIL, and the script's building takes longer by the work's length. So before
each piece of such work the install samples the script thread's CPU clock and waits while the
script is busy. A CPU clock cannot tell Python from C: a script busy in torch's kernels, or in a
CUDA call that spins on the CPU while it waits for the GPU, counts as busy too, and the work is
left to the compile, as without the background install.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# One sample: the install sleeps this long (holding no GIL) and reads how much of it the script
# spent on a CPU. A script that used less than BUSY_SHARE of it is idle.
WINDOW_S = 0.05
BUSY_SHARE = 0.2
# How long the work waits at most, all its pieces together; past it, it runs beside the busy
# script. A script whose other thread waits for the install (Inductor's selector is held until it
# ends) while its own thread spins for that thread's result must not wait for good.
MAX_WAIT_S = 10.0


def own_cpu_clock() -> int | None:
    """The calling thread's CPU-time clock, None where the platform has none (macOS, Windows).

    Read on the thread itself: a thread's pthread handle must not be used from another thread
    once it may have ended. The clock names the kernel's thread; a read of it after the thread
    ended fails (OSError), or, once the kernel gives its id to a new thread, reads that one's,
    which costs a wrong sample at most."""
    getter = getattr(time, "pthread_getcpuclockid", None)
    if getter is None:
        return None
    try:
        clock: int = getter(threading.get_ident())
        time.clock_gettime(clock)
    except (OSError, ValueError, OverflowError):
        return None
    return clock


class Pace:
    """Before each piece of work, ``wait()`` returns once the script with CPU clock ``clock``
    spent less than ``BUSY_SHARE`` of a ``WINDOW_S`` sample on a CPU, once ``hurry()`` is true
    (something waits for the work to end), or once the pieces have waited ``MAX_WAIT_S`` in all;
    at once without a clock. Never raises. The module's settings are read at each call."""

    def __init__(self, clock: int | None, hurry: Callable[[], bool]) -> None:
        self._clock = clock
        self._hurry = hurry
        self._waited_s = 0.0

    def wait(self) -> None:
        if self._clock is None:
            return
        began = time.monotonic()
        try:
            self._wait_while_busy(self._clock, began + max(0.0, MAX_WAIT_S - self._waited_s))
        except OSError:  # the script's thread ended: nothing left to yield to
            self._clock = None
        finally:
            self._waited_s += time.monotonic() - began

    def _wait_while_busy(self, clock: int, deadline: float) -> None:
        while not self._hurry() and time.monotonic() < deadline:
            window = WINDOW_S
            before = time.clock_gettime(clock)
            time.sleep(window)
            if time.clock_gettime(clock) - before < BUSY_SHARE * window:
                return
