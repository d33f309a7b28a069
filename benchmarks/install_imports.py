"""Where a warm start's set-up goes before a script that builds nothing compiles: torch's import,
torch's CUDA check, and the install's imports of Inductor, on the main thread or on a thread.

    python -m benchmarks.install_imports                  # 8 rounds of every mode
    python -m benchmarks.install_imports --rounds 4 --out /tmp/imports

Each child is a fresh process that imports torch, asks ``torch.cuda.is_available()`` and imports
what the hook's install imports first (``autotune.job.background.GATED_IMPORTS``), in one of these
modes (the rounds take turns, one child of each mode per round):

- ``main``: the imports on the main thread, as the install before ``warm_start()`` returns;
- ``thread``: on a thread named as the install's, the main thread blocked until it ends;
- ``gate``: on that thread with the import gate closed, the main thread waiting at the gate in its
  own import of Dynamo, as a script's first torch import does while the hook installs;
- ``thread, cuda beside``: the thread started before the CUDA check, which the main thread makes
  beside the imports;
- ``thread, context beside``: the main thread makes the CUDA check and creates the CUDA context
  (a model's building) beside the thread's imports.

Each child records the seconds of each step from its start, and the importing thread's CPU time.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import harness

log = logging.getLogger("install_imports")

MODES = ("main", "thread", "gate", "thread, cuda beside", "thread, context beside")
# Each child's figures, with their columns' names.
FIGURES = (("torch_s", "torch"), ("cuda_check_s", "CUDA check"), ("imports_s", "imports"),
           ("imports_cpu_s", "imports' CPU"), ("total_s", "total"))


# --------------------------------------------------------------------------- the child


def child(mode: str) -> int:
    began = time.perf_counter()
    result: dict[str, Any] = {"mode": mode}
    import torch

    result["torch_s"] = time.perf_counter() - began
    from autotune.job.background import GATED_IMPORTS

    cpu: list[float] = []

    def imports() -> None:
        cpu_began = time.thread_time()
        for name in GATED_IMPORTS:
            importlib.import_module(name)
        cpu.append(time.thread_time() - cpu_began)

    def cuda_check() -> None:
        checked = time.perf_counter()
        result["cuda"] = torch.cuda.is_available()
        result["cuda_check_s"] = time.perf_counter() - checked

    if mode in ("main", "thread", "gate"):
        cuda_check()
    started = time.perf_counter()
    if mode == "main":
        imports()
    else:
        _on_a_thread(mode, imports, cuda_check, torch)
    result["imports_s"] = time.perf_counter() - started
    result["imports_cpu_s"] = cpu[0] if cpu else None
    result["total_s"] = time.perf_counter() - began
    harness.emit(result)
    return 0


def _on_a_thread(mode: str, imports: Callable[[], None], cuda_check: Callable[[], None], torch: Any) -> None:
    """The imports on a thread named as the install's; the main thread does what ``mode`` says."""
    from autotune.job import import_gate

    opening: list[Callable[[], None]] = []

    def install() -> None:
        try:
            imports()
        finally:
            for open_gate in opening:  # as the install does once its imports are done
                open_gate()

    thread = threading.Thread(target=install, name="autotune-install", daemon=True)
    if mode == "gate":
        assert import_gate.install()
        opening.append(import_gate.close(thread))
        thread.start()
        import torch._dynamo  # noqa: F401 - waits at the gate, polling, as a script's import does

        thread.join()
        return
    thread.start()
    if mode != "thread":
        cuda_check()
    if mode == "thread, context beside" and torch.cuda.is_available():
        torch.ones(1, device="cuda").sum().item()
    thread.join()


# -------------------------------------------------------------------------- the parent


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    children = []
    harness.warm_bytecode()
    with tempfile.TemporaryDirectory(prefix="install_imports_", ignore_cleanup_errors=True) as tmp:
        for round_ in range(1, args.rounds + 1):
            for mode in MODES:
                cmd = [sys.executable, "-m", "benchmarks.install_imports", "_child", mode]
                done = harness.run(cmd, harness.child_env(Path(tmp) / f"{round_}"), args.timeout)
                payload = harness.marker_payload(done.stdout) or {
                    "mode": mode, "error": f"no result (rc {done.rc})", "stderr_tail": harness.tail(done.stderr)}
                payload["round"] = round_
                log.info("round %d, %s: %s", round_, mode, harness.fmt(payload.get("total_s"), ".2f"))
                children.append(payload)
    return children


def summary(children: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for mode in MODES:
        mine = [c for c in children if c.get("mode") == mode and "total_s" in c]
        row: list[Any] = [mode, len(mine)]
        for key, _ in FIGURES:
            values = [c[key] for c in mine if c.get(key) is not None]
            row.append(harness.fmt(statistics.median(values), ".2f") if values else "-")
        rows.append(row)
    return rows


def summary_table(children: list[dict[str, Any]]) -> list[str]:
    return harness.table(["mode", "processes", *(name for _, name in FIGURES)], summary(children))


def render(run: dict[str, Any]) -> list[str]:
    children = run.get("children", [])
    lines = ["Fresh processes, the modes taking turns; medians in seconds. `imports` runs from the "
             "start of the install's imports to their end (for the modes beside, the main thread's "
             "work overlapping them included); `total` from the child's start.", "",
             *summary_table(children), "", "Each child:", ""]
    rows = [[c.get("round"), c.get("mode"), *(harness.fmt(c.get(key), ".2f") for key, _ in FIGURES), c.get("error", "")]
            for c in children]
    return lines + harness.table(["round", "mode", *(name for _, name in FIGURES), "error"], rows)


def results(out: Path) -> harness.Results:
    return harness.Results(out, "install_imports", "The install's imports, on the main thread or a thread", render)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["_child"]:
        return child(argv[1])
    parser = argparse.ArgumentParser(prog="python -m benchmarks.install_imports", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="children per mode (default %(default)s)")
    harness.output_options(parser, "install_imports", "the device", timeout=120)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.timeout <= 0:
        parser.error("--rounds and --timeout must be positive")
    harness.log_to_stderr()
    store = results(Path(args.out))
    run = harness.new_run(store, args.label, "benchmarks.install_imports", argv)
    run["children"] = measure(args)
    store.save()
    print("\n".join(summary_table(run["children"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
