"""What a sweep prints: lines on the terminal without ``-v``, and what ``--json`` leaves on stderr.

Two sweeps of the same models into fresh SQLite caches, each in a fresh process with fresh
compile caches: one as a user runs it (its stdout and stderr counted together, as a terminal
shows them), one with ``--json`` (stdout must be the report, stderr only the sweep's own
errors and warnings). Every stderr line of the ``--json`` sweep is kept in the results.

    python -m benchmarks.sweep_output --models examples/resnet.py,examples/gpt.py --out $OUT
    python -m benchmarks.sweep_output --models tests/models/tiny_mlp.py --device cpu   # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import harness

LINE_GOAL = 25  # lines a two-model GPU sweep may print without -v


def sweep(models: list[str], device: str | None, work: Path, extra: list[str], timeout: float) -> dict[str, Any]:
    """One sweep in a fresh process; its exit status, time and output lines."""
    cache = f"sqlite:///{work / 'cache.db'}"
    cmd = [*harness.AUTOTUNE, "sweep", *models, "--cache", cache, "--log", str(work / "sweep.log"), *extra]
    cmd += ["--device", device] if device else []
    done = harness.run(cmd, harness.child_env(work / "caches", cache), timeout)
    stdout, stderr = done.stdout.splitlines(), done.stderr.splitlines()
    return {"returncode": done.rc, "seconds": round(done.wall_s, 1), "stdout_lines": len(stdout),
            "stderr_lines": len(stderr), "stdout": stdout, "stderr": stderr}


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    models = [m for m in args.models.split(",") if m]
    plain = sweep(models, args.device, work / "plain", [], args.timeout)
    as_json = sweep(models, args.device, work / "json", ["--json"], args.timeout)
    try:
        json.loads("\n".join(as_json["stdout"]))
        report_ok = True
    except ValueError:
        report_ok = False
    terminal = plain["stdout_lines"] + plain["stderr_lines"]
    return {"models": models, "plain": plain, "json": {**as_json, "stdout_is_the_report": report_ok},
            "terminal_lines": terminal, "goal_met": terminal <= LINE_GOAL and as_json["returncode"] == 0}


def render(entry: dict[str, Any]) -> list[str]:
    m = entry.get("measured") or {}
    plain, as_json = m.get("plain") or {}, m.get("json") or {}
    lines = harness.table(
        ["models", "terminal lines (goal <= 25)", "exit", "seconds", "--json: stdout is the report",
         "--json: stderr lines", "--json exit"],
        [[", ".join(m.get("models", [])), m.get("terminal_lines"), plain.get("returncode"), plain.get("seconds"),
          as_json.get("stdout_is_the_report"), as_json.get("stderr_lines"), as_json.get("returncode")]])
    lines += ["", "The terminal without `-v`:", "", "```", *plain.get("stdout", []), *plain.get("stderr", []), "```"]
    lines += ["", "stderr of the `--json` sweep:", "", "```", *(as_json.get("stderr") or ["(empty)"]), "```"]
    return lines


def results(out: Path) -> harness.Results:
    return harness.Results(out, "sweep_output", "What a sweep prints", render)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sweep_output", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="examples/resnet.py,examples/gpt.py", help="comma-separated model files")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: the sweep's own choice)")
    harness.output_options(parser, "sweep_output", "the machine's GPU or CPU", timeout=540.0, per="sweep")
    args = parser.parse_args(argv)
    harness.log_to_stderr()
    info = harness.machine()
    label = args.label or harness.slug(f"{info.get('gpu') or info.get('cpu')} x{info.get('gpu_count', 1)}")
    store = results(args.out)
    with tempfile.TemporaryDirectory(prefix="sweep-output-") as tmp:
        entry = store.run(label, info, "python -m benchmarks.sweep_output " + " ".join(argv or []))
        entry["measured"] = measure(args, Path(tmp))
    store.save()
    m = entry["measured"]
    print(f"terminal lines {m['terminal_lines']} (goal <= {LINE_GOAL}); --json stderr lines "
          f"{m['json']['stderr_lines']}; wrote {store.path}")
    return 0 if m["json"]["returncode"] == 0 and m["plain"]["returncode"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
