"""With ``AUTOTUNE_BACKGROUND_INSTALL=1``, ``autotune.warm_start()`` returns at once and installs
the hook on a thread; ``torch.compile`` waits for the install (autotune/background.py,
autotune/compile_gate.py). Off by default: the hook installs before warm_start() returns."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
import torch

import autotune
from autotune import background, compile_gate


def test_torch_compile_waits_for_the_install_and_is_torchs_own_again_after(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune import hook

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
    from autotune import hook

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


@pytest.mark.parametrize("env", [{}, {"AUTOTUNE_BACKGROUND_INSTALL": "1", "AUTOTUNE_PREFETCH": "0"}])
def test_by_default_or_without_the_prefetch_the_hook_installs_before_warm_start_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    from autotune import hook

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with autotune.warm_start(f"sqlite:///{tmp_path / 'cache.db'}") as handle:
        assert isinstance(handle, hook.WarmStart) and hook._active is handle
        assert not hasattr(torch.compile, "__wrapped__")


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
