"""Where a tuning worker spends a request's time, outside Ray and the sweep.

The sweep's per-request ``tuning_seconds`` on an H100 varied 4x between requests of
one model (runs 60 and 64: three of the transformer's GEMMs took 16-20 s each, the
fourth 4 s, each with 22 candidates). This captures a model's requests, then tunes
them one after another in one tuning child (``workers.child``, as an actor does), in
capture order and then in reverse order in a fresh child. Inside each job it times the
phases of ``workers.tune``: each compile (Inductor's precompile and benchmarks, and the
graph's run), the benchmarks alone and the numerics checks. (Run 73 ran it before an ATen
win's fastest template was checked in the same compile: it timed that second compile too.)
If the slow requests are slow in both orders, the cost is in the request; if the
first requests of each child are slow, it is in the child's start.

    python benchmarks/diag_worker_time.py examples/gpt.py --out /tmp/diag

Writes ``<out>/worker_time.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

log = logging.getLogger("diag_worker_time")
PHASES_ENV = "AUTOTUNE_DIAG_PHASES"  # the child appends its phase timings (JSON lines) here


def install_phase_timers(path: str) -> None:
    """In the child: time tune.py's phases and append one JSON line per phase call."""
    import functools

    from autotune.workers import tune

    def timed(name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with open(path, "a") as sink:
                    sink.write(json.dumps({"phase": name, "seconds": time.perf_counter() - started,
                                           "at": time.time()}) + "\n")
        return wrapper

    for name in ("_compile_and_run", "_check_numerics"):
        setattr(tune, name, timed(name, getattr(tune, name)))
    tune.fresh_inductor = _recording_phases(tune.fresh_inductor, path)  # type: ignore[assignment]
    policy_lookup = tune.TunePolicy.lookup
    tune.TunePolicy.lookup = timed("benchmark_choices", policy_lookup)  # type: ignore[method-assign]


def _recording_phases(fresh_inductor: Any, path: str) -> Any:
    """``fresh_inductor``, also appending the longest of torch's own timed phases (lowering,
    codegen, precompiles, benchmarks) inside it: Dynamo's reset on its way out clears them."""
    import contextlib

    from autotune.pointwise import compile_phase_totals, longest_phases

    @contextlib.contextmanager
    def recorded(config: dict[str, Any]) -> Any:
        from torch._inductor.async_compile import AsyncCompile

        pool_ready = float(bool(getattr(AsyncCompile, "use_process_pool", lambda: False)()))
        with open(path, "a") as sink:  # 1.0: Inductor's compile workers take the Triton candidates
            sink.write(json.dumps({"phase": "compile_workers_ready", "seconds": pool_ready, "at": time.time()}) + "\n")
        with fresh_inductor(config):
            before = compile_phase_totals()
            try:
                yield
            finally:
                with open(path, "a") as sink:
                    for name, seconds in longest_phases(before, compile_phase_totals(), top=20).items():
                        sink.write(json.dumps({"phase": f"torch:{name}", "seconds": seconds, "at": time.time()}) + "\n")
    return recorded


def child_main() -> None:
    """``python diag_worker_time.py --child FD``: workers.child's loop with phase timers."""
    from autotune.workers import child

    install_phase_timers(os.environ[PHASES_ENV])
    child.serve(int(sys.argv[2]))


def capture_jobs(path: str, device: str, dynamic: bool = False) -> list[dict[str, Any]]:
    from autotune.inductor_glue.capture import capture_model
    from autotune.inductor_glue.modelfile import load_model_file
    from autotune.workers.jobs import TuneJob

    model = load_model_file(path, "example")
    captured = capture_model(model, mode="max-autotune", inductor_config={}, device=device, dynamic=dynamic)
    overrides = dict(model.config_overrides)
    return [TuneJob(r, captured.env, captured.mode, overrides, device, "diag").to_json() for r in captured.requests]


def run_jobs(jobs: list[dict[str, Any]], device: str, phases_path: Path, label: str) -> list[dict[str, Any]]:
    """Tune ``jobs`` in order in one fresh child; each job's wall time and phases."""
    from autotune.workers import child

    os.environ[PHASES_ENV] = str(phases_path)
    # The same child and pipe protocol, started through this file so the timers are installed.
    tuner = child.ChildTuner(600.0, command=[sys.executable, str(Path(__file__).resolve()), "--child"])
    rows = []
    try:
        started = time.perf_counter()
        warm = tuner.warm(device)["warm_seconds"]
        log.info("%s: child warm in %.1f s (%.1f s with its start)", label, warm, time.perf_counter() - started)
        rows.append({"order": label, "job": "warm-up", "seconds": time.perf_counter() - started})
        for job in jobs:
            phases_path.write_text("")
            started = time.perf_counter()
            result = tuner.tune(job)
            wall = time.perf_counter() - started
            phases = [json.loads(line) for line in phases_path.read_text().splitlines() if line.strip()]
            summary: dict[str, float] = {}
            for p in phases:
                summary[p["phase"]] = summary.get(p["phase"], 0.0) + p["seconds"]
            request = job["request"]
            rows.append({"order": label, "job": f"{request['op']} {request.get('inputs_key', '')}"[:80],
                         "seconds": wall, "status": result.get("status"),
                         "candidates": len(result.get("candidates") or []), "phases": summary})
            log.info("%s: %s %.1f s %s", label, rows[-1]["job"], wall, summary)
    finally:
        tuner.close()
    return rows


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main()
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dynamic", action="store_true", help="capture as `autotune sweep --dynamic` does")
    parser.add_argument("--once", action="store_true", help="capture order only (a failure's traceback, "
                        "which the child prints to this stderr)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    jobs = capture_jobs(args.model, device, args.dynamic)
    log.info("captured %d requests in %.1f s", len(jobs), time.perf_counter() - started)
    rows = run_jobs(jobs, device, out / "phases.jsonl", "capture order")
    if not args.once:
        rows += run_jobs(list(reversed(jobs)), device, out / "phases.jsonl", "reverse order")
    (out / "worker_time.json").write_text(json.dumps(rows, indent=2) + "\n")
    for row in rows:
        phases = " ".join(f"{k}={v:.1f}" for k, v in (row.get("phases") or {}).items())
        print(f"{row['order']:14} {row['seconds']:6.1f} s  {row.get('status', ''):8} {row['job']}  {phases}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
