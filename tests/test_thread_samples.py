"""benchmarks/thread_samples.py: the sampler a benchmark child runs, and its reports, on this
process's own threads."""

from __future__ import annotations

import importlib
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks import thread_samples


def _spin(seconds: float) -> None:
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        pass


def _sampled(path: Path, work: threading.Thread) -> Path:
    """``work`` run while this thread waits for it, sampled into ``path``."""
    sampler = thread_samples.Sampler(time.perf_counter())
    work.start()
    work.join()
    sampler.stop(path)
    return path


def test_the_cpu_report_charges_a_threads_cpu_to_it_while_the_script_waits(tmp_path: Path) -> None:
    if thread_samples._cpu_ns(threading.current_thread()) is None:
        pytest.skip("this system has no /proc/self/task/TID/schedstat: the sampler records no CPU times")
    path = _sampled(tmp_path / "spin.json", threading.Thread(target=_spin, args=(0.4,), name="autotune-spin"))
    report = thread_samples.cpu_report(path, bucket_s=0.1)
    # The first section's line for the script's wait: "- 0.41 s wait ...: CPU s autotune-spin 0.38; all 0.38"
    waiting = next(line for line in report.splitlines() if line.startswith("- ") and "_wait_for_tstate_lock" in line)
    shares = dict(part.rsplit(" ", 1) for part in waiting.split(": CPU s ")[1].replace(";", ",").split(", "))
    # A machine busy elsewhere (CI runs tests side by side) gives the spinning thread less CPU,
    # but whatever the process used while the script's thread waited was the spinning thread's.
    assert float(shares["autotune-spin"]) > 0, report
    assert float(shares["autotune-spin"]) >= 0.9 * float(shares["all"]), report


def test_the_modules_one_set_of_processes_imported_and_the_other_did_not(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    first = _sampled(tmp_path / "first.json", threading.Thread(target=_spin, args=(0.02,)))
    (tmp_path / "sampled_between.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sampled_between", raising=False)
    importlib.import_module("sampled_between")  # imported between the two samples
    second = _sampled(tmp_path / "second.json", threading.Thread(target=_spin, args=(0.02,)))
    added = thread_samples.module_difference([first], [second]).splitlines()
    assert "sampled_between" in added[1:] and "sampled_between 1" in added[0]
    assert "sampled_between" not in thread_samples.module_difference([second], [first])
