"""The background install's optional work waits while the script is busy on a CPU
(autotune/job/script_pace.py): it goes at once beside a sleeping script, not before a busy one has
stopped, and never past ``hurry()`` or its limit, which all its pieces share."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from autotune.job import script_pace

pytestmark = [pytest.mark.background_install,  # the pace is the opt-in install on a thread's
              pytest.mark.skipif(script_pace.own_cpu_clock() is None,
                                 reason="the platform has no per-thread CPU clock: the pace never waits there")]


class Script:
    """A thread that spins on the CPU or sleeps until stopped, its CPU clock read on itself."""

    def __init__(self, busy: bool) -> None:
        self.clock: int | None = None
        self.stopped_at = 0.0
        self._ready, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, args=(busy,), daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self, busy: bool) -> None:
        self.clock = script_pace.own_cpu_clock()
        self._ready.set()
        if busy:
            while not self._stop.is_set():
                sum(range(2000))
        else:
            self._stop.wait()
        self.stopped_at = time.perf_counter()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def lenient(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A busy script is one that ran at all in a sample: on a loaded CI machine a spinning
    thread may get less than the default fifth of a core, never nothing."""
    monkeypatch.setattr(script_pace, "BUSY_SHARE", 0.02)
    yield


def _timed_wait(pace: script_pace.Pace) -> tuple[float, float]:
    began = time.perf_counter()
    pace.wait()
    returned = time.perf_counter()
    return returned, returned - began


def test_the_pace_goes_at_once_beside_a_sleeping_script() -> None:
    script = Script(busy=False)
    _, waited = _timed_wait(script_pace.Pace(script.clock, hurry=lambda: False))
    script.stop()
    assert waited < 1.0  # one sample or a few, never the 10 s limit


def test_the_pace_waits_until_a_busy_script_stops(lenient: None) -> None:
    script = Script(busy=True)
    threading.Timer(0.6, script.stop).start()
    returned, _ = _timed_wait(script_pace.Pace(script.clock, hurry=lambda: False))
    time.sleep(0.1)
    assert script.stopped_at and returned >= script.stopped_at


def test_hurry_ends_the_wait_beside_a_busy_script(lenient: None) -> None:
    script = Script(busy=True)
    hurry = threading.Event()
    threading.Timer(0.3, hurry.set).start()
    _, waited = _timed_wait(script_pace.Pace(script.clock, hurry=hurry.is_set))
    script.stop()
    assert 0.25 <= waited < 3.0


def test_every_piece_of_work_shares_one_limit(lenient: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(script_pace, "MAX_WAIT_S", 0.4)
    script = Script(busy=True)
    pace = script_pace.Pace(script.clock, hurry=lambda: False)
    _, first = _timed_wait(pace)
    _, second = _timed_wait(pace)
    script.stop()
    assert 0.35 <= first < 3.0 and second < 0.1  # the second piece found the limit spent


def test_without_a_clock_the_pace_goes_at_once() -> None:
    _, waited = _timed_wait(script_pace.Pace(None, hurry=lambda: False))
    assert waited < 0.01


def test_a_script_thread_that_ended_is_not_waited_for() -> None:
    script = Script(busy=False)
    script.stop()
    _, waited = _timed_wait(script_pace.Pace(script.clock, hurry=lambda: False))
    assert waited < 1.0  # its clock reads fail, or read a thread that is idle
