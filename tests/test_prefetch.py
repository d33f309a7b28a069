"""The warm start's prefetch (autotune/job/prefetch.py): a compile racing it is served as without
it, a failed prefetch costs one warning, and exit never waits for it.

The race is made deterministic by fault injection, not by timing: with
``AUTOTUNE_FAULT_INJECT=prefetch:hold`` the prefetch starts only once the compile asks it for
something, so that compile always starts before the prefetch ends and waits for it.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import copy_sqlite

from autotune.cache import Store
from autotune.cache.records import Environment

# Its own copy of the session's signed sweep, which is one per run whichever worker needs it
# first (conftest): a group of its own, so that it and tests/test_hook.py (the suite's largest
# group) can run on both workers rather than end to end on one.
pytestmark = pytest.mark.xdist_group("signed_prefetch")

TESTS = Path(__file__).parent
HOLD = {"AUTOTUNE_FAULT_INJECT": "prefetch:hold", "AUTOTUNE_LOOKUP_TIMEOUT": "60"}


def job(tmp_path: Path, *args: str, name: str, env: dict[str, str]) -> dict[str, Any]:
    """tests/hook_job.py in a fresh process with a fresh Inductor cache; its report and stderr."""
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, str(TESTS / "hook_job.py"), str(out), *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {**json.loads(out.read_text()), "stderr": proc.stderr}


def _winners(url: str) -> dict[str, str]:
    with Store(url) as store:
        return {f"{r.request.op}|{r.request.inputs_key}": r.winner_hash or "" for _, r in store.list_results()}


def _warnings(report: dict[str, Any]) -> list[str]:
    """The job's warnings from autotune (its logger prints them, one line each, to stderr)."""
    return [line for line in report["stderr"].splitlines() if line.startswith("autotune: ")]


def _right_output(report: dict[str, Any]) -> None:
    torch.testing.assert_close(torch.load(report["output"]), torch.load(report["eager_output"]),
                               rtol=1e-3, atol=1e-3)


def test_a_compile_racing_the_prefetch_is_served_from_memory_with_the_same_hits(
        signed_tiny_sweep: str, tmp_path: Path) -> None:
    raced = job(tmp_path, "--cache", signed_tiny_sweep, name="raced", env=HOLD)
    stats = raced["stats"]
    assert raced["benchmarks"] == 0
    assert {k: stats[k] for k in ("hits", "misses", "written", "errors")} == {
        "hits": 2, "misses": 0, "written": 0, "errors": 0}
    assert raced["chosen"] == _winners(signed_tiny_sweep)
    assert stats["prefetch_waits"] >= 1 and stats["prefetch_wait_s"] > 0  # it started before the prefetch ended
    assert stats["prefetched_rows"] >= 2
    assert stats["store_wait_s"] == 0.0  # every lookup was answered from memory, none by the database
    assert not _warnings(raced)
    _right_output(raced)


def test_artifacts_verified_by_the_prefetch_are_loaded_by_a_racing_compile(
        signed_tiny_sweep: str, signing_keys: dict[str, Path], tmp_path: Path) -> None:
    trusted = {**HOLD, "AUTOTUNE_TRUSTED_KEYS": str(signing_keys["writer.pub"])}
    raced = job(tmp_path, "--cache", signed_tiny_sweep, name="artifacts", env=trusted)
    stats = raced["stats"]
    assert raced["benchmarks"] == 0
    assert stats["artifacts_loaded"] >= 1 and stats["artifacts_rejected"] == 0 and stats["errors"] == 0
    assert stats["prefetched_artifacts"] >= 1 and stats["prefetch_waits"] >= 1
    assert not _warnings(raced)
    _right_output(raced)


def test_a_bad_signature_costs_one_warning_and_nothing_else(signed_tiny_sweep: str, signing_keys: dict[str, Path],
                                                            tmp_path: Path) -> None:
    path = Path(signed_tiny_sweep.removeprefix("sqlite:///"))
    tampered = copy_sqlite(path, tmp_path / "tampered.db")
    with sqlite3.connect(tampered.removeprefix("sqlite:///")) as conn:
        conn.execute("UPDATE artifacts SET signature = randomblob(length(signature)) WHERE signature IS NOT NULL")
    env = {"AUTOTUNE_TRUSTED_KEYS": str(signing_keys["writer.pub"])}
    report = job(tmp_path, "--cache", tampered, name="tampered", env=env)
    stats = report["stats"]
    warnings = _warnings(report)
    assert len(warnings) == 1 and "rejected" in warnings[0] and "did not verify" in warnings[0], warnings
    assert stats["artifacts_loaded"] == 0 and stats["artifacts_rejected"] >= 1
    assert stats["prefetched_artifacts"] == 0  # verified in the background, and refused
    assert report["benchmarks"] == 0 and stats["hits"] == 2 and stats["errors"] == 0  # the winners still serve
    _right_output(report)


def test_a_cache_that_is_down_costs_the_prefetch_one_warning_and_no_lookup_waits(
        caplog: pytest.LogCaptureFixture) -> None:
    import autotune

    caplog.set_level(logging.WARNING, logger="autotune")
    handle = autotune.warm_start("postgresql://postgres@127.0.0.1:1/test")  # nothing listens on port 1
    try:
        prefetch = handle._policy.prefetch
        assert prefetch is not None and prefetch.wait_done(60)
        env = Environment("cpu", "a cpu", torch.__version__, None, None, "hash", "config")
        began = time.perf_counter()
        assert handle._policy._lookup_stored(env, "a request") is None  # the cache is off: no query, no wait
        assert time.perf_counter() - began < 0.5
        assert handle.stats.errors == 1 and handle.stats.prefetch_waits == 0
    finally:
        handle.uninstall()
    warnings = [r for r in caplog.records if r.name.startswith("autotune") and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "kernel cache unavailable" in warnings[0].getMessage()


_SLOW_STORE_IMPORTS = """
import importlib, sys, time
from autotune.job import serve_policy, store_imports
from autotune.settings import Settings
ended = []
def slow_imports():
    time.sleep(1.0)
    importlib.import_module("autotune.cache.store")
    ended.append(time.monotonic())
store_imports._import_store_modules = slow_imports
policy = serve_policy.ServePolicy(Settings(cache=sys.argv[1]))
policy.store.open_patiently()  # the prefetch's first step, on the thread that asks
opened = time.monotonic()
print("imported first" if ended and ended[0] <= opened else "raced")
"""


def test_the_prefetch_opens_the_store_only_once_the_imports_thread_has_imported_it(tmp_path: Path) -> None:
    """SQLAlchemy imported by two threads at once hands one of them unfinished modules
    ("No module named 'sqlalchemy.sql._dml_constructors'"), which disabled a job's cache."""
    done = subprocess.run([sys.executable, "-c", _SLOW_STORE_IMPORTS, f"sqlite:///{tmp_path / 'cache.db'}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "imported first"


def test_exit_does_not_wait_for_a_prefetch_in_flight(tmp_path: Path) -> None:
    code = ("import time, autotune\n"
            f"handle = autotune.warm_start('sqlite:///{tmp_path / 'cache.db'}')\n"
            "assert not handle._policy.prefetch.wait_done(0.2), 'the prefetch should be held up'\n"
            "print(time.time(), flush=True)\n")
    env = {**os.environ, "AUTOTUNE_FAULT_INJECT": "prefetch:hang"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    exited = time.time()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert exited - float(proc.stdout.split()[-1]) < 10.0  # torch's own teardown; never the prefetch


def test_a_triton_modules_key_names_the_platform_without_running_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The platform in a Triton module's key (autotune/job/triton_modules.py) is read without a
    process on the compile's thread, and reads the same where no ``file`` command is installed."""
    import platform
    import struct

    from autotune.job import triton_modules

    def no_process(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a process was started: {args}")

    triton_modules._platform.cache_clear()
    monkeypatch.setattr(subprocess, "Popen", no_process)
    monkeypatch.setenv("PATH", "")
    try:
        parts = triton_modules._platform()
    finally:
        triton_modules._platform.cache_clear()
    assert parts == (platform.machine(), platform.system(), f"{struct.calcsize('P') * 8}bit")


def test_a_fetch_that_must_not_wait_is_a_miss_while_the_prefetch_has_not_reached_it(
        signing_keys: dict[str, Path]) -> None:
    """Triton's modules are built rather than waited for (autotune/job/triton_modules.py): with
    ``wait=False`` the tier neither waits for a prefetch that has not listed its artifacts nor
    asks the database."""
    from autotune.cache import signing
    from autotune.cache.records import ARTIFACT_TRITON_MODULE
    from autotune.job.artifacts import ArtifactTier
    from autotune.job.hook_stats import HookStats
    from autotune.job.prefetch import FAULT_HANG, Prefetch

    stats, asked = HookStats(), []
    trusted = signing.load_trusted([signing_keys["writer.pub"]])
    prefetch = Prefetch(open_store=lambda: pytest.fail("a hung prefetch opens no store"), disable=lambda exc: None,
                        stats=stats, device_kind="cpu", device_name=lambda: "cpu", trusted=trusted,
                        max_bytes=1 << 20, timeout=60.0, fault=FAULT_HANG)
    prefetch.start()
    tier = ArtifactTier(trusted=trusted, signer=None, device="cpu", stats=stats,
                        call=lambda fn, timeout: asked.append(fn), submit=lambda work: work(), timeout=60.0,
                        prefetched=prefetch)
    began = time.perf_counter()
    assert tier.fetch(ARTIFACT_TRITON_MODULE, "a module", wait=False) is None
    assert time.perf_counter() - began < 1.0
    assert (stats.prefetch_waits, asked) == (0, [])
    prefetch.close()  # a closed prefetch has settled: the fetch goes on to the database
    assert tier.fetch(ARTIFACT_TRITON_MODULE, "a module", wait=False) is None and len(asked) == 1


# ------------------------------------------------------------ junk artifact rows

_JUNK_JOB = """
import gc, json, logging, os, sys, threading
import torch
from autotune.cache import Store, signing
from autotune.job.hook_stats import HookStats
from autotune.job.prefetch import Prefetch

logging.basicConfig(level=logging.WARNING, format="%(message)s")
url, key_file = sys.argv[1], sys.argv[2]
store = Store(url)
store.artifacts(limit=1)  # SQLAlchemy's and the driver's memory belongs to the baseline


def rss() -> int:
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


before = rss()
prefetch = Prefetch(open_store=lambda: store, disable=lambda exc: None, stats=HookStats(), device_kind="cpu",
                    device_name=lambda: "cpu", trusted=signing.load_trusted([key_file]), max_bytes=256 << 20,
                    timeout=60.0)
prefetch.start()
assert prefetch.wait_done(120)
after = rss()
held = {f"{k}:{key}": len(a.payload) for (k, key), a in prefetch._artifacts.items() if a is not None and a.payload}
print(json.dumps({"grew": after - before, "read": prefetch.bytes_read, "kept": prefetch.bytes_held,
                  "dropped": prefetch.dropped, "held": held, "loaded": prefetch.stats.prefetched_artifacts}))
"""
JUNK_MIB = 40


def _plant_junk(url: str, public_key: bytes | None, rows: int, *, first: int = 0) -> None:
    """Rows that claim a trusted signer and a size of 1 byte over a large payload whose signature
    is random (or absent): as anyone with write access to the table can plant them."""
    from autotune.cache import signing
    from autotune.cache.artifacts_store import key_hash
    from autotune.cache.records import ARTIFACT_FX_GRAPH

    signer = signing.fingerprint(public_key) if public_key else signing.fingerprint(os.urandom(32))
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        for i in range(first, first + rows):
            key = f"junk-{i}"
            conn.execute(
                "INSERT INTO artifacts (kind, key_hash, key, digest, size, payload, signature, public_key, signer,"
                " torch_version, device, host, created_at) VALUES (?, ?, ?, 'x', 1, randomblob(?), ?, ?, ?, ?,"
                " 'cpu', 'planted', '2026-01-01 00:00:00.000000')",
                (ARTIFACT_FX_GRAPH, key_hash(key), key, JUNK_MIB << 20, os.urandom(64) if i % 2 else None,
                 public_key if i % 2 else None, signer, torch.__version__))


def test_junk_artifact_rows_never_raise_a_jobs_memory(signing_keys: dict[str, Path], tmp_path: Path) -> None:
    """Rows naming a trusted signer, each saying it holds 1 byte over 40 MiB that do not verify:
    the prefetch reads them (within its budget), keeps none, and says so once. The job's
    resident memory after the prefetch is measured in a process of its own."""
    from autotune.cache import signing
    from autotune.cache.records import Artifact

    url = f"sqlite:///{tmp_path / 'cache.db'}"
    public_key = signing.load_public_key(signing_keys["writer.pub"])
    writer = signing.load_signer(signing_keys["writer"])
    with Store(url) as store:  # one artifact the job would serve: it is kept
        payload = b"a compiled graph" * 64
        store.put_artifact(Artifact("fx_graph", "served", payload, writer.sign("fx_graph", "served", payload),
                                    writer.public_key, torch.__version__, "cpu", "here"))
    _plant_junk(url, public_key, 10)
    proc = subprocess.run([sys.executable, "-c", _JUNK_JOB, url, str(signing_keys["writer.pub"])],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout)
    assert found["held"] == {"fx_graph:served": len(payload)} and found["loaded"] == 1
    assert found["kept"] == len(payload) and found["read"] == len(payload) + 10 * (JUNK_MIB << 20)
    assert found["dropped"] == {"bad_signature": 5, "unsigned": 5}
    assert found["grew"] < (JUNK_MIB << 20) // 2, found  # not one junk payload's worth (400 MiB were read)
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("autotune: ")]
    assert len(warnings) == 1 and "rejected 10 stored artifacts" in warnings[0], proc.stderr[-2000:]


def test_the_prefetch_reads_no_payload_past_its_budget(signing_keys: dict[str, Path], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget counts the bytes read, not the rows' size column: past it the database is asked
    for each payload's length and the payload is left unread."""
    from autotune.cache import signing
    from autotune.job import prefetch as module
    from autotune.job.hook_stats import HookStats

    url = f"sqlite:///{tmp_path / 'cache.db'}"
    with Store(url) as store:
        store.connect()  # the schema
    _plant_junk(url, signing.load_public_key(signing_keys["writer.pub"]), 5)
    monkeypatch.setattr(module, "MAX_PREFETCH_BYTES", (2 * JUNK_MIB + 1) << 20)
    with Store(url) as store:
        prefetch = module.Prefetch(open_store=lambda: store, disable=lambda exc: None, stats=HookStats(),
                                   device_kind="cpu", device_name=lambda: "cpu",
                                   trusted=signing.load_trusted([signing_keys["writer.pub"]]),
                                   max_bytes=256 << 20, timeout=60.0)
        prefetch.start()
        assert prefetch.wait_done(120)
    assert prefetch.bytes_read == 2 * (JUNK_MIB << 20) and prefetch.bytes_held == 0
    assert all(held is None or not held.payload for held in prefetch._artifacts.values())
