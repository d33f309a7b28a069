"""What a compiled optimizer step costs Dynamo, and whether its package can carry it.

    python -m benchmarks.optimizer_trace                  # examples/lm_train.py, 2 samples
    python -m benchmarks.optimizer_trace --samples 3 --out /tmp/opt
    python -m benchmarks.optimizer_trace --warm-start     # a third child: under autotune.warm_start()

Issue 53 asks a warm training step's whole first step (forward, backward, optimizer) to take
at most half the floor's. Both trace the compiled optimizer's step with Dynamo in the user's
thread. This measures that tracing alone: each child, a fresh process, builds the model, runs
one eager forward and backward, then times the first call of ``torch.compile(optimizer.step,
backend="eager")`` (Dynamo without Inductor), with Dynamo's ``caching_precompile`` off and on.
It keeps Dynamo's own phase totals and every "package bypass" Dynamo logs: the reason its
package leaves a graph out, so that a fresh process must trace it again. With ``--warm-start`` a
third child per sample traces it under ``autotune.warm_start()`` (an empty cache of its own,
``caching_precompile`` off): torch 2.11 prints every tensor an identity guard guards,
which the warm start spares (inductor_glue/guard_repr.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import fmt

log = logging.getLogger("optimizer_trace")

DEFAULT_MODEL = "examples/lm_train.py"
PHASES_KEPT = 8


# --------------------------------------------------------------------------- the child


class _BypassLog(logging.Handler):
    """Dynamo's "Detected a package bypass: <reason>" warnings, kept."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "package bypass" in message:
            self.reasons.append(message)


def child(args: argparse.Namespace) -> int:
    result: dict[str, Any] = {"precompile": args.precompile, "warm_start": bool(args.warm_start), "status": "error"}
    try:
        _child_run(args, result)
        result["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - the parent records it, whatever it is
        result["error"] = f"{type(exc).__name__}: {exc}"
    harness.emit(result)
    return 0 if result["status"] == "ok" else 1


def _child_run(args: argparse.Namespace, result: dict[str, Any]) -> None:
    import torch

    from autotune.sweep.end_to_end import compile_phase_totals, longest_phases
    from benchmarks import compile_time

    bypasses = _BypassLog()
    logging.getLogger("torch._dynamo").addHandler(bypasses)
    torch._dynamo.config.caching_precompile = args.precompile
    if args.warm_start:
        import autotune

        autotune.warm_start(f"sqlite:///{args.warm_start}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    prepared = compile_time._prepare(args.model, None, device, None)
    if prepared.optimizer is None:
        raise ValueError(f"{args.model} defines no train_step: pass a training model file")
    loss = prepared.module(*prepared.inputs)
    loss.backward()  # the gradients the step reads, as in a training step
    step = torch.compile(prepared.optimizer.step, backend="eager")
    start = time.perf_counter()
    step()
    result["first_step_s"] = time.perf_counter() - start
    result["phases"] = longest_phases({}, compile_phase_totals(), top=PHASES_KEPT)
    result["bypasses"] = sorted(set(bypasses.reasons))
    result["device"] = device


# -------------------------------------------------------------------------- the parent


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each setting ``--samples`` times, each child with caches of its own: nothing of an earlier one is reused."""
    settings = [(False, False), (True, False)] + ([(False, True)] if args.warm_start else [])
    samples = []
    with tempfile.TemporaryDirectory(prefix="optimizer_trace_", ignore_cleanup_errors=True) as tmp:
        for sample in range(args.samples):
            for precompile, warm in settings:
                root = Path(tmp) / f"{sample}-{int(precompile)}-{int(warm)}"
                samples.append({"sample": sample + 1, "precompile": precompile, "warm_start": warm,
                                **_child_result(args, precompile, warm, root)})
    return samples


def _child_result(args: argparse.Namespace, precompile: bool, warm: bool, cache_root: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.optimizer_trace", "_child", "--model", args.model,
           *(["--precompile"] if precompile else []),
           *(["--warm-start", str(cache_root / "autotune.db")] if warm else [])]
    done = harness.run(cmd, harness.child_env(cache_root), args.timeout)
    payload = harness.marker_payload(done.stdout) or {"status": "error", "error": f"no result (rc {done.rc})",
                                                      "stderr_tail": harness.tail(done.stderr)}
    log.info("caching_precompile %s, warm start %s: %s", precompile, warm,
             fmt(payload.get("first_step_s"), ".2f") + " s" if payload.get("status") == "ok" else payload.get("error"))
    return payload


def render(run: dict[str, Any]) -> list[str]:
    rows = [[s["sample"], "on" if s["precompile"] else "off", "yes" if s.get("warm_start") else "no",
             s.get("status"), fmt(s.get("first_step_s"), ".2f"),
             fmt((s.get("phases") or {}).get("bytecode_tracing"), ".2f"),
             fmt((s.get("phases") or {}).get("build_guards"), ".2f"),
             "; ".join(s.get("bypasses") or []) or s.get("error") or "-"] for s in run.get("samples", [])]
    return [f"Model `{run.get('model')}`: the first call of its compiled optimizer step (Dynamo, `eager` backend).", "",
            *harness.table(["sample", "caching_precompile", "warm start", "status", "first step s", "bytecode_tracing s",
                            "build_guards s", "package bypasses logged"], rows)]


def results(out: Path) -> harness.Results:
    return harness.Results(out, "optimizer_trace", "Dynamo's tracing of a compiled optimizer step", render)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["_child"]:
        parser = argparse.ArgumentParser(prog="python -m benchmarks.optimizer_trace _child")
        parser.add_argument("--model", required=True)
        parser.add_argument("--precompile", action="store_true")
        parser.add_argument("--warm-start", default=None, metavar="DB", help="under autotune.warm_start(), this SQLite file")
        return child(parser.parse_args(argv[1:]))
    parser = argparse.ArgumentParser(prog="python -m benchmarks.optimizer_trace", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a training model file (default %(default)s)")
    parser.add_argument("--samples", type=int, default=2, help="children per setting (default %(default)s)")
    harness.output_options(parser, "optimizer_trace", "the device", timeout=300)
    parser.add_argument("--warm-start", action="store_true",
                        help="a third child per sample: under autotune.warm_start() (caching_precompile off)")
    args = parser.parse_args(argv)
    from benchmarks.compile_time import is_training_file

    if not Path(args.model).is_file():
        parser.error(f"{args.model}: no such file; pass a training model file (examples/lm_train.py)")
    if not is_training_file(args.model):
        parser.error(f"{args.model} defines no train_step: pass a training model file (examples/lm_train.py)")
    harness.log_to_stderr()
    store = results(Path(args.out))
    run = harness.new_run(store, args.label, "benchmarks.optimizer_trace", argv)
    run["model"] = args.model
    run["samples"] = measure(args)
    store.save()
    print("\n".join(render(run)))
    return 0 if all(s.get("status") == "ok" for s in run["samples"]) else 1


if __name__ == "__main__":
    sys.exit(main())
