"""The warm start's threads end before the interpreter finalizes (autotune/exit_wait.py): a
script that exits while its install, the store's imports or the prefetch still run exits 0,
quietly. One that did not (CI, under load) aborted after its last line with "terminate called
without an active exception"."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from autotune import exit_wait
from autotune.serve_policy import ServePolicy
from autotune.settings import Settings

# The install is held for a second, so the script ends while it runs; an ordinary atexit
# function runs after threading's exit functions and before the interpreter finalizes: it
# lists the threads still alive then.
EARLY_EXIT = """
import atexit, sys, threading, time
from autotune import hook
install = hook._install
def held_install(settings):
    time.sleep(1.0)
    return install(settings)
hook._install = held_install
import autotune
def alive():
    print(sorted(t.name for t in threading.enumerate() if t.name.startswith("autotune-") and t.is_alive()))
atexit.register(alive)
handle = autotune.warm_start(sys.argv[1])
print(type(handle).__name__, flush=True)
"""


def test_a_script_that_exits_during_the_install_waits_for_its_threads_and_exits_quietly(tmp_path: Path) -> None:
    env = {**os.environ, "AUTOTUNE_BACKGROUND_INSTALL": "1", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([sys.executable, "-c", EARLY_EXIT, f"sqlite:///{tmp_path / 'cache.db'}"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    pending, alive_at_exit = done.stdout.splitlines()[-2:]
    assert pending == "PendingWarmStart"  # the script did end before its install
    assert alive_at_exit == "[]"
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
    exit_wait.finish_before_exit(ended)
    exit_wait.finish_before_exit(stoppable, stop=stopped.set)
    exit_wait.finish_before_exit(stuck)
    assert [thread for thread, _ in exit_wait._waiting] == [stoppable, stuck]  # an ended thread is not kept
    exit_wait._finish()
    assert exit_wait.exiting()
    assert not stoppable.is_alive()
    assert stuck.is_alive()  # left to the process after the bound, as a daemon
    assert exit_wait._waiting == []


def test_a_store_call_after_uninstall_is_dropped_without_disabling_or_warning(
        sqlite_url: str, caplog: pytest.LogCaptureFixture) -> None:
    policy = ServePolicy(Settings(cache=sqlite_url))
    policy.close()
    with caplog.at_level(logging.WARNING):
        assert policy._call(lambda store: "answered") is None  # the executor is shut
    assert policy.stats.errors == 0
    assert not caplog.records
