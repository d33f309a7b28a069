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
it may see), alone and after the marked graph. ``--templates`` adds one more: a job's config,
with capture answering every request that offers a Triton template with that template (a job
served stored winners ran its stem convolution as one; capture answers ATen). Every variant
also traces each autotune input whose size expressions divide a power (``(x**2)//x``): the
Inductor node it came from, to name what builds that form.

Run 129 (H200): the template, job-config and plain variants keyed the same 17 requests, and
the trace found the divided width in capture as well. The cause was the selector filing two
lookups with one ``inputs_key`` and other size expressions as one request
(tests/test_expression_forms.py).

usage: python benchmarks/diag_session_order.py --model convnext_tiny [--job-config] [--templates] [--out DIR]
       python benchmarks/diag_session_order.py --model-file tests/models/tiny_patches.py --device cpu
"""

from __future__ import annotations

import argparse
import json
import os
import re
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


def capture_in_order(model_file: str, sessions: list[str], batch: int, device: str) -> dict[str, Any]:
    """Each session's requests, captured one session after the other in this process, and the
    traced inputs whose sizes divide a power (``_trace_powers``)."""
    from unittest import mock

    from autotune.plan import shape_summary
    from autotune.inductor_glue import capture
    from autotune.inductor_glue.modelfile import load_model_file

    model = load_model_file(model_file)
    if os.environ.get("DIAG_JOB_CONFIG"):  # none of capture's own Inductor settings: a job's
        capture.CAPTURE_CONFIG = {}
    if os.environ.get("DIAG_TEMPLATES"):
        _answer_with_templates(capture)
    traces = _trace_powers()
    found = []
    for kind in sessions:
        with mock.patch.object(capture, "compile_sessions", lambda *_: [capture.Session((batch,), kind)]):
            result = capture.capture_model(model, batch_sizes=(batch,), device=device, dynamic=True)
        found.append([{"key": r.key, "request": shape_summary(r), "op": r.op,
                       "exprs": [list(i.exprs) for i in r.inputs]} for r in result.requests])
    return {"sessions": found, "powers": traces}


def _answer_with_templates(capture: Any) -> None:
    """Capture picks a request's first Triton template, as a job served a template winner does."""
    from torch._inductor import select_algorithm as sa

    answer_aten = capture.CapturePolicy.lookup

    def lookup(self: Any, request: Any, choices: list[Any], benchmark: Any, default: Any) -> Any:
        timings = answer_aten(self, request, choices, benchmark, default)
        templates = [c for c in choices if isinstance(c, sa.TritonTemplateCaller)]
        return {c: (0.001 if c is templates[0] else 1.0) for c in choices} if templates else timings

    capture.CapturePolicy.lookup = lookup


_DIVIDED_POWER = re.compile(r"\*\*\d+\)*//")  # ((s53//4))**2)//((s53//4)): a power divided again


def _trace_powers() -> list[dict[str, Any]]:
    """Each autotune input whose size expressions divide a power, with the Inductor node behind it."""
    from autotune.inductor_glue import inductor

    traces: list[dict[str, Any]] = []
    layouts_of = inductor.input_layouts

    def traced(nodes: list[Any]) -> Any:
        layouts = layouts_of(nodes)
        for node, layout in zip(nodes, layouts):
            if any(_DIVIDED_POWER.search(e) for e in layout.exprs) and len(traces) < 8:
                traces.append({"exprs": list(layout.exprs), "node": str(node)[:4000]})
        return layouts

    inductor.input_layouts = traced
    return traces


def _variant(model_file: str, sessions: str, seed: str, batch: int, device: str,
             job_config: bool = False, templates: bool = False) -> dict[str, Any]:
    env = {**os.environ, "PYTHONHASHSEED": seed, **({"DIAG_JOB_CONFIG": "1"} if job_config else {}),
           **({"DIAG_TEMPLATES": "1"} if templates else {})}
    label = sessions + (" job-config" if job_config else "") + (" templates" if templates else "")
    done = subprocess.run([sys.executable, __file__, "_child", model_file, sessions, str(batch), device],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"sessions": label, "seed": seed, "error": done.stderr[-2000:]}
    captured = json.loads(done.stdout.strip().splitlines()[-1])
    return {"sessions": label, "seed": seed, "requests": captured["sessions"][-1], "powers": captured["powers"]}


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
        for trace in v.get("powers", [])[:2]:
            node = " ".join(trace["node"].split())[:600]
            lines.append(f"  power in {v['sessions']} seed {v['seed']}: {trace['exprs']} from {node}")
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
    parser.add_argument("--templates", action="store_true",
                        help="also capture with a job's config, answering each request with a Triton template")
    parser.add_argument("--skip-order", action="store_true",
                        help="run only the first order variant (all, seed 0) besides those asked for")
    args = parser.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model_file, batch = args.model_file, args.batch or 8
    if args.model:
        import zoo

        model_file = str(zoo.write_stub(args.model, "infer", Path(tempfile.mkdtemp(prefix="diag_order_"))))
        batch = args.batch or zoo.ZOO[args.model].batch(device)
    order = VARIANTS[:1] if args.skip_order else VARIANTS
    asked = [(sessions, seed, {}) for sessions, seed in order]
    if args.templates:  # before the job-config pair: it is the question run 128 left
        asked.append(("all", "0", {"job_config": True, "templates": True}))
    if args.job_config:
        asked += [(sessions, "0", {"job_config": True}) for sessions in ("all", "marked,all")]
    variants: list[dict[str, Any]] = []
    for sessions, seed, flags in asked:  # written after each: a device call's limit may cut the last
        variants.append(_variant(model_file, sessions, seed, batch, device, **flags))
        print(f"done: {variants[-1]['sessions']} seed {seed}", flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "diag_session_order.json").write_text(json.dumps(
                {"model": args.model or model_file, "batch": batch, "device": device, "torch": torch.__version__,
                 "variants": variants}, indent=1) + "\n")
    print("\n".join(compare(variants)))


if __name__ == "__main__":
    main()
