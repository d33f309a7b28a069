"""How busy the host's CPUs were in each phase of the sweeps that sweep_bench.py timed.

On the device, sample the host beside a sweep_bench run, then read both here:

    vmstat -n -t 1 > $OUT/vmstat.txt & V=$!
    python benchmarks/sweep_bench.py --models resnet,gpt --steps sweep1,sweep4 --out $OUT/sb > $OUT/sb.log 2>&1
    kill $V
    python benchmarks/diag_cpu_phases.py --vmstat vmstat.txt --log sb.log --json sb/sweep_bench_*.json

For each sweep step, the mean of vmstat's user+system CPU (% of all cores) and its run
queue over three windows of the sweep's own timeline: start-up (until every tuning child is
warm), GEMM/conv tuning (first request queued to last result) and the pointwise pass. The
timeline counts from run_sweep's start, a few seconds after the step's process began
(``outside_s``: interpreter start and imports); the windows are shifted by most of that.
vmstat samples once a second, so a window of a few seconds holds a few samples: read the
figures as "mostly idle" or "saturated", not to the percent.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path
from typing import Any

STEP_START = re.compile(r"(\S+ \S+),\d+ INFO (\S+) sweep (\d) GPUs? \.\.\.")


def vmstat_rows(path: Path) -> list[tuple[dt.datetime, int, int]]:
    """(time, user+system %, run queue) per sample of ``vmstat -n -t 1``."""
    rows = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if not fields or not fields[0].isdigit():
            continue  # the two header lines
        when = dt.datetime.strptime(f"{fields[-2]} {fields[-1]}", "%Y-%m-%d %H:%M:%S")
        rows.append((when, int(fields[12]) + int(fields[13]), int(fields[0])))
    return rows


def step_starts(log: Path) -> list[tuple[dt.datetime, str, str]]:
    """(start time, model, step) of each sweep step in sweep_bench.py's log."""
    starts = []
    for line in log.read_text().splitlines():
        match = STEP_START.match(line.strip())
        if match:
            starts.append((dt.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S"), match[2], f"sweep{match[3]}"))
    return starts


def window(rows: list[tuple[dt.datetime, int, int]], began: dt.datetime, shift: float, start: float,
           end: float) -> dict[str, Any]:
    picked = [(busy, queue) for when, busy, queue in rows if start <= (when - began).total_seconds() - shift < end]
    if not picked:
        return {"samples": 0}
    return {"samples": len(picked), "busy_pct": sum(b for b, _ in picked) / len(picked),
            "run_queue": sum(q for _, q in picked) / len(picked), "peak_busy_pct": max(b for b, _ in picked)}


def phases(rows: list[tuple[dt.datetime, int, int]], began: dt.datetime, step: dict[str, Any]) -> dict[str, Any]:
    timeline = step.get("timeline") or {}
    shift = 0.8 * float(step.get("outside_s") or 0.0)  # most of it is before run_sweep starts
    return {
        "start-up": window(rows, began, shift, 0.0, timeline.get("all_children_warm", 0.0)),
        "tuning": window(rows, began, shift, timeline.get("first_request_queued", 0.0), timeline.get("last_result", 0.0)),
        "pointwise": window(rows, began, shift, timeline.get("pointwise_go", 0.0), timeline.get("pointwise_done", 0.0)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vmstat", required=True, help="the output of `vmstat -n -t 1` beside the run")
    parser.add_argument("--log", required=True, help="sweep_bench.py's log (its step start times)")
    parser.add_argument("--json", required=True, help="sweep_bench.py's JSON (each sweep's timeline)")
    args = parser.parse_args()
    rows = vmstat_rows(Path(args.vmstat))
    report = json.loads(Path(args.json).read_text())
    print("| model | step | wall s | start-up busy % (run queue) | tuning busy % (run queue, peak %) | pointwise busy % |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for began, model, label in step_starts(Path(args.log)):
        step = (report["models"].get(model) or {}).get(label) or {}
        if step.get("status") != "ok":
            continue
        p = phases(rows, began, step)

        def fmt(w: dict[str, Any], peak: bool = False) -> str:
            if not w["samples"]:
                return "-"
            extra = f", {w['peak_busy_pct']}" if peak else ""
            return f"{w['busy_pct']:.0f} ({w['run_queue']:.0f}{extra})"

        print(f"| {model} | {label} | {step['wall_s']:.1f} | {fmt(p['start-up'])} | {fmt(p['tuning'], True)} "
              f"| {fmt(p['pointwise'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
