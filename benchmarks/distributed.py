"""Training jobs under torchrun, DDP and FSDP2, served from `autotune sweep --ddp/--fsdp`.

    python -m benchmarks.distributed                  # GPUs: the LM step on 2 GPUs, then the CPU part
    python -m benchmarks.distributed --quick          # CPU only: the database calls of 8 ranks and of 1

On GPUs (``--nproc`` of them, NCCL), for each of DDP and FSDP2, a transformer LM training step
(``examples/lm_train.py``, entry ``small``: two blocks at d_model 768, bf16 autocast):

- ``sweep``: ``autotune sweep --train --ddp`` (then ``--fsdp``, same cache) of that step;
- ``default``: the job in default mode, no hook: its first step (compile + run) per rank;
- ``warm``: the job in max-autotune with the hook, trusting the sweep's signed artifacts:
  first step, hits, misses, benchmarks and artifacts loaded per rank, and the GPU kernel time
  per step (NCCL's kernels left out);
- ``cold-single``: one process, no wrapper, cold max-autotune of the same step: its kernel time
  per step, against which the warm jobs' kernel time is weighed;
- ``cold`` (asked for with ``--scenarios``): the same job, cold max-autotune, no hook: its kernel
  time holds the wrapper's own kernels and graph splits, as the warm job's does.

On a CPU (always; ``--quick`` does only this): tests/models/tiny_bmm.py swept with ``--ddp``,
then a job of 1 rank and one of ``--cpu-ranks`` ranks (gloo) warm-start from it; every rank's
``database_calls`` summed, per job. The ranks of a node share one reader (autotune/job/node_share.py).

Each job rank writes its figures as one JSON line; rank 0 gathers them and prints them
(``RESULT``). Results: ``<out>/distributed.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import harness

log = harness.log
GPU_MODEL, GPU_ENTRY = "examples/lm_train.py", "small"
CPU_MODEL, CPU_ENTRY = "tests/models/tiny_bmm.py", "example"
CXX_SHIM = harness.REPO / "tests" / "tools" / "cached_cxx.py"
PROFILED_STEPS = 5
TOP_KERNELS = 15


# ------------------------------------------------------------------ the job (each rank)


def job(argv: list[str]) -> int:
    """One rank of the training job (run by torchrun as ``-m benchmarks.distributed job ...``)."""
    parser = argparse.ArgumentParser(prog="benchmarks.distributed job")
    parser.add_argument("--model", required=True)
    parser.add_argument("--entry", default="example")
    parser.add_argument("--kind", choices=["ddp", "fsdp", "none"], required=True)
    parser.add_argument("--bucket-cap-mb", type=float)
    parser.add_argument("--mode", default="max-autotune")
    parser.add_argument("--hook", action="store_true")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # Each rank its own Inductor cache, as each rank of a fresh job on a fresh node has.
    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/autotune-dist-bench")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, f"rank{local_rank}")
    began = time.perf_counter()
    import torch
    import torch.distributed as dist

    import autotune
    from autotune.inductor_glue.distributed import DistributedSpec, wrap
    from autotune.inductor_glue.inductor import benchmark_count
    from autotune.inductor_glue.modelfile import load_model_file

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    if args.kind != "none":
        dist.init_process_group("nccl" if cuda else "gloo")
    handle = autotune.warm_start(read_only=True) if args.hook else None
    model, inputs = load_model_file(args.model, args.entry).build(None)
    device = "cuda" if cuda else "cpu"
    spec = None if args.kind == "none" else DistributedSpec(args.kind, dist.get_world_size(), args.bucket_cap_mb)
    module = wrap(model.to(device).train(), spec, device)
    inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
    compiled = torch.compile(module, mode=args.mode)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)

    def train_step() -> None:
        out = compiled(*inputs)
        (out if out.dim() == 0 else out.float().sum()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    started = time.perf_counter()
    train_step()
    if cuda:
        torch.cuda.synchronize()
    result: dict[str, Any] = {"rank": dist.get_rank() if spec else 0, "first_step_s": time.perf_counter() - started,
                              "process_s": time.perf_counter() - began,
                              "inductor_benchmarks": benchmark_count()}
    if handle is not None:
        result.update({k: v for k, v in handle.stats.as_dict().items()
                       if k in ("hits", "misses", "benchmarks", "database_calls", "errors", "artifacts_loaded",
                                "artifacts_rejected", "packages_refused")})
    if args.profile and cuda:
        result.update(_kernel_ms_per_step(train_step))
    gathered: list[Any] = [result]
    if spec is not None:
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, result)
    if result["rank"] == 0:
        harness.emit({"ranks": gathered})
    if spec is not None:
        dist.barrier()  # local rank 0 serves the others' cache reads: it leaves last
        dist.destroy_process_group()
    return 0


def _kernel_ms_per_step(train_step: Any) -> dict[str, Any]:
    """GPU kernel time per step over a few steps after a warm-up, NCCL's kernels left out
    (communication, which a single process has none of); counted as compile_time's profile does.
    Also that time by kind of kernel (``kernel_ms_by_kind``: the compiled graphs' Triton kernels
    and library GEMMs apart from the eager kernels a wrapper or the optimizer runs) and the
    longest kernels, which tell the compiled graphs' kernels from the wrapper's own (DDP's
    bucket copies, FSDP's all-gather copy-in and copy-out)."""
    import torch

    from benchmarks.compile_time import _kernel_profile

    train_step()
    torch.cuda.synchronize()
    profile = _kernel_profile(train_step, torch.cuda.synchronize, PROFILED_STEPS)
    by_kind = {kind: us / 1000.0 for kind, us in profile["us_per_call_by_kind"].items()}
    longest = sorted(profile["kernels"], key=lambda k: -k["us_per_call"])[:TOP_KERNELS]
    return {"kernel_ms_per_step": profile["kernel_us_per_call"] / 1000.0 - by_kind.get("nccl", 0.0),
            "kernel_ms_by_kind": by_kind, "compiled_kernel_ms_per_step": _compiled_ms(by_kind),
            "top_kernels": longest}


def _compiled_ms(by_kind: dict[str, float]) -> float:
    """The compiled graphs' share of a step's kernel time: Inductor's Triton kernels and the
    library GEMMs it chose (an eager GEMM outside the graphs would count too; the LM step has none)."""
    return by_kind.get("triton", 0.0) + by_kind.get("gemm", 0.0)


# ------------------------------------------------------------------ the parent


def _env(tmp: Path, name: str, cache_url: str | None, threads: str | None = None) -> dict[str, str]:
    env = harness.child_env(tmp / name, cache_url)
    if threads:  # the CPU part: each rank builds the same C++, so g++ builds it once and copies it
        env["OMP_NUM_THREADS"] = threads
        shim = _cxx_shim(tmp)
        if shim is not None:
            env["CXX"] = str(shim)
    return env


def _cxx_shim(tmp: Path) -> Path | None:
    """g++ behind the tests' cache of identical compiles (tests/tools/cached_cxx.py)."""
    import shutil

    real = shutil.which(os.environ.get("CXX", "g++"))
    if real is None or not CXX_SHIM.is_file():
        return None
    shim = tmp / "cxx" / "g++"  # Inductor tells gcc from clang by the compiler's name
    if not shim.exists():
        shim.parent.mkdir(parents=True, exist_ok=True)
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "{CXX_SHIM}" "{tmp / "cxx-cache"}" "{real}" "$@"\n')
        shim.chmod(0o755)
    return shim


def _torchrun(nproc: int, job_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", "benchmarks.distributed", "job", *job_args]


def _run(cmd: list[str], env: dict[str, str], args: argparse.Namespace, what: str) -> dict[str, Any]:
    log.info("%s: %s", what, " ".join(cmd[2:]))
    done = harness.run(cmd, env, args.timeout, Path(args.logs) / f"{harness.slug(what)}.log" if args.logs else None)
    payload = harness.marker_payload(done.stdout) or harness.sweep_report(done.stdout)
    result: dict[str, Any] = {"wall_s": round(done.wall_s, 2), "rc": done.rc}
    if payload is None or done.rc != 0:
        result["stderr_tail"] = harness.tail(done.stderr)
    if payload is not None:
        result.update(payload if "ranks" in payload else {"totals": payload.get("totals")})
    log.info("%s: rc=%s in %.1f s", what, done.rc, done.wall_s)
    return result


def _sweep(model: str, entry: str, flags: list[str], url: str, env: dict[str, str], args: argparse.Namespace,
           what: str) -> dict[str, Any]:
    cmd = harness.AUTOTUNE + ["sweep", model, "--entry", entry, "--train", *flags, "--cache", url, "--json"]
    return _run(cmd, env, args, what)


def gpu_part(args: argparse.Namespace, tmp: Path, part: dict[str, Any], save: Callable[[], None]) -> None:
    """The sweeps publish signed artifacts and the warm jobs trust them, as a team runs it. Fills
    ``part`` and saves after each step, so that a run cut by its device call keeps what it did."""
    from benchmarks.compile_time import make_key_pair

    url = f"sqlite:///{tmp / 'gpu-cache.db'}"
    model = ["--model", GPU_MODEL, "--entry", GPU_ENTRY]
    key, why_not = make_key_pair(tmp, args.timeout)
    part.update({"model": f"{GPU_MODEL}:{GPU_ENTRY}", "nproc": args.nproc, "artifacts": key is not None,
                 "artifacts_off_because": why_not})
    signing = ["--signing-key", key] if key else []
    trusted = {"AUTOTUNE_TRUSTED_KEYS": f"{key}.pub"} if key else {}
    if "cold-single" in args.scenarios:
        part["cold-single"] = _run(_torchrun(1, [*model, "--kind", "none", "--profile"]),
                                   _env(tmp, "cold-single", None), args, "cold single-process max-autotune")
        save()
    for kind in args.kinds:
        flags = ["--ddp"] if kind == "ddp" else ["--fsdp"]
        runs = part.setdefault(kind, {})
        runs["sweep"] = _sweep(GPU_MODEL, GPU_ENTRY, flags + ["--world-size", str(args.nproc), *signing], url,
                               _env(tmp, f"sweep-{kind}", url), args, f"sweep {kind}")
        save()
        if "default" in args.scenarios:
            runs["default"] = _run(_torchrun(args.nproc, [*model, "--kind", kind, "--mode", "default"]),
                                   _env(tmp, f"default-{kind}", None), args, f"{kind} default")
            save()
        runs["warm"] = _run(_torchrun(args.nproc, [*model, "--kind", kind, "--hook", "--profile"]),
                            {**_env(tmp, f"warm-{kind}", url), **trusted}, args, f"{kind} warm")
        save()
        if "cold" in args.scenarios:  # the same job in cold max-autotune: its kernels, graph splits included
            runs["cold"] = _run(_torchrun(args.nproc, [*model, "--kind", kind, "--profile"]),
                                _env(tmp, f"cold-{kind}", None), args, f"{kind} cold max-autotune")
            save()


def cpu_part(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    url = f"sqlite:///{tmp / 'cpu-cache.db'}"
    # torchrun gives each rank one thread where several share a CPU; the sweep runs as they do.
    part: dict[str, Any] = {"model": f"{CPU_MODEL}:{CPU_ENTRY}",
                            "sweep": _sweep(CPU_MODEL, CPU_ENTRY, ["--ddp", "--bucket-cap-mb", "1", "--device", "cpu"],
                                            url, _env(tmp, "sweep-cpu", url, "1"), args, "cpu sweep")}
    for ranks in (1, args.cpu_ranks):
        job_args = ["--model", CPU_MODEL, "--kind", "ddp", "--bucket-cap-mb", "1", "--hook"]
        part[f"ranks_{ranks}"] = _run(_torchrun(ranks, job_args), _env(tmp, f"cpu-{ranks}", url, "1"), args,
                                      f"cpu ddp job of {ranks} rank(s)")
    return part


def _sum(run: dict[str, Any] | None, field: str) -> int | None:
    ranks = (run or {}).get("ranks")
    return sum(int(r.get(field) or 0) for r in ranks) if ranks else None


def _measured(run: dict[str, Any] | None, field: str) -> list[float]:
    """The ranks' values of ``field``, where a rank measured it."""
    return [r[field] for r in (run or {}).get("ranks") or [] if isinstance(r.get(field), (int, float))]


def _total(run: dict[str, Any] | None, field: str) -> float | None:
    values = _measured(run, field)
    return sum(values) if values else None


def _max(run: dict[str, Any] | None, field: str) -> float | None:
    values = _measured(run, field)
    return max(values) if values else None


def goals(run: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    gpu = run.get("gpu") or {}
    cold = _max(gpu.get("cold-single"), "kernel_ms_per_step")
    for kind in ("ddp", "fsdp"):
        runs = gpu.get(kind)
        if not runs:
            continue
        warm = runs.get("warm")
        out.append({"goal": f"{kind}: 0 benchmarks on every rank", "value": _sum(warm, "inductor_benchmarks"),
                    "met": _sum(warm, "inductor_benchmarks") == 0 and _sum(warm, "benchmarks") == 0})
        # A graph loaded from a signed artifact makes no lookup: served either way.
        served = (_sum(warm, "hits") or 0) + (_sum(warm, "artifacts_loaded") or 0)
        out.append({"goal": f"{kind}: every lookup a hit", "value": f"{_sum(warm, 'hits')} hits, "
                    f"{_sum(warm, 'misses')} misses, {_sum(warm, 'artifacts_loaded')} artifacts loaded",
                    "met": served > 0 and _sum(warm, "misses") == 0})
        first = harness.ratio(_max(warm, "first_step_s"), _max(runs.get("default"), "first_step_s"))
        out.append({"goal": f"{kind}: first step <= 0.5x default mode's", "value": first,
                    "met": None if first is None else first <= 0.5})
        kernels = harness.ratio(_max(warm, "kernel_ms_per_step"), cold)
        out.append({"goal": f"{kind}: kernel time per step <= single-process cold max-autotune's", "value": kernels,
                    "met": None if kernels is None else kernels <= 1.0})
        compiled = harness.ratio(_max(warm, "compiled_kernel_ms_per_step"),
                                 _max(gpu.get("cold-single"), "compiled_kernel_ms_per_step"))
        if compiled is not None:  # the same, the compiled graphs' kernels alone (Triton and library GEMMs)
            out.append({"goal": f"{kind}: compiled graphs' kernel time per step <= single-process cold's (report)",
                        "value": compiled, "met": compiled <= 1.0})
        same_job = harness.ratio(_max(warm, "kernel_ms_per_step"), _max(runs.get("cold"), "kernel_ms_per_step"))
        if same_job is not None:  # reported beside the goal: the wrapper's own kernels on both sides
            out.append({"goal": f"{kind}: kernel time per step vs the same job's cold max-autotune (report)",
                        "value": same_job, "met": same_job <= 1.03})
            summed = harness.ratio(_total(warm, "kernel_ms_per_step"), _total(runs.get("cold"), "kernel_ms_per_step"))
            out.append({"goal": f"{kind}: the same, summed over the ranks (report)", "value": summed,
                        "met": summed is not None and summed <= 1.03})
    cpu = run.get("cpu") or {}
    if cpu:
        one, many = _sum(cpu.get("ranks_1"), "database_calls"), _sum(cpu.get(f"ranks_{run['cpu_ranks']}"),
                                                                      "database_calls")
        out.append({"goal": f"database calls of {run['cpu_ranks']} ranks <= those of 1 (CPU)",
                    "value": f"{many} vs {one}", "met": one is not None and many is not None and 0 < many <= one})
    return out


KINDS = ("triton", "gemm", "eager", "optimizer")


def _by_kind_table(gpu: dict[str, Any]) -> list[str]:
    """Each profiled rank's kernel time per step by kind of kernel (benchmarks/compile_time.py
    ``kernel_kind``), NCCL's left out."""
    rows = []
    jobs = [(kind, scenario, result) for kind in ("ddp", "fsdp") for scenario, result in (gpu.get(kind) or {}).items()]
    jobs.append(("none", "cold-single", gpu.get("cold-single")))
    for kind, scenario, result in jobs:
        for rank in (result or {}).get("ranks") or []:
            by_kind = rank.get("kernel_ms_by_kind")
            if by_kind:
                rows.append([kind, scenario, rank.get("rank")] + [harness.fmt(by_kind.get(k, 0.0), ".2f") for k in KINDS]
                            + [harness.fmt(rank.get("kernel_ms_per_step"), ".2f")])
    if not rows:
        return []
    return harness.table(["job", "scenario", "rank"] + [f"{k} ms" for k in KINDS] + ["all but NCCL ms"], rows) + [""]


def render(run: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    gpu = run.get("gpu") or {}
    rows = []
    for kind in ("ddp", "fsdp"):
        for scenario, result in (gpu.get(kind) or {}).items():
            for rank in (result or {}).get("ranks") or []:
                rows.append([kind, scenario, rank.get("rank"), harness.fmt(rank.get("first_step_s")),
                             rank.get("artifacts_loaded", "-"),
                             rank.get("hits", "-"), rank.get("misses", "-"), rank.get("inductor_benchmarks", "-"),
                             harness.fmt(rank.get("kernel_ms_per_step"), ".2f"), rank.get("database_calls", "-")])
    for rank in (gpu.get("cold-single") or {}).get("ranks") or []:
        rows.append(["none", "cold-single", 0, harness.fmt(rank.get("first_step_s")), "-", "-", "-",
                     rank.get("inductor_benchmarks", "-"), harness.fmt(rank.get("kernel_ms_per_step"), ".2f"), "-"])
    if rows:
        lines += harness.table(["job", "scenario", "rank", "first step s", "artifacts loaded", "hits", "misses",
                                "benchmarks",
                                "kernel ms/step", "db calls"], rows) + [""]
    lines += _by_kind_table(gpu)
    cpu = run.get("cpu") or {}
    if cpu:
        cpu_rows = [[key.replace("ranks_", ""), _sum(result, "database_calls"), _sum(result, "hits"),
                     _sum(result, "misses"), _sum(result, "inductor_benchmarks")]
                    for key, result in cpu.items() if key.startswith("ranks_")]
        lines += harness.table(["CPU DDP job ranks", "database calls (all ranks)", "hits", "misses", "benchmarks"],
                               cpu_rows) + [""]
    if not run.get("goals"):
        return lines
    lines += harness.table(["goal", "value", "met"], [[g["goal"], harness.fmt(g["value"], ".2f")
                                                       if isinstance(g["value"], float) else g["value"], g["met"]]
                                                      for g in run.get("goals") or []])
    return lines


def results(out: Path) -> harness.Results:
    return harness.Results(out, "distributed", "Distributed training jobs: DDP and FSDP2 under torchrun", render)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.distributed", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the CPU part only (database calls, 1 vs N ranks)")
    parser.add_argument("--nproc", type=int, default=2, help="GPUs (ranks) of the GPU jobs [default: 2]")
    parser.add_argument("--kinds", default="ddp,fsdp", help="GPU jobs to run [default: ddp,fsdp]")
    parser.add_argument("--scenarios", default="default,cold-single",
                        help="GPU baselines to run besides the sweep and the warm job: default, cold-single, cold "
                             "(the same job in cold max-autotune) [default: default,cold-single]")
    parser.add_argument("--cpu-ranks", type=int, default=8, help="ranks of the larger CPU job [default: 8]")
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU part")
    harness.output_options(parser, "distributed", "gpu or cpu", timeout=600.0, per="child")
    parser.add_argument("--logs", help="write each child's output here")
    parser.add_argument("--workdir", help="scratch folder [default: a new temporary one]")
    args = parser.parse_args(argv)
    args.kinds = [k for k in args.kinds.split(",") if k]
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    return args


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw[:1] == ["job"]:
        return job(raw[1:])
    args = parse_args(raw)
    harness.log_to_stderr()
    import tempfile

    tmp = Path(args.workdir or tempfile.mkdtemp(prefix="autotune-dist-"))
    info = harness.machine()
    gpus = bool(info.get("gpu"))
    store = results(Path(args.out))
    run = store.run(args.label or ("gpu" if gpus and not args.quick else "cpu"), info,
                    "python -m benchmarks.distributed " + " ".join(raw))
    run["cpu_ranks"] = args.cpu_ranks

    def save() -> None:
        run["goals"] = goals(run)
        store.save()

    if gpus and not args.quick:
        run["gpu"] = {}
        gpu_part(args, tmp, run["gpu"], save)
    if not args.no_cpu:
        run["cpu"] = cpu_part(args, tmp)
    run["goals"] = goals(run)
    store.save()
    log.info("wrote %s and its .md", store.path)
    print(json.dumps(run["goals"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
