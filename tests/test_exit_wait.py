"""The warm start's threads end before the interpreter finalizes (autotune/job/exit_wait.py): a
script that exits while its install or the store's imports still run exits 0, quietly, and the
prefetch is asked to end but never waited for. Without this a CI job aborted after its last
line with "terminate called without an active exception"."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autotune.job import exit_wait
from autotune.job.serve_policy import ServePolicy
from autotune.settings import Settings

# The install's imports take a second longer (a module of the test's own among them), so the
# script ends while they run; an ordinary atexit function runs after threading's exit functions
# and before the interpreter finalizes: it shows what still runs then, and whether the hook was
# installed.
EARLY_EXIT = """
import atexit, sys, threading
sys.path.insert(0, sys.argv[2])
from autotune.job import background, hook
background.GATED_IMPORTS = (*background.GATED_IMPORTS, "slow_to_import")
import autotune
def at_exit():
    print(sorted(t.name for t in threading.enumerate() if t.name.startswith("autotune-") and t.is_alive()))
    print(hook._active)
atexit.register(at_exit)
handle = autotune.warm_start(sys.argv[1])
print(type(handle).__name__, flush=True)
"""


def test_a_script_that_exits_during_the_install_skips_it_waits_for_its_thread_and_exits_quietly(
        tmp_path: Path) -> None:
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(1.0)\n")
    env = {**os.environ, "AUTOTUNE_BACKGROUND_INSTALL": "1", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([sys.executable, "-c", EARLY_EXIT, f"sqlite:///{tmp_path / 'cache.db'}", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    pending, alive_at_exit, installed = done.stdout.splitlines()[-3:]
    assert pending == "PendingWarmStart"  # the script did end before its install
    assert alive_at_exit == "[]"  # the install's thread ended before the interpreter finalized
    assert installed == "None"  # what was left of the install was not done
    assert "autotune:" not in done.stderr  # no warning about an install or a cache torn down by the exit


def test_the_exit_asks_each_thread_to_stop_then_joins_it_within_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped = threading.Event()
    stoppable = threading.Thread(target=stopped.wait, daemon=True)
    stuck = threading.Thread(target=threading.Event().wait, daemon=True)  # never asked, never ends
    stoppable.start()
    stuck.start()
    monkeypatch.setattr(exit_wait, "_waiting", [])
    monkeypatch.setattr(exit_wait, "_registered", True)  # the interpreter's own exit is not part of this test
    monkeypatch.setattr(exit_wait, "EXIT_WAIT_S", 0.5)
    monkeypatch.setattr(exit_wait, "_exiting", threading.Event())  # this test process goes on
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    asked, slow_to_end = threading.Event(), threading.Event()
    not_waited = threading.Thread(target=lambda: (asked.wait(), slow_to_end.wait(5)), daemon=True)  # the prefetch
    not_waited.start()
    exit_wait.finish_before_exit(ended)
    exit_wait.finish_before_exit(stoppable, stop=stopped.set)
    exit_wait.finish_before_exit(stuck)
    exit_wait.stop_at_exit(not_waited, stop=asked.set)
    assert [entry[0] for entry in exit_wait._waiting] == [stoppable, stuck, not_waited]  # an ended thread is not kept
    began = time.monotonic()
    exit_wait._finish()
    assert exit_wait.exiting()
    assert not stoppable.is_alive()
    assert stuck.is_alive()  # left to the process after the bound, as a daemon
    assert asked.is_set() and not_waited.is_alive()  # asked to end, and not waited for
    assert time.monotonic() - began < 2.0  # the stuck thread's 0.5 s bound, not the other's 5 s
    assert exit_wait._waiting == []
    slow_to_end.set()


def test_a_store_call_after_uninstall_is_dropped_without_disabling_or_warning(
        sqlite_url: str, caplog: pytest.LogCaptureFixture) -> None:
    policy = ServePolicy(Settings(cache=sqlite_url))
    policy.close()
    with caplog.at_level(logging.WARNING):
        assert policy.store.call(lambda store: "answered") is None  # the executor is shut
    assert policy.stats.errors == 0
    assert not caplog.records


def test_a_store_worker_drains_at_exit_and_gives_up_a_stuck_call_with_one_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The hook's store calls run on daemon workers: at exit, queued writes to a database that
    answers all finish, each within the worker's stall_s (the lookup timeout plus a grace); a call
    the database never answers is given up stall_s after it started, with one warning, however
    long it would hang."""
    monkeypatch.setattr(exit_wait, "_waiting", [])
    monkeypatch.setattr(exit_wait, "_workers", [])
    monkeypatch.setattr(exit_wait, "_registered", True)
    monkeypatch.setattr(exit_wait, "_exiting", threading.Event())
    writes: list[int] = []
    answering = exit_wait.DaemonWorker("autotune-test-save", stall_s=0.5)
    for index in range(20):  # 20 x 0.05 s: twice the stall bound in all, but each call finishes within it
        answering.submit(lambda index=index: (time.sleep(0.05), writes.append(index)))
    never = threading.Event()
    stuck = exit_wait.DaemonWorker("autotune-test-cache", stall_s=0.5)
    stuck.submit(never.wait)
    queued_behind = stuck.submit(lambda: "never runs")
    assert answering._thread is not None and answering._thread.daemon  # concurrent.futures' exit never joins it
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="autotune.job.exit_wait"):
        exit_wait._finish()
    waited = time.monotonic() - began
    assert writes == list(range(20))  # every queued write was stored
    assert 0.9 <= waited < 3.0, waited  # the answering queue's ~1 s; the stuck call's 0.5 s bound passed meanwhile
    assert not queued_behind.done() and stuck.pending == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "2 cache call(s) still waited for the database" in warnings[0], warnings
    never.set()
    assert queued_behind.result(timeout=5) == "never runs"


def test_a_shut_worker_runs_what_was_queued_and_refuses_new_calls() -> None:
    worker = exit_wait.DaemonWorker("autotune-test", stall_s=1.0)
    gate = threading.Event()
    first = worker.submit(gate.wait)
    second = worker.submit(lambda: "ran")
    worker.shutdown(wait=False)
    with pytest.raises(RuntimeError):
        worker.submit(lambda: None)
    gate.set()
    assert first.result(timeout=5) is True and second.result(timeout=5) == "ran"
    assert worker._thread is not None
    worker._thread.join(5)
    assert not worker.alive() and worker.pending == 0


def test_a_call_stuck_since_long_before_the_exit_is_given_up_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup its caller gave up on long ago (the database stalled at the job's first compile)
    costs the exit nothing more: its stall_s ran out before the exit began."""
    monkeypatch.setattr(exit_wait, "_waiting", [])
    monkeypatch.setattr(exit_wait, "_workers", [])
    monkeypatch.setattr(exit_wait, "_registered", True)
    monkeypatch.setattr(exit_wait, "_exiting", threading.Event())
    never = threading.Event()
    worker = exit_wait.DaemonWorker("autotune-test-cache", stall_s=0.3)
    worker.submit(never.wait)
    time.sleep(0.5)
    began = time.monotonic()
    exit_wait._finish()
    assert time.monotonic() - began < 0.2 and worker.pending == 1
    never.set()


def test_a_store_workers_thread_ends_when_idle_and_the_next_call_starts_another(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A job keeps no idle thread of ours: the worker's thread ends once it waited IDLE_S for a
    call, the next call runs on a new one, and the exit still waits for that one's calls."""
    monkeypatch.setattr(exit_wait, "_waiting", [])
    monkeypatch.setattr(exit_wait, "_workers", [])
    monkeypatch.setattr(exit_wait, "_registered", True)
    monkeypatch.setattr(exit_wait, "_exiting", threading.Event())
    monkeypatch.setattr(exit_wait, "IDLE_S", 0.1)
    worker = exit_wait.DaemonWorker("autotune-test-cache", stall_s=2.0)
    first = worker.submit(threading.current_thread).result(timeout=5)
    assert first.name == "autotune-test-cache"
    first.join(5)
    assert not first.is_alive() and not worker.alive() and worker._thread is None
    gate = threading.Event()
    held = worker.submit(gate.wait)
    later = worker.submit(lambda: "second")
    assert worker._thread is not None and worker._thread is not first and worker.alive()
    assert exit_wait._workers == [worker]  # registered once, however often its thread came back
    threading.Timer(0.3, gate.set).start()
    began = time.monotonic()
    exit_wait._finish()  # the call in flight is within stall_s: the exit waits for it and the one queued
    assert 0.2 <= time.monotonic() - began < 2.0
    assert held.result(timeout=0) is True and later.result(timeout=0) == "second"


def test_calls_submitted_as_the_idle_thread_ends_all_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exit_wait, "IDLE_S", 0.001)
    worker = exit_wait.DaemonWorker("autotune-test-cache", stall_s=2.0)
    results = []
    for index in range(200):
        results.append(worker.submit(lambda index=index: index))
        time.sleep(0.0005 * (index % 5))
    assert [future.result(timeout=5) for future in results] == list(range(200))
    worker.shutdown()


def test_shutdown_with_wait_returns_once_the_queued_calls_ran() -> None:
    worker = exit_wait.DaemonWorker("autotune-test-save", stall_s=1.0)
    ran: list[int] = []
    worker.submit(lambda: (time.sleep(0.2), ran.append(1)))
    worker.shutdown(wait=False)  # the uninstall's
    worker.shutdown(wait=True)  # a test's, after it
    assert ran == [1] and worker.pending == 0 and not worker.alive()
