"""While the hook installs on a thread, the script's imports wait for the install's
(autotune/job/import_gate.py): torch's modules, imported by two threads at once, hand each other
unfinished modules."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.job import import_gate

pytestmark = pytest.mark.background_install  # the gate is the opt-in install on a thread's


@pytest.fixture()
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for this test's modules (gated, as torch's are), and the gate in Python's import."""
    gated = {"gate_slow", "gate_script", "gate_own", "gate_outer", "gate_inner", "gate_handler"}
    monkeypatch.setattr(import_gate, "GATED_PACKAGES", import_gate.GATED_PACKAGES | gated)
    assert import_gate.install()
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        import_gate.uninstall()


def _write(folder: Path, **sources: str) -> None:
    for name, text in sources.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(text))


def test_the_scripts_import_waits_until_the_install_has_imported(modules: Path) -> None:
    _write(modules, gate_slow="import time\ntime.sleep(0.5)\nENDED = time.monotonic()\n",
           gate_script="import time\nSTARTED = time.monotonic()\n")
    thread = threading.Thread(target=lambda: __import__("gate_slow"), name="autotune-install")
    opening = import_gate.close(thread)
    waits = import_gate.waits()
    thread.start()
    time.sleep(0.1)  # the install is inside its import

    def install_ends() -> None:
        thread.join()
        opening()

    threading.Thread(target=install_ends).start()
    import gate_script  # type: ignore[import-not-found]
    import gate_slow  # type: ignore[import-not-found]
    assert gate_script.STARTED >= gate_slow.ENDED
    assert import_gate.waits() == waits + 1


def test_the_hooks_own_threads_finished_modules_and_other_packages_never_wait(modules: Path) -> None:
    _write(modules, gate_own="VALUE = 1\n", not_gated="VALUE = 2\n")
    opening = import_gate.close(threading.Thread(target=lambda: None, name="autotune-install"))
    try:
        waits = import_gate.waits()
        imported: list[object] = []
        own = threading.Thread(target=lambda: imported.append(__import__("gate_own")), name="autotune-prefetch")
        own.start()
        own.join(timeout=5)
        import json  # noqa: F401 - complete already: no wait

        import not_gated  # type: ignore[import-not-found]  # the script's own module: no wait

        assert imported and not_gated.VALUE == 2 and import_gate.waits() == waits
    finally:
        opening()


def test_a_wait_ends_where_the_install_needs_a_module_the_script_is_importing(modules: Path) -> None:
    """The script called warm_start() inside an import of its own, which the install needs."""
    _write(modules,
           gate_outer="""
               import threading, time
               from autotune.job import import_gate
               install = threading.Thread(target=lambda: __import__("gate_outer"), name="autotune-install")
               opening = import_gate.close(install)
               install.start()
               time.sleep(0.2)  # the install waits for this module's lock
               STARTED = time.monotonic()
               import gate_inner
               WAITED = time.monotonic() - STARTED
           """,
           gate_inner="VALUE = 1\n")
    import gate_outer  # type: ignore[import-not-found]

    gate_outer.install.join(timeout=5)
    gate_outer.opening()
    assert not gate_outer.install.is_alive()
    assert gate_outer.WAITED < import_gate.STALL_S / 2


def test_a_wait_ends_where_the_install_imports_nothing_more(modules: Path) -> None:
    """The install waits for a lock the script holds that the gate cannot see (logging's, while
    ``dictConfig`` imports a handler): the script goes on after ``STALL_S``, never for good."""
    _write(modules, gate_handler="VALUE = 1\n")
    script_lock = threading.Lock()
    script_lock.acquire()
    install = threading.Thread(target=lambda: script_lock.acquire(timeout=30), name="autotune-install")
    opening = import_gate.close(install)
    install.start()
    started = time.monotonic()
    import gate_handler  # type: ignore[import-not-found]  # noqa: F401

    waited = time.monotonic() - started
    script_lock.release()
    install.join(timeout=5)
    opening()
    assert import_gate.STALL_S <= waited < import_gate.STALL_S + 2


_SCRIPT = """
import sys
import autotune
handle = autotune.warm_start(sys.argv[1])
# At once, while the hook installs: torch's modules that Inductor's imports import too.
import torch._dynamo, torch._functorch.aot_autograd, torch._inductor.utils, torch._inductor.ir
import torch._inductor.lowering, torch._inductor.scheduler, torch._dynamo.utils
import torch
from autotune.job import import_gate
out = torch.compile(lambda x: x * 2)(torch.ones(3))
print("ok", out.tolist(), "waited", import_gate.waits(), "errors", handle.stats.errors)
"""


def test_a_script_importing_torchs_modules_while_the_hook_installs_gets_them_whole(tmp_path: Path) -> None:
    env = {**os.environ, "AUTOTUNE_BACKGROUND_INSTALL": "1", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, f"sqlite:///{tmp_path / 'cache.db'}"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok [2.0, 2.0, 2.0]" in done.stdout and "errors 0" in done.stdout
    assert int(done.stdout.split("waited ")[1].split()[0]) >= 1  # the first of them waited for the install
