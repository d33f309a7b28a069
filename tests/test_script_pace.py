"""The background install's optional work waits while the script is busy on a CPU
(autotune/script_pace.py): it goes at once beside a sleeping script, not before a busy one has
stopped, and never past ``stop()`` or its limit."""

from __future__ import annotations

import threading
import time

import pytest

from autotune import script_pace

pytestmark = pytest.mark.skipif(not hasattr(time, "pthread_getcpuclockid"),
                                reason="the platform has no per-thread CPU clock: the pace never waits there")


def _script(body: str, until: threading.Event, marks: dict[str, float]) -> threading.Thread:
    """A thread that spins on the CPU or sleeps until ``until`` is set, noting when it stopped."""

    def run() -> None:
        while not until.is_set():
            if body == "sleep":
                until.wait(0.01)
            else:
                sum(range(2000))
        marks["stopped"] = time.perf_counter()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_the_pace_goes_at_once_beside_a_sleeping_script() -> None:
    until, marks = threading.Event(), {}
    script = _script("sleep", until, marks)
    began = time.perf_counter()
    script_pace.wait_while_busy(script, stop=lambda: False)
    waited = time.perf_counter() - began
    until.set()
    script.join()
    assert "stopped" in marks and waited < 1.0  # one or two samples, never the script's 1 s+


def test_the_pace_waits_until_a_busy_script_stops() -> None:
    until, marks = threading.Event(), {}
    script = _script("spin", until, marks)
    threading.Timer(0.6, until.set).start()
    script_pace.wait_while_busy(script, stop=lambda: False)
    returned = time.perf_counter()
    script.join()
    assert returned >= marks["stopped"]


def test_stop_ends_the_wait_beside_a_busy_script() -> None:
    until, marks = threading.Event(), {}
    script = _script("spin", until, marks)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    script_pace.wait_while_busy(script, stop=stop.is_set)
    still_spinning = not until.is_set()
    until.set()
    script.join()
    assert stop.is_set() and still_spinning


def test_the_wait_beside_a_busy_script_has_a_limit() -> None:
    until, marks = threading.Event(), {}
    script = _script("spin", until, marks)
    script_pace.wait_while_busy(script, stop=lambda: False, max_wait_s=0.3)
    still_spinning = not until.is_set()
    until.set()
    script.join()
    assert still_spinning


def test_a_thread_that_ended_is_not_waited_for() -> None:
    script = threading.Thread(target=lambda: None)
    script.start()
    script.join()
    script_pace.wait_while_busy(script, stop=lambda: False)  # returns at once: no clock is read of it
