"""The default start-up (``AUTOTUNE_BACKGROUND_INSTALL`` unset, on every machine): the hook installs
before ``warm_start()`` returns and patches nothing of the interpreter's; only the prefetch runs
on a thread, which ends with it (autotune/__init__.py, docs/guide.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import autotune
from autotune.job import hook

# A user's script, as it is written: the set-up call at the top, then the model's build, then
# compile and the first call (a real Inductor compile on this CPU). It reports what the process
# holds of ours afterwards: threads, and each function the opt-in path replaces.
USER_SCRIPT = """
import importlib._bootstrap as bootstrap, json, sys, threading
import torch
originals = {"_find_and_load": bootstrap._find_and_load, "_lock_unlock_module": bootstrap._lock_unlock_module,
             "torch.compile": torch.compile, "Tensor.__repr__": torch.Tensor.__repr__}
import autotune
from autotune.inductor_glue import guard_repr
before = {thread.ident for thread in threading.enumerate()}
handle = autotune.warm_start(sys.argv[1])
device = sys.argv[2]
kind = type(handle).__name__
patched_while_installed = torch.Tensor.__repr__ is not originals["Tensor.__repr__"]
at_return = sorted(thread.name for thread in threading.enumerate() if thread.ident not in before)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
out = torch.compile(model)(x := torch.randn(2, 8, device=device))
correct = torch.allclose(out, model(x), atol=1e-5)
prefetch = handle._policy.prefetch
done = prefetch is not None and prefetch.wait_done(60)
for thread in threading.enumerate():  # a thread whose work is done ends at once, a store worker once idle
    if thread.ident not in before and thread is not threading.current_thread():
        thread.join(5)
now = {"_find_and_load": bootstrap._find_and_load, "_lock_unlock_module": bootstrap._lock_unlock_module,
       "torch.compile": torch.compile, "Tensor.__repr__": torch.Tensor.__repr__}
print(json.dumps({
    "kind": kind, "correct": correct, "prefetch_done": done, "at_return": at_return,
    "ours_left": sorted(t.name for t in threading.enumerate() if t.ident not in before and t.name.startswith("autotune")),
    "replaced": sorted(name for name in now if now[name] is not originals[name]),
    "repr_gate": guard_repr._needed(), "repr_patched_while_installed": patched_while_installed,
    "errors": handle.stats.errors,
    "store_calls_pending": handle._policy.store._pool.pending + handle._policy.store._writer.pending,
    "orm_modules": sorted(name for name in sys.modules if name.startswith("sqlalchemy.orm")),
}))
"""


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: the GPU job's default start-up (the device tool runs it)"))])
def test_after_warm_start_and_the_first_compile_nothing_of_ours_is_left_in_the_process(tmp_path: Path,
                                                                                       device: str) -> None:
    """A fresh process, as a user's script: the hook is installed when warm_start() returns, the
    only thread it started is the prefetch's, and after the first compile no thread of ours is
    alive and Python's import, ``torch.compile`` and ``Tensor.__repr__`` are the originals (the
    last patched only while installed, and only on the torch releases whose guards print:
    inductor_glue/guard_repr.py)."""
    env = {key: value for key, value in os.environ.items() if key != "AUTOTUNE_BACKGROUND_INSTALL"}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), AUTOTUNE_PREFETCH="1")
    done = subprocess.run([sys.executable, "-c", USER_SCRIPT, f"sqlite:///{tmp_path / 'cache.db'}", device],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    left = json.loads(done.stdout.splitlines()[-1])
    assert left["kind"] == "WarmStart"  # installed on the caller's thread, before warm_start() returned
    assert left["correct"] and left["errors"] == 0
    # The cache's reads alone (or done already): the prefetch's, and on a GPU the kernel configs'.
    assert set(left["at_return"]) <= {"autotune-prefetch", "autotune-kernel-configs"}
    assert left["prefetch_done"]
    # No thread of ours is left, on a GPU as on this CPU: the workers the hook's store calls run on
    # (the kernel configs' read, the compile's lookups and writes) end once idle, and the next call
    # starts another (autotune/job/exit_wait.py; docs/internals.md, "What the default start-up leaves behind").
    assert left["ours_left"] == [] and left["store_calls_pending"] == 0
    # The hook is still installed: Tensor.__repr__ is patched only where the gate says so.
    assert left["repr_patched_while_installed"] == left["repr_gate"]
    assert left["replaced"] == (["Tensor.__repr__"] if left["repr_gate"] else [])
    # The store is SQLAlchemy Core alone: the ORM's modules, imported on the prefetch's thread
    # while the script builds its model, would hold the GIL for nothing (cache/models.py).
    assert left["orm_modules"] == []


def test_by_default_the_hook_installs_before_warm_start_returns_on_every_machine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOTUNE_BACKGROUND_INSTALL", raising=False)
    monkeypatch.delenv("AUTOTUNE_PREFETCH", raising=False)
    compile_before = torch.compile
    with autotune.warm_start(f"sqlite:///{tmp_path / 'cache.db'}") as handle:
        assert isinstance(handle, hook.WarmStart) and hook._active is handle
        assert torch.compile is compile_before
        assert handle.settings.background_install is False
    assert hook._active is None


_IMPORT_ORDER = """
import sys, threading
import torch, autotune
handle = autotune.warm_start(sys.argv[1])
names = [thread.name for thread in threading.enumerate()]
print("threads", sorted(name for name in names if name.startswith("autotune") and name != "autotune-prefetch"))
handle._policy.prefetch.wait_done(60)
print("read", "sqlalchemy" in sys.modules, handle.stats.database_calls >= 1)
handle.uninstall()
"""


def test_the_default_starts_no_thread_for_the_stores_imports_or_tritons_key(tmp_path: Path) -> None:
    """The store's modules are imported by the prefetch's thread (its first read opens the store),
    Triton's key by the first compile that needs it: warm_start() starts no helper thread of its
    own beside the install (autotune/job/store_imports.py)."""
    env = {key: value for key, value in os.environ.items() if key != "AUTOTUNE_BACKGROUND_INSTALL"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    done = subprocess.run([sys.executable, "-c", _IMPORT_ORDER, f"sqlite:///{tmp_path / 'cache.db'}"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    threads, read = done.stdout.splitlines()[-2:]
    # Where torch sees a GPU, the stored kernel configs' read (the cache's, as the prefetch) may still run.
    assert threads in (("threads []", "threads ['autotune-kernel-configs']") if torch.cuda.is_available()
                       else ("threads []",))
    assert read == "read True True"
