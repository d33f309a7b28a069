"""Why a served mixture-of-experts output moves away from eager's (issue 81): one sweep, then the
warm start with each of its serving features off in turn, beside default and cold max-autotune.

Each variant is a fresh process with empty local caches: it builds the zoo's model (seeded, so
the weights and inputs are eager's), compiles it, runs it once, and compares its output with
eager's (made once, by a process of its own, on the same device):

- ``deviation``: max |out - eager| / max |eager|, the conformance table's measure;
- ``moved tokens``: rows of the output (its last dimension) off by more than ``MOVED`` of the
  output's scale. A token routed to another expert moves its whole row; a GEMM's rounding moves
  a row by far less. So a variant that routes as eager does moves none, or a few near ties.

The warm variants say which feature brings the movement in: the artifacts (compiled graphs
served whole), Dynamo's package, the fusion and padding verdicts, the pointwise kernel configs,
the pinned winners, or the GEMM winners themselves (``warm-aten``: an empty cache, every GEMM
ATen, against ``warm``). Two processes per variant by default.

    python -m benchmarks.moe_routing                      # the GPU run
    python -m benchmarks.moe_routing --device cpu --samples 1 --variants warm,warm-aten   # a smoke run
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import harness

log = logging.getLogger("moe_routing")

MOVED = 0.05  # a row moved: its largest difference over the output's largest magnitude
SERVING_OFF = {"AUTOTUNE_ARTIFACTS": "0", "AUTOTUNE_VERDICTS": "0", "AUTOTUNE_KERNEL_CONFIGS": "0",
               "AUTOTUNE_PIN": "0"}
# name: (how it compiles, the environment it adds)
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "default": ("default", {}),
    "cold": ("max-autotune", {}),
    "warm": ("warm", {}),
    "warm-no-artifacts": ("warm", {"AUTOTUNE_ARTIFACTS": "0"}),
    "warm-no-package": ("warm", {"AUTOTUNE_DYNAMO_PACKAGE": "0"}),
    "warm-no-verdicts": ("warm", {"AUTOTUNE_VERDICTS": "0"}),
    "warm-no-kernel-configs": ("warm", {"AUTOTUNE_KERNEL_CONFIGS": "0"}),
    "warm-no-pin": ("warm", {"AUTOTUNE_PIN": "0"}),
    "warm-winners-only": ("warm", SERVING_OFF),
    "warm-aten": ("warm-empty", {"AUTOTUNE_ON_MISS": "aten"}),
}


# ------------------------------------------------------------------------------- the child


def _child(args: argparse.Namespace) -> int:
    result: dict[str, Any] = {"variant": args.variant, "status": "error"}
    return harness.child_result(result, lambda: _child_run(args, result))


def _child_run(args: argparse.Namespace, result: dict[str, Any]) -> None:
    import torch

    from benchmarks import compile_time

    how = VARIANTS[args.variant][0] if args.variant != "eager" else "eager"
    handle = None
    if how.startswith("warm"):
        import autotune

        # Each variant's AUTOTUNE_* (warm-aten's AUTOTUNE_ON_MISS among them) reaches it from the environment.
        handle = autotune.warm_start(args.cache if how == "warm" else args.empty_cache)
    prepared = compile_time._prepare(args.model, None, args.device, None)
    model, inputs = prepared.module, prepared.inputs
    with torch.no_grad():
        if how == "eager":
            out = model(*inputs)
        else:
            compiled = torch.compile(model, mode="default" if how == "default" else "max-autotune")
            if args.device == "cuda":
                torch.compiler.cudagraph_mark_step_begin()
            out = compiled(*inputs)
    output = _first_tensor(out).detach().float().cpu()
    if how == "eager":
        torch.save(output, args.reference)
    else:
        result.update(compare(output, torch.load(args.reference)))
    if handle is not None:
        stats = handle.stats
        result["hook"] = {k: getattr(stats, k, None) for k in ("hits", "misses", "benchmarks", "artifacts_loaded")}


def _first_tensor(output: Any) -> Any:
    from benchmarks.deviation import tensors

    found = tensors(output)
    if not found:
        raise ValueError("the model returned no tensor")
    return found[0]


def compare(output: Any, reference: Any) -> dict[str, Any]:
    """The deviation from eager (the conformance table's, benchmarks/deviation.py) and the rows
    that moved (see the module's docstring)."""
    from benchmarks import deviation

    measured = deviation.compare([output], [reference])
    if "error" in measured:  # outputs of other shapes: no row to compare
        raise ValueError(measured["error"])
    scale = float(reference.abs().max()) or 1.0
    rows = (output - reference).abs().reshape(-1, output.shape[-1]).amax(dim=1) / scale
    return {"deviation": measured["relative"], "moved_tokens": int((rows > MOVED).sum()), "tokens": int(rows.numel())}


# ------------------------------------------------------------------------------ the parent


def measure(args: argparse.Namespace, entry: dict[str, Any], save: Callable[[], None]) -> None:
    """Fills ``entry`` step by step, saving after each: a cut command keeps what it measured."""
    from benchmarks import compile_time, zoo

    tmp = Path(tempfile.mkdtemp(prefix="moe_routing_"))
    model = str(zoo.write_stub(args.model, "infer", tmp))
    cache_url, empty_url = f"sqlite:///{tmp / 'cache.db'}", f"sqlite:///{tmp / 'empty.db'}"
    run = compile_time.ModelRun(args.model, model, [compile_time.ARTIFACTS], tmp, cache_url, train=False)
    log_dir = Path(args.log_dir) if args.log_dir else None
    entry.update(model=args.model, device=args.device, variants={})
    sweep_args = Namespace(timeout=args.sweep_timeout, batch_size=None, sweep_arg=["--device", args.device])
    entry["sweep"] = sweep = compile_time.run_sweep(run, sweep_args, log_dir / "sweep.log" if log_dir else None)
    save()
    if sweep.get("status") != "ok":
        return
    reference = tmp / "eager.pt"
    common = ["--model", model, "--device", args.device, "--cache", cache_url, "--empty-cache", empty_url,
              "--reference", str(reference)]
    entry["eager"] = _run_child(tmp, "eager", 0, common, {}, run.signing_key, args)
    if entry["eager"].get("status") != "ok":
        return
    for sample in range(args.samples):  # taking turns, as every benchmark here does
        for name in args.variant_names:
            result = _run_child(tmp, name, sample, common, VARIANTS[name][1], run.signing_key, args)
            entry["variants"].setdefault(name, []).append(result)
            save()
            log.info("%s %d: %s deviation %s, %s tokens moved", name, sample + 1, result.get("status"),
                     result.get("deviation"), result.get("moved_tokens"))


def _run_child(tmp: Path, variant: str, sample: int, common: list[str], extra: dict[str, str],
               key: str | None, args: argparse.Namespace) -> dict[str, Any]:
    env = {**harness.child_env(tmp / f"{variant}-{sample}", common[common.index("--cache") + 1]), **extra}
    if key and variant.startswith("warm"):
        env["AUTOTUNE_TRUSTED_KEYS"] = key + ".pub"
    cmd = [sys.executable, "-m", "benchmarks.moe_routing", "_child", "--variant", variant, *common]
    log_path = Path(args.log_dir) / f"{variant}-{sample}.log" if args.log_dir else None
    done = harness.run(cmd, env, args.timeout, log_path)
    payload = harness.marker_payload(done.stdout) or {"status": "error", "error": f"no result line (rc {done.rc})"}
    if payload.get("status") != "ok":
        payload["stderr_tail"] = harness.tail(done.stderr)
    return {**payload, "process_wall_s": done.wall_s}


def render(run: dict[str, Any]) -> list[str]:
    entry = run.get("entry") or {}
    sweep = entry.get("sweep") or {}
    lines = [f"Model `{entry.get('model')}` on {entry.get('device')}; sweep {sweep.get('status')} "
             f"({harness.fmt(sweep.get('wall_s'))} s, {sweep.get('tuned')} tuned). A row moved: off by more "
             f"than {MOVED:g} of the output's largest magnitude.", ""]
    rows = []
    for name, results in (entry.get("variants") or {}).items():
        done = [r for r in results if r.get("status") == "ok"]
        deviations = [r["deviation"] for r in done if r["deviation"] is not None]  # None: not finite
        moved = [r["moved_tokens"] for r in done]
        hooks = [r.get("hook") or {} for r in done]
        rows.append([name, " ".join(f"{k}={v}" for k, v in sorted(VARIANTS[name][1].items())) or "-",
                     f"{len(done)}/{len(results)}",
                     f"{statistics.median(deviations):.4g} ({min(deviations):.4g}-{max(deviations):.4g})"
                     if deviations else "-",
                     " / ".join(map(str, moved)) or "-", str(done[0].get("tokens")) if done else "-",
                     " / ".join(f"{h.get('hits')}h {h.get('benchmarks')}b {h.get('artifacts_loaded')}a"
                                for h in hooks if h) or "-"])
    lines += harness.table(["variant", "environment", "processes ok", "deviation, median (min-max)",
                            "moved tokens, each process", "tokens", "hook: hits, benchmarks, artifacts"], rows)
    failed = [f"{name}: {r.get('error')}" for name, results in (entry.get("variants") or {}).items()
              for r in results if r.get("status") != "ok"]
    return lines + [""] + [f"- {line[:200]}" for line in failed] + [""]


def results(out: Path) -> harness.Results:
    return harness.Results(out, "moe_routing", "MoE routing: which served feature moves the output", render)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_child"]:
        child = argparse.ArgumentParser()
        for flag in ("--variant", "--model", "--device", "--cache", "--empty-cache", "--reference"):
            child.add_argument(flag, required=True)
        return _child(child.parse_args(argv[1:]))
    parser = argparse.ArgumentParser(prog="python -m benchmarks.moe_routing",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--model", default="moe", help="a zoo model (default moe)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda when a GPU is visible")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--samples", type=int, default=2, help="processes per variant (default 2)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per process")
    parser.add_argument("--sweep-timeout", type=float, default=600.0)
    parser.add_argument("--out", default="benchmarks/results", help="folder of moe_routing.json/.md")
    parser.add_argument("--label", default=None)
    parser.add_argument("--log-dir", default=None)
    args = parser.parse_args(argv)
    args.variant_names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variant_names if v not in VARIANTS]
    if unknown or args.samples < 1:
        raise SystemExit(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}"
                         if unknown else "--samples must be 1 or more")
    harness.log_to_stderr(False)
    info = harness.machine(120)
    if args.device is None:
        args.device = "cuda" if info.get("gpu") else "cpu"
    store = results(Path(args.out))
    run = store.run(args.label or f"{harness.slug(info.get('gpu') or 'cpu')}: {args.model}", info,
                    "python -m benchmarks.moe_routing " + " ".join(argv))
    began = time.perf_counter()
    run["entry"] = {}

    def save() -> None:
        run["wall_s"] = time.perf_counter() - began
        store.save()

    measure(args, run["entry"], save)
    save()
    print(store.path.with_suffix(".md").read_text())
    return 0 if run["entry"].get("variants") else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
