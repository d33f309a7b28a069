"""With ``AUTOTUNE_BACKGROUND_INSTALL=1`` (the opt-in: off by default on every machine),
``autotune.warm_start()`` returns at once and installs the hook on a thread; ``torch.compile`` and
Inductor's selector wait for the install (autotune/job/background.py, autotune/job/compile_gate.py,
inductor_glue/selector_hold.py). Turned off, or without the prefetch, the hook installs before
warm_start() returns (tests/test_default_start.py checks the default). The opt-in's own tier:
``-m background_install`` runs it alone."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import autotune
from autotune.job import background, compile_gate

pytestmark = pytest.mark.background_install


def _background_job(script: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh Python with the install on a thread, its cache in ``tmp_path``; it must exit 0."""
    env = {**os.environ, "AUTOTUNE_BACKGROUND_INSTALL": "1", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([sys.executable, "-c", script, f"sqlite:///{tmp_path / 'cache.db'}", *args], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.torch_subset  # the race was seen on torch 2.11
def test_torch_compile_waits_for_the_install_and_is_torchs_own_again_after(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.job import hook

    original, go = torch.compile, threading.Event()
    install = hook._install

    def held_install(settings: object) -> hook.WarmStart:
        go.wait(30)  # the install is still importing when the script compiles
        return install(settings)  # type: ignore[arg-type]

    monkeypatch.setattr(hook, "_install", held_install)
    monkeypatch.setenv("AUTOTUNE_BACKGROUND_INSTALL", "1")
    handle = autotune.warm_start(f"sqlite:///{tmp_path / 'cache.db'}")
    try:
        assert isinstance(handle, background.PendingWarmStart)
        assert torch.compile is not original and torch.compile.__wrapped__ is original  # type: ignore[attr-defined]
        threading.Timer(0.5, go.set).start()
        compiled = torch.compile(torch.nn.Linear(4, 4))
        assert hook._active is handle.resolved() and hook._active is not None  # installed before compiling
        assert torch.compile is original
        compiled(torch.randn(2, 4))
        assert handle.stats.errors == 0
    finally:
        go.set()
        handle.uninstall()
    assert hook._active is None


def test_an_install_that_fails_is_one_warning_and_the_job_compiles_unserved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from autotune.job import hook

    def broken_install(settings: object) -> hook.WarmStart:
        raise RuntimeError("no Inductor here")

    monkeypatch.setattr(hook, "_install", broken_install)
    monkeypatch.setenv("AUTOTUNE_BACKGROUND_INSTALL", "1")
    caplog.set_level(logging.WARNING, logger="autotune")
    handle = autotune.warm_start(f"sqlite:///{tmp_path / 'cache.db'}")
    out = torch.compile(lambda x: x + 1)(torch.zeros(2))
    assert torch.equal(out, torch.ones(2))
    assert handle.stats.errors == 1 and handle.resolved() is None
    handle.uninstall()  # nothing to take off; no error
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "could not be installed" in warnings[0] and "no Inductor here" in warnings[0]


@pytest.mark.parametrize("env", [{"AUTOTUNE_BACKGROUND_INSTALL": "0"}, {"AUTOTUNE_PREFETCH": "0"}])
def test_turned_off_or_without_the_prefetch_the_hook_installs_before_warm_start_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    from autotune.job import hook

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with autotune.warm_start(f"sqlite:///{tmp_path / 'cache.db'}") as handle:
        assert isinstance(handle, hook.WarmStart) and hook._active is handle
        assert not hasattr(torch.compile, "__wrapped__")
        stats = handle.stats
        assert stats.install_s > 0 and stats.install_wait_s == 0 and stats.passes_prewarmed == 0 \
            and stats.prewarm_s == 0


def test_the_gate_releases_each_hold_and_restores_compile_once_none_is_left() -> None:
    original, waited = torch.compile, []
    first = compile_gate.hold(lambda: waited.append("first"))
    second = compile_gate.hold(lambda: waited.append("second"))
    first()
    assert torch.compile is not original
    torch.compile(lambda x: x)  # a compile call waits for the holds still in place, and compiles lazily
    assert waited == ["second"]
    second()
    assert torch.compile is original


@pytest.mark.torch_subset  # the race was seen on torch 2.11
def test_inductors_selector_reached_during_the_install_waits_for_it_and_keeps_the_users_saver(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Inductor is imported already: the hold is placed before warm_start() returns.
    from torch._inductor import select_algorithm as sa

    from autotune.inductor_glue.inductor import Selector
    from autotune.job import hook

    before, go = sa._ALGORITHM_SELECTOR_CACHE, threading.Event()
    install = hook._install
    monkeypatch.setattr(hook, "_install", lambda settings: (go.wait(30), install(settings))[1])
    monkeypatch.setenv("AUTOTUNE_BACKGROUND_INSTALL", "1")
    handle = autotune.warm_start(f"sqlite:///{tmp_path / 'cache.db'}")
    try:
        threading.Timer(0.5, go.set).start()

        def saver(*args: object) -> None:
            pass

        sa.add_feedback_saver(saver)  # as a script does between warm_start() and torch.compile
        selector = sa._ALGORITHM_SELECTOR_CACHE
        assert isinstance(selector, Selector) and selector.policy is handle.resolved()._policy  # type: ignore[union-attr]
        assert saver in selector.feedback_saver_fns
    finally:
        go.set()
        handle.uninstall()
    assert sa._ALGORITHM_SELECTOR_CACHE is before


@pytest.mark.torch_subset  # the race was seen on torch 2.11
def test_a_failed_install_gives_inductor_its_own_selector_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor import select_algorithm as sa

    from autotune.job import hook

    before = sa._ALGORITHM_SELECTOR_CACHE

    def broken_install(settings: object) -> hook.WarmStart:
        raise RuntimeError("no Inductor here")

    monkeypatch.setattr(hook, "_install", broken_install)
    monkeypatch.setenv("AUTOTUNE_BACKGROUND_INSTALL", "1")
    handle = autotune.warm_start(f"sqlite:///{tmp_path / 'cache.db'}")
    assert handle.resolved() is None and sa._ALGORITHM_SELECTOR_CACHE is before


RACING_JOB = """
import sys, torch, autotune
assert "torch._inductor.select_algorithm" not in sys.modules
handle = autotune.warm_start(sys.argv[1], on_miss="aten")
from torch._inductor import select_algorithm as sa  # races the install thread's own import
called = []
sa.add_feedback_saver(lambda *args: called.append(1))
a, b = torch.randn(2, 8, 64), torch.randn(2, 64, 32)  # a CPU bmm: a C++ template against ATen
out = torch.compile(torch.bmm, mode="max-autotune")(a, b)
assert torch.allclose(out, torch.bmm(a, b), atol=1e-4)
selector = sa._ALGORITHM_SELECTOR_CACHE
stats = handle.stats
print(type(handle).__name__, type(selector).__name__, stats.hits + stats.misses, len(selector.feedback_saver_fns))
"""


def test_a_script_that_reaches_inductor_while_it_is_imported_on_the_thread_is_served(tmp_path: Path) -> None:
    # A fresh process: select_algorithm is not imported yet, so the hold is placed by the
    # meta-path finder at the end of its import, whichever thread imports it first.
    done = _background_job(RACING_JOB, tmp_path)
    kind, selector, lookups, savers = done.stdout.split()
    assert (kind, selector) == ("PendingWarmStart", "Selector")  # the hook's selector, not Inductor's own
    assert int(lookups) >= 1 and int(savers) >= 1  # the hook saw the GEMMs; the script's saver is kept


PREWARMED_JOB = """
import sys, threading, torch, autotune
from torch._inductor.fx_passes import joint_graph, post_grad, pre_grad
from autotune.inductor_glue.seams import FIRST_COMPILE_SETUP
def runs(fn):  # torch 2.15 caches only init_backend_registration's built-in part; the rest probes on each call
    cached = fn if hasattr(fn, "cache_info") else vars(sys.modules[fn.__module__])["_init_builtin_" + fn.__name__[5:]]
    return cached.cache_info().misses
handle = autotune.warm_start(sys.argv[1], on_miss="aten")
for _ in range(20):  # the script's own torch work beside the thread's registration
    torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU())(torch.randn(4, 16)).sum().backward()
handle.resolved()
def set_up():
    return tuple(runs(seam.resolve()) for seam in FIRST_COMPILE_SETUP)
local_map = "torch.distributed.tensor.experimental._func_map" in sys.modules or not torch.distributed.is_available()
print(*set_up(), local_map)
print(*(f.lazy_init.cache_info().currsize for f in (pre_grad, joint_graph, post_grad)))
parked = any(t.name == "autotune-inductor-passes" for t in threading.enumerate())
print(parked == (torch.backends.cuda.is_built() and not torch.cuda.is_available()))
out = torch.compile(torch.nn.Linear(16, 8), mode="max-autotune")(torch.randn(4, 16))
print(joint_graph.lazy_init.cache_info().currsize, tuple(out.shape), *set_up())
"""


@pytest.mark.torch_subset
def test_the_install_on_the_thread_sets_up_the_first_compile_and_registers_the_passes_before_it(
        tmp_path: Path) -> None:
    # A fresh process, where no compile has set anything up: the thread runs what every compile
    # runs once (importing Dynamo's backends, Inductor's code generators, the modules a trace
    # filters from its stack) and registers the pattern passes for this device; the first
    # compile finds all of it done (nothing run a second time). With a CUDA build and no GPU
    # (the torch 2.11 subset's PyPI wheel) the registering thread stays parked: its exit left
    # c10's CUDA guard registry dangling and the first compile crashed (SIGSEGV).
    done = _background_job(PREWARMED_JOB, tmp_path)
    set_up, warmed, parked_where_it_must, compiled = done.stdout.splitlines()[-4:]
    assert set_up == "1 1 1 True"  # each setup ran once, before any compile; the local_map module imported
    assert warmed == "1 1 1"
    assert parked_where_it_must == "True"
    assert compiled == "1 (4, 8) 1 1 1"  # the compile ran none of them again


RACED_JOB = """
import sys, threading, torch, autotune
from autotune.job import hook
from torch._inductor.fx_passes import joint_graph, post_grad, pre_grad
go, install = threading.Event(), hook._install
def held_install(settings):
    go.wait(60)  # still installing when the script compiles: it had no model to build
    return install(settings)
hook._install = held_install
handle = autotune.warm_start(sys.argv[1], on_miss="aten")
threading.Timer(2.0, go.set).start()
model = torch.nn.Linear(16, 8)
compiled = torch.compile(model, mode="max-autotune")  # waits for the install
from autotune.inductor_glue.seams import FIRST_COMPILE_SETUP
def runs(fn):  # torch 2.15 caches only init_backend_registration's built-in part; the rest probes on each call
    cached = fn if hasattr(fn, "cache_info") else vars(sys.modules[fn.__module__])["_init_builtin_" + fn.__name__[5:]]
    return cached.cache_info().misses
def set_up():
    return tuple(runs(seam.resolve()) for seam in FIRST_COMPILE_SETUP)
print(*(f.lazy_init.cache_info().currsize for f in (pre_grad, joint_graph, post_grad)), *set_up())
with torch.no_grad():
    out = compiled(x := torch.randn(4, 16))
print(*(f.lazy_init.cache_info().currsize for f in (pre_grad, joint_graph, post_grad)), *set_up())
print(torch.allclose(out, model(x)), handle.stats.errors)
stats = handle.stats
print(stats.passes_prewarmed, stats.install_wait_s >= 1.0, stats.install_s >= 2.0)
"""


def test_a_compile_that_waits_for_the_install_is_left_to_register_the_passes_itself(tmp_path: Path) -> None:
    # With no model building to hide it behind, setting up the first compile and registering
    # every pass first would only add to the first call (a compile whose graphs the cache serves
    # runs fewer passes): the install leaves them to the compile, which runs what it needs, as
    # without the background install.
    # The stats say so, and how long the compile waited for the install.
    done = _background_job(RACED_JOB, tmp_path)
    registered_before, registered_after, result, stats = done.stdout.splitlines()[-4:]
    assert registered_before == "0 0 0 0 0 0"  # no pass, and none of the first compile's setup
    assert registered_after == "1 1 1 1 1 1"  # by the compile, as it ran them
    assert result == "True 0"  # the right output, no error
    assert stats == "0 True True"  # none prewarmed; the compile waited for the install, held 2 s


BUSY_JOB = """
import sys, time, torch, autotune
from autotune.job import hook, script_pace
script_pace.BUSY_SHARE = 0.02  # busy: ran at all in a sample (a loaded CI machine shares its cores)
from torch._inductor.fx_passes import joint_graph, post_grad, pre_grad
def registered():
    return tuple(f.lazy_init.cache_info().currsize for f in (pre_grad, joint_graph, post_grad))
handle = autotune.warm_start(sys.argv[1], on_miss="aten")
deadline, beside = time.monotonic() + 120, set()
while hook._active is None and time.monotonic() < deadline:  # busy in Python while the install runs
    beside.add(registered())
installed_while_busy = hook._active is not None
end = time.monotonic() + 1.5  # and for a while after: the passes' turn has come
while time.monotonic() < end:
    beside.add(registered())
print(installed_while_busy, sorted(beside))
handle.resolved()  # the script waits, idle: the passes go now
stats = handle.stats
print(*registered(), stats.passes_prewarmed, stats.prewarm_s >= 1.0)
"""


def test_the_install_registers_the_passes_only_once_the_script_leaves_the_cpu_idle(tmp_path: Path) -> None:
    # A served compile may run none of them, and beside a script busy in Python they would take
    # turns with it on the GIL (ResNet's model building on an H200: docs/results.md).
    done = _background_job(BUSY_JOB, tmp_path)
    while_busy, once_idle = done.stdout.splitlines()[-2:]
    assert while_busy == "True [(0, 0, 0)]"
    assert once_idle == "1 1 1 3 True"  # its time counts the 1.5 s it waited its turn


SWITCHED_JOB = """
import sys, torch, autotune
import torch._inductor.config, torch._functorch.config
def switches():
    return (torch._inductor.config.fx_graph_remote_cache, torch._functorch.config.enable_remote_autograd_cache,
            torch._dynamo.config.caching_precompile)
print(*switches())
handle = autotune.warm_start(sys.argv[1], trusted_keys=[sys.argv[2]])
handle.resolved()
print(*switches())
handle.uninstall()
print(*switches())
"""


@pytest.mark.torch_subset  # torch 2.11 keeps one value per option for the process, 2.13 one per thread
def test_the_artifact_tiers_switches_set_on_the_install_thread_reach_the_scripts_thread(
        tmp_path: Path, signing_keys: dict[str, Path]) -> None:
    # torch 2.13 keeps an assigned config option per thread: set on the install's thread alone,
    # the FX graph, AOTAutograd and Dynamo package tiers were off in the script's compiles (a
    # training step lowered its graphs again with every artifact stored). After the uninstall
    # they are as they were: torch 2.11 keeps one value for the process, which the uninstall on
    # the script's thread left on until the undo restored it from any thread.
    done = _background_job(SWITCHED_JOB, tmp_path, str(signing_keys["writer.pub"]))
    before, installed, uninstalled = done.stdout.splitlines()[-3:]
    assert installed == "True True True"
    assert uninstalled == before


def test_the_install_thread_sees_the_config_the_script_assigned_before_warm_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.13 keeps an assigned option per context: the install (which registers the pattern
    passes) runs in a copy of the script's, so it sees what the script set, not torch's defaults."""
    from autotune.job import hook

    seen: list[bool] = []
    install = hook._install

    def recording_install(settings: object) -> hook.WarmStart:
        seen.append(torch._inductor.config.pattern_matcher)
        return install(settings)  # type: ignore[arg-type]

    monkeypatch.setattr(hook, "_install", recording_install)
    monkeypatch.setenv("AUTOTUNE_BACKGROUND_INSTALL", "1")
    assert torch._inductor.config.pattern_matcher is True  # torch's default, which the script changes
    with torch._inductor.config.patch(pattern_matcher=False):
        handle = autotune.warm_start(f"sqlite:///{tmp_path / 'cache.db'}")
        try:
            assert handle.resolved() is not None
        finally:
            handle.uninstall()
    assert seen == [False]


_IMPORT_ORDER = """
import sys, threading, importlib.util
import torch, autotune
handle = autotune.warm_start(sys.argv[1])
handle.stats  # waits for the install
names = list(sys.modules)  # in the order each module's import began
first_inductor = names.index("torch._inductor.compile_fx")
print("store first" if names.index("sqlalchemy") < first_inductor else "store after")
if importlib.util.find_spec("triton") is not None:
    print("triton first" if names.index("triton") < names.index("torch._inductor") else "triton after")
    for thread in threading.enumerate():
        if thread.name == "autotune-triton-key":
            thread.join(120)
    from triton.runtime.cache import triton_key
    print("key hashed" if triton_key.cache_info().currsize == 1 else "key not hashed")
handle.uninstall()
"""


@pytest.mark.torch_subset  # with Triton installed (torch 2.11's wheel), its key is hashed too
def test_the_stores_imports_and_tritons_key_start_before_inductors_imports(tmp_path: Path) -> None:
    """With the install on a thread, both start before Inductor's imports and run beside them, not
    after them, where a compile called at once waited for them (autotune/job/store_imports.py,
    inductor_glue/env.py prewarm_triton_key). The default starts neither (tests/test_default_start.py)."""
    env = {**os.environ, "AUTOTUNE_BACKGROUND_INSTALL": "1", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([sys.executable, "-c", _IMPORT_ORDER, f"sqlite:///{tmp_path / 'cache.db'}"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "store first"
    if len(lines) > 1:  # Triton is installed
        assert lines[1:] == ["triton first", "key hashed"]


_PROBES_AFTER_THE_GATE = """
import importlib, sys
from autotune.job import background
from autotune.inductor_glue.env import import_probe_modules
for name in background._gated_imports():
    importlib.import_module(name)
before = set(sys.modules)
import_probe_modules()
print(sorted(name for name in set(sys.modules) - before if name.partition(".")[0] in ("torch", "setuptools")))
"""


def test_on_a_cpu_job_the_gate_covers_what_the_isa_probes_import_after_it_opens(tmp_path: Path) -> None:
    """A CPU job's install runs the vector-ISA probes after the import gate opens; every torch
    module they import (cpp_extension, and setuptools with it) is imported before it opens, so
    the probes import nothing beside the script's imports (a GPU job, which runs no probes,
    leaves cpp_extension out: autotune/job/background.py)."""
    assert "torch.utils.cpp_extension" in background._gated_imports()
    done = subprocess.run([sys.executable, "-c", _PROBES_AFTER_THE_GATE], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
