"""Two threads importing torch's modules at once: how often an import fails, without and with
the import gate (autotune/job/import_gate.py).

    python -m benchmarks.import_race                  # 16 processes per setting
    python -m benchmarks.import_race --processes 30 --out /tmp/race

Each child, a fresh process, imports torch, then starts a thread named as the hook's install
thread (``autotune-install``) that imports what the install imports first (Inductor's
``compile_fx`` and ``select_algorithm``). Its main thread, the script, sleeps a delay drawn from
the child's seed, then imports torch modules that Inductor's tree imports too (Dynamo,
AOTAutograd, Inductor's utilities and IR, ...) in an order drawn from the same seed. With
the gate, the install thread holds it closed as ``warm_start()`` does. A child records whether
the script's imports failed, whether the thread's did, and whether the thread hung.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import harness

log = logging.getLogger("import_race")

INSTALL_IMPORTS = ("torch._inductor.compile_fx", "torch._inductor.select_algorithm")
SCRIPT_IMPORTS = ("torch._dynamo", "torch._functorch.aot_autograd", "torch.fx.experimental.symbolic_shapes",
                  "torch._inductor.config", "torch._inductor.lowering", "torch._inductor.ir",
                  "torch._inductor.codegen.triton", "torch._prims", "torch._refs", "torch._decomp", "sympy",
                  "torch._inductor.scheduler", "torch.distributed", "torch._dynamo.utils", "torch._inductor.utils")
MAX_DELAY_S = 1.2  # the install's imports take about this long here, or longer
SETTINGS = ("no gate", "gate")


# --------------------------------------------------------------------------- the child


def child(args: argparse.Namespace) -> int:
    import torch  # noqa: F401 - a script has torch imported before warm_start()

    from autotune.job import import_gate

    rng = random.Random(args.seed)
    delay = rng.uniform(0, MAX_DELAY_S)
    order = list(SCRIPT_IMPORTS)
    rng.shuffle(order)
    thread_error: list[str] = []

    def install() -> None:
        try:
            for name in INSTALL_IMPORTS:
                importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - recorded
            thread_error.append(f"{type(exc).__name__}: {exc}")
        finally:
            opening()

    thread = threading.Thread(target=install, name="autotune-install", daemon=True)
    opening = import_gate.close(thread) if args.gate and import_gate.install() else (lambda: None)
    thread.start()
    time.sleep(delay)
    result: dict[str, Any] = {"seed": args.seed, "gate": args.gate, "delay_s": round(delay, 3)}
    try:
        for name in order:
            importlib.import_module(name)
        result["script"] = "ok"
    except Exception as exc:  # noqa: BLE001 - recorded
        result["script"] = f"{type(exc).__name__}: {exc}"[:300]
    thread.join(timeout=args.hang_after)
    result["thread"] = "hung" if thread.is_alive() else (thread_error[0][:300] if thread_error else "ok")
    result["waits"] = import_gate.waits()
    harness.emit(result)
    return 0


# -------------------------------------------------------------------------- the parent


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each seed once per setting, the settings taking turns."""
    children = []
    with tempfile.TemporaryDirectory(prefix="import_race_", ignore_cleanup_errors=True) as tmp:
        for seed in range(1, args.processes + 1):
            for gate in (False, True):
                cmd = [sys.executable, "-m", "benchmarks.import_race", "_child", "--seed", str(seed),
                       *(["--gate"] if gate else [])]
                done = harness.run(cmd, harness.child_env(Path(tmp) / f"{seed}-{int(gate)}"), args.timeout)
                payload = harness.marker_payload(done.stdout) or {
                    "seed": seed, "gate": gate, "script": f"no result (rc {done.rc})", "thread": "-",
                    "stderr_tail": harness.tail(done.stderr)}
                log.info("seed %d, %s: script %s, thread %s", seed, SETTINGS[gate], payload["script"][:60],
                         payload["thread"][:60])
                children.append(payload)
    return children


def summary(children: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for gate in (False, True):
        mine = [c for c in children if c.get("gate") == gate]
        rows.append([SETTINGS[gate], len(mine), sum(c.get("script") != "ok" for c in mine),
                     sum(c.get("thread") not in ("ok", "hung") for c in mine),
                     sum(c.get("thread") == "hung" for c in mine)])
    return rows


def render(run: dict[str, Any]) -> list[str]:
    children = run.get("children", [])
    lines = ["Fresh processes: a thread named `autotune-install` imports Inductor while the script's thread "
             "imports torch modules that Inductor imports too.", "",
             *harness.table(["setting", "processes", "script's imports failed", "thread's imports failed",
                             "thread hung"], summary(children)), "", "Each child:", ""]
    rows = [[c.get("seed"), SETTINGS[bool(c.get("gate"))], harness.fmt(c.get("delay_s"), ".2f"), c.get("script"),
             c.get("thread"), c.get("waits", "-")] for c in children]
    return lines + harness.table(["seed", "setting", "delay s", "script", "thread", "waits"], rows)


def results(out: Path) -> harness.Results:
    return harness.Results(out, "import_race", "Two threads importing torch's modules at once", render)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["_child"]:
        parser = argparse.ArgumentParser(prog="python -m benchmarks.import_race _child")
        parser.add_argument("--seed", type=int, required=True)
        parser.add_argument("--gate", action="store_true")
        parser.add_argument("--hang-after", type=float, default=60)
        return child(parser.parse_args(argv[1:]))
    parser = argparse.ArgumentParser(prog="python -m benchmarks.import_race", description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=16, help="children per setting (default %(default)s)")
    harness.output_options(parser, "import_race", "the device", timeout=180)
    args = parser.parse_args(argv)
    if args.processes < 1 or args.timeout <= 0:
        parser.error("--processes and --timeout must be positive")
    harness.log_to_stderr()
    store = results(Path(args.out))
    run = harness.new_run(store, args.label, "benchmarks.import_race", argv)
    run["children"] = measure(args)
    store.save()
    print("\n".join(render(run)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
