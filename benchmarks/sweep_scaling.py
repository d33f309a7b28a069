"""Sweep scaling: the same sweep on 1, 2, 4 ... GPUs of one host.

For each model and GPU count, ``autotune sweep MODEL --gpus N --json`` runs in a
fresh process with a fresh SQLite cache and fresh Inductor/Triton cache dirs.
It records the whole command's wall time and the sweep's own phases (capture,
Ray/actor start-up, GEMM tuning, the pointwise pass), and computes parallel
efficiency ``T(1) / (N * T(N))`` for the whole command and for the GEMM tuning
phase alone. ``bound`` is the best the tuning phase could do on N GPUs with
these requests: max(longest request, total / N).

    python benchmarks/sweep_scaling.py --models resnet,gpt --gpus 1,2,4

Writes ``<out>/sweep_scaling_<gpu>.json`` and ``.md`` (merged with earlier runs).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_time import MODELS, REPO, _child_env, _run, _sweep_payload, _tail, machine_info, slug  # noqa: E402

log = logging.getLogger("sweep_scaling")


def run_one(model: str, gpus: int, tmp: Path, timeout: float, log_dir: Path | None, gpu_slug: str) -> dict[str, Any]:
    cache_url = f"sqlite:///{tmp / 'cache.db'}"
    cmd = [sys.executable, "-c", "from autotune.cli import main; main(prog_name='autotune')",
           "sweep", model, "--cache", cache_url, "--gpus", str(gpus), "--json"]
    log_path = log_dir / f"{gpu_slug}-{Path(model).stem}-{gpus}gpu.log" if log_dir else None
    done = _run(cmd, _child_env(tmp, cache_url), timeout, log_path)
    result: dict[str, Any] = {"gpus": gpus, "wall_s": done.wall_s, "rc": done.rc}
    report = _sweep_payload(done.stdout)
    if report is None or done.rc != 0:
        result.update(status="error", error=f"rc={done.rc}", stderr_tail=_tail(done.stderr))
        return result
    totals = report["totals"]
    per_request = [r["tuning_seconds"] for r in report["requests"] if r.get("tuning_seconds")]
    pointwise = report.get("pointwise") or {}
    result.update(
        status="ok",
        sweep_wall_s=totals["wall_seconds"],
        capture_s=totals["capture_seconds"],
        startup_s=totals["startup_seconds"],
        tuning_s=totals.get("tuning_seconds"),
        pointwise_s=pointwise.get("seconds"),
        found=totals["found"],
        tuned=totals["tuned"],
        failed=totals["failed"],
        request_seconds_total=sum(per_request),
        request_seconds_max=max(per_request, default=0.0),
        bound_s=max(max(per_request, default=0.0), sum(per_request) / gpus),
    )
    return result


def efficiencies(runs: list[dict[str, Any]]) -> None:
    base = next((r for r in runs if r.get("gpus") == 1 and r.get("status") == "ok"), None)
    for run in runs:
        if base is None or run.get("status") != "ok":
            continue
        n = run["gpus"]
        run["efficiency"] = base["wall_s"] / (n * run["wall_s"])
        if base.get("tuning_s") and run.get("tuning_s"):
            run["tuning_efficiency"] = base["tuning_s"] / (n * run["tuning_s"])


def _f(value: Any, spec: str = ".1f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def render(report: dict[str, Any]) -> str:
    info = report["machine"]
    lines = [f"# Sweep scaling: {info.get('gpu')} x{info.get('gpu_count')}", "",
             f"Generated {report['date']} by `python benchmarks/sweep_scaling.py {report['argv']}`.", "",
             f"- CPU: {info.get('cpu')} ({info.get('cpu_count')} logical cores)",
             f"- python {info.get('python')}, torch {info.get('torch')}, triton {info.get('triton')}, "
             f"CUDA {info.get('cuda')}, driver {info.get('driver')}", "",
             "Each run: `autotune sweep MODEL --gpus N` in a fresh process, fresh SQLite cache, fresh "
             "Inductor/Triton dirs. *wall*: the whole command. *capture*, *start-up* (overlaps capture), "
             "*GEMM tuning*, *pointwise*: the sweep's own phases. *efficiency* = T(1) / (N x T(N)); "
             "*tuning eff.* is the same for the GEMM tuning phase; *bound*: the shortest tuning phase "
             "possible on N GPUs with these requests, max(longest request, sum / N).", ""]
    for model, runs in report["models"].items():
        lines += [f"## {model}", "",
                  "| GPUs | status | wall s | efficiency | capture s | start-up s | GEMM tuning s | bound s "
                  "| tuning eff. | pointwise s | requests |",
                  "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in runs:
            lines.append(
                f"| {r['gpus']} | {r.get('status')} | {_f(r.get('wall_s'))} | {_f(r.get('efficiency'), '.2f')} "
                f"| {_f(r.get('capture_s'))} | {_f(r.get('startup_s'))} | {_f(r.get('tuning_s'))} "
                f"| {_f(r.get('bound_s'))} | {_f(r.get('tuning_efficiency'), '.2f')} | {_f(r.get('pointwise_s'))} "
                f"| {r.get('tuned', '-')}/{r.get('found', '-')} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet,gpt", help="model names or paths (default: resnet,gpt)")
    parser.add_argument("--gpus", default="1,2,4", help="GPU counts (default: 1,2,4)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--log-dir", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    counts = [int(n) for n in args.gpus.split(",") if n.strip()]
    info = machine_info(300)
    gpu = slug(info.get("gpu") or "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / f"sweep_scaling_{gpu}.json", out / f"sweep_scaling_{gpu}.md"
    report: dict[str, Any] = json.loads(json_path.read_text()) if json_path.exists() else {"models": {}}
    report.update(machine=info, argv=" ".join(sys.argv[1:]),
                  date=dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat())
    for name in (m.strip() for m in args.models.split(",") if m.strip()):
        model = MODELS.get(name, name)
        runs = []
        for n in counts:
            if n > int(info.get("gpu_count") or 0):
                log.warning("skipping %d GPUs: this host has %s", n, info.get("gpu_count"))
                continue
            tmp = Path(tempfile.mkdtemp(prefix=f"scaling_{n}_"))
            try:
                log.info("%s on %d GPU(s) ...", name, n)
                runs.append(run_one(model, n, tmp, args.timeout, Path(args.log_dir) if args.log_dir else None, gpu))
                log.info("%s on %d GPU(s): %s %.1f s", name, n, runs[-1].get("status"), runs[-1]["wall_s"])
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            efficiencies(runs)
            report["models"][Path(model).stem if name not in MODELS else name] = runs
            json_path.write_text(json.dumps(report, indent=2) + "\n")
            md_path.write_text(render(report))
    print(md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
