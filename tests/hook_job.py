"""A training-job stand-in for hook tests, run in a fresh process with a fresh Inductor cache.

usage: python hook_job.py OUT.json [--cache URL] [--on-miss MODE] [--no-hook] [--model NAME]
       [--entry NAME] [--batch-size N] [--dynamic | --mark-dynamic] [--next-batch-size N] [--next-seq-len N]
       [--next-image-size N]
       [--config KEY=VALUE] [--pause-file PATH --resume-file PATH] [--ready-file PATH --go-file PATH]

It compiles tests/models/NAME.py (default tiny_mlp) under max-autotune (freezing on) and writes
what happened as JSON: hook stats, Inductor's benchmark count, the chosen
choice's hash per request, where the output tensor (and the eager model's, the
right answer) was saved, the seconds each
compile (with its first call) took, and when the job was done (to time its exit).

With AUTOTUNE_TEST_NO_RAY=1 it stands in for a machine without Ray: ``import ray`` fails in it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="hook-job-")


class _NoRay(importlib.abc.MetaPathFinder):
    """Ray is not installed here, as far as this process can tell."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".")[0] == "ray":
            raise ModuleNotFoundError(f"No module named {name!r} (AUTOTUNE_TEST_NO_RAY)", name=name)


if os.environ.get("AUTOTUNE_TEST_NO_RAY") == "1":
    sys.meta_path.insert(0, _NoRay())
# Set by the test session (conftest.py): a directory for compiled kernels shared by its jobs.
# A job that trusts a signer loads signed artifacts, kernels among them, so it shares
# nothing: what it finds on disk must be what a fresh node would find.
SHARED_KERNELS = None if os.environ.get("AUTOTUNE_TRUSTED_KEYS") else os.environ.get("AUTOTUNE_TEST_SHARED_KERNELS")

import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch._inductor import select_algorithm  # noqa: E402

import autotune  # noqa: E402
from autotune.inductor_glue.inductor import benchmark_count  # noqa: E402
from autotune.workers.child import warm_up  # noqa: E402


def _share_compiled_kernels(directory: str) -> None:
    """Keep the C++ kernels and wrapper modules Inductor writes under their content hash in
    ``directory``, so that the session's jobs compile each kernel once (the C++ compiler was
    most of a CPU job's time). The rest of the Inductor cache (FX graphs, autotune results,
    kernel configs) stays this job's own, so a job still lowers, looks up and tunes as a
    fresh node does."""
    from torch._inductor import codecache

    original = codecache.get_path

    def get_path(basename: str, extension: str, specified_dir: str = "") -> tuple[str, str, str]:
        if specified_dir or extension not in ("cpp", "py"):
            return original(basename, extension, specified_dir)
        subdir = os.path.join(directory, basename[1:3])
        return basename, subdir, os.path.join(subdir, f"{basename}.{extension}")

    codecache.get_path = get_path


def _importable(name: str) -> bool:
    """Whether ``import name`` would find it (nothing is imported)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def _handshake(announce: str, wait_for: str) -> None:
    Path(announce).write_text("waiting")
    deadline = time.time() + 60
    while not Path(wait_for).exists() and time.time() < deadline:
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--cache")
    parser.add_argument("--on-miss", default="tune")
    parser.add_argument("--no-hook", action="store_true")
    parser.add_argument("--entry", default="example")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--model", default="tiny_mlp", help="a module in --models-dir")
    parser.add_argument("--models-dir", default=str(Path(__file__).parent / "models"),
                        help="where the model module is imported from (default tests/models)")
    parser.add_argument("--dynamic", action="store_true", help="torch.compile(dynamic=True)")
    parser.add_argument("--mark-dynamic", action="store_true",
                        help="torch._dynamo.mark_dynamic on the dimensions the model's DYNAMIC_DIMS names")
    parser.add_argument("--next-batch-size", type=int, default=None,
                        help="call the compiled model again on this batch size (automatic dynamic shapes)")
    parser.add_argument("--next-seq-len", type=int, default=None,
                        help="call the compiled model again on this sequence length (tiny_block)")
    parser.add_argument("--next-image-size", type=int, default=None,
                        help="call the compiled model again on square images of this size (tiny_patches)")
    parser.add_argument("--config", action="append", default=[])
    parser.add_argument("--pause-file")
    parser.add_argument("--resume-file")
    parser.add_argument("--ready-file")
    parser.add_argument("--go-file")
    args = parser.parse_args()
    for pair in args.config:
        key, _, value = pair.partition("=")
        setattr(torch._inductor.config, key, json.loads(value))

    if SHARED_KERNELS:
        _share_compiled_kernels(SHARED_KERNELS)
    sys.path.insert(0, args.models_dir)
    model_file = importlib.import_module(args.model)
    handle = None if args.no_hook else autotune.warm_start(args.cache, on_miss=args.on_miss)
    chosen: dict[str, str] = {}
    margins: dict[str, float] = {}  # runner-up time / winner time, as this process measured
    candidates: dict[str, list[str]] = {}  # the choices this process weighed, by hash

    def remember(timings, name, input_nodes, choices, *_rest) -> None:  # type: ignore[no-untyped-def]
        key = f"{name}|{select_algorithm.create_inputs_key(input_nodes)}"
        chosen[key] = min(timings, key=timings.__getitem__).hash_key()
        candidates[key] = sorted(choice.hash_key() for choice in timings)
        times = sorted(timings.values())
        margins[key] = times[1] / times[0] if len(times) > 1 and times[0] > 0 else float("inf")

    select_algorithm.add_feedback_saver(remember)
    if args.ready_file:  # the hook is installed: let the test break the database before any lookup
        # Pay Inductor's first-compile set-up (10 s or more, over 20 s on a busy CI machine) with
        # a compile that asks for no autotune lookup, as a job already training has, so the
        # model's first lookup follows the test's "go" (database stopped) within seconds.
        warm_up("cpu")
        _handshake(args.ready_file, args.go_file)
    outputs, compile_seconds = [], []
    entries = [args.entry] + (["repeated"] if args.pause_file else [])
    for index, entry in enumerate(entries):
        if index and args.pause_file:  # let the test stop the database between the two compiles
            _handshake(args.pause_file, args.resume_file)
        model, inputs = getattr(model_file, entry)(args.batch_size)
        if args.mark_dynamic:
            for index, dims in model_file.DYNAMIC_DIMS.items():
                for dim in dims:
                    torch._dynamo.mark_dynamic(inputs[index], dim)
        began = time.perf_counter()
        compiled = torch.compile(model, mode="max-autotune", dynamic=True if args.dynamic else None)
        with torch.no_grad():
            outputs.append(compiled(*inputs))
            if args.next_batch_size:  # a new batch size: the model recompiles with a dynamic batch
                compiled(getattr(model_file, entry)(args.next_batch_size)[1][0])
            if args.next_seq_len:  # a dynamic graph runs it as it is
                compiled(getattr(model_file, entry)(args.batch_size, seq_len=args.next_seq_len)[1][0])
            if args.next_image_size:
                compiled(getattr(model_file, entry)(args.batch_size, image_size=args.next_image_size)[1][0])
        compile_seconds.append(time.perf_counter() - began)
    tensor_path = args.out + ".pt"
    torch.save(outputs[0], tensor_path)
    model, inputs = getattr(model_file, args.entry)(args.batch_size)  # a fresh copy: freezing may change the compiled one
    with torch.no_grad():
        torch.save(model(*inputs), args.out + ".eager.pt")
    result = {
        "stats": handle.stats.as_dict() if handle else None,
        "benchmarks": benchmark_count(),
        "chosen": chosen,
        "margins": margins,
        "candidates": candidates,
        "output": tensor_path,
        "eager_output": args.out + ".eager.pt",
        "compile_seconds": compile_seconds,
        "frames_compiled": int(counters["stats"]["unique_graphs"]),  # recompiles show here
        "dynamo_cache": dict(counters["dynamo_cache"]),  # Dynamo's package: hit / miss / error
        # graphs whose CUDA graphs were considered and refused (on CPU: every graph max-autotune compiles)
        "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"]),
        "ray_importable": _importable("ray"),
        "finished_at": time.time(),  # the process may exit later: the hook's threads end first
    }
    Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
