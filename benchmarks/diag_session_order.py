"""Does a dynamic graph's request list depend on what its process compiled before it?

Runs 120-122 (H100): ConvNeXt-T's `--dynamic` sweep captured the ``dynamic=True`` graph
after the marked graph, in one process, and keyed the first stage's ``addmm`` and 7x7
depthwise convolution with a width of ``s53//4``. A fresh warm-start job, which compiles
the ``dynamic=True`` graph alone, asked for both with a width of
``((s53//4)**2)//(s53//4)``: other kernel sources, other keys, two misses. The sweep's pass,
which also compiles the marked graph first, hit them. On this CPU the convolutions are
ATen's alone and the forms never differ, so the question needs a GPU.

Each variant runs in a fresh process: the sessions in the order given (``capture_model``
once per session, so each session's own requests are listed) under one PYTHONHASHSEED. The
report compares the last session's request keys across variants and prints each request
found in one variant only, with its size expressions: the same keys everywhere means the
order does not matter.

Run 128 (H100): all four variants keyed the same 17 requests, so order is not the cause.
``--job-config`` adds two variants that capture with a job's Inductor config, without
capture's own settings (``CAPTURE_CONFIG``: ``benchmark_epilogue_fusion`` stays on, so a
template's node is a MultiTemplateBuffer until the scheduler settles it, which a view after
it may see), alone and after the marked graph.

usage: python benchmarks/diag_session_order.py --model convnext_tiny [--job-config] [--out DIR]
       python benchmarks/diag_session_order.py --model-file tests/models/tiny_patches.py --device cpu
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))  # the zoo registry

# (sessions in order, PYTHONHASHSEED): the job's order, the sweep's order, and each again
# under another seed (a set's order could also decide which form Inductor builds).
VARIANTS: tuple[tuple[str, str], ...] = (("all", "0"), ("all", "1"), ("marked,all", "0"), ("marked,all", "1"))


def capture_in_order(model_file: str, sessions: list[str], batch: int, device: str) -> list[list[dict[str, Any]]]:
    """Each session's requests, captured one session after the other in this process."""
    from unittest import mock

    from autotune.plan import shape_summary
    from inductor_glue import capture
    from inductor_glue.modelfile import load_model_file

    model = load_model_file(model_file)
    if os.environ.get("DIAG_JOB_CONFIG"):  # none of capture's own Inductor settings: a job's
        capture.CAPTURE_CONFIG = {}
    found = []
    for kind in sessions:
        with mock.patch.object(capture, "compile_sessions", lambda *_: [capture.Session((batch,), kind)]):
            result = capture.capture_model(model, batch_sizes=(batch,), device=device, dynamic=True)
        found.append([{"key": r.key, "request": shape_summary(r), "op": r.op,
                       "exprs": [list(i.exprs) for i in r.inputs]} for r in result.requests])
    return found


def _variant(model_file: str, sessions: str, seed: str, batch: int, device: str,
             job_config: bool = False) -> dict[str, Any]:
    env = {**os.environ, "PYTHONHASHSEED": seed, **({"DIAG_JOB_CONFIG": "1"} if job_config else {})}
    label = sessions + (" job-config" if job_config else "")
    done = subprocess.run([sys.executable, __file__, "_child", model_file, sessions, str(batch), device],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"sessions": label, "seed": seed, "error": done.stderr[-2000:]}
    last = json.loads(done.stdout.strip().splitlines()[-1])[-1]
    return {"sessions": label, "seed": seed, "requests": last}


def compare(variants: list[dict[str, Any]]) -> list[str]:
    """One line per variant, then each request that some variant lacks."""
    ran = [v for v in variants if "requests" in v]
    keys = [{r["key"] for r in v["requests"]} for v in ran]
    everywhere = set.intersection(*keys) if keys else set()
    lines = [f"{v['sessions']:<21} seed {v['seed']}: " + (v["error"].strip().splitlines()[-1] if "error" in v else
             f"{len(v['requests'])} requests, {len({r['key'] for r in v['requests']} - everywhere)} found only here")
             for v in variants]
    for v in ran:
        for r in v["requests"]:
            if r["key"] not in everywhere:
                lines.append(f"  only in {v['sessions']} seed {v['seed']}: {r['request']} exprs {r['exprs']}")
    return lines


def main() -> None:
    if sys.argv[1:2] == ["_child"]:
        model_file, sessions, batch, device = sys.argv[2:6]
        print(json.dumps(capture_in_order(model_file, sessions.split(","), int(batch), device)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="a zoo model (benchmarks/zoo), inference")
    source.add_argument("--model-file", help="a model file, as `autotune sweep` takes")
    parser.add_argument("--batch", type=int, default=None, help="default: the zoo's batch, else 8")
    parser.add_argument("--device", default=None, help="default: cuda when a GPU is visible")
    parser.add_argument("--out", type=Path, default=None, help="write diag_session_order.json here")
    parser.add_argument("--job-config", action="store_true",
                        help="also capture without capture's own Inductor settings (CAPTURE_CONFIG), alone "
                             "and after the marked graph")
    args = parser.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model_file, batch = args.model_file, args.batch or 8
    if args.model:
        import zoo

        model_file = str(zoo.write_stub(args.model, "infer", Path(tempfile.mkdtemp(prefix="diag_order_"))))
        batch = args.batch or zoo.ZOO[args.model].batch(device)
    variants = [_variant(model_file, sessions, seed, batch, device) for sessions, seed in VARIANTS]
    if args.job_config:
        variants += [_variant(model_file, sessions, "0", batch, device, job_config=True)
                     for sessions in ("all", "marked,all")]
    print("\n".join(compare(variants)))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "diag_session_order.json").write_text(json.dumps(
            {"model": args.model or model_file, "batch": batch, "device": device, "torch": torch.__version__,
             "variants": variants}, indent=1) + "\n")


if __name__ == "__main__":
    main()
