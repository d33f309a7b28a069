"""Make docs/results.md from the committed results files: one current run per benchmark.

Each section is one run of one results file (``benchmarks/results/NAME.json``): the newest run on a
committed tree, unless ``CURRENT`` names another (for ``SPLIT_RUNS``, with every run of its commit and
machine: one run split over device calls). Its table is the benchmark's own Markdown for that
run (the same as ``NAME.md``), headed by the run's machine, versions, date, commit, samples and spread.

    python docs/gen_results.py           # write docs/results.md
    python docs/gen_results.py --check   # exit 1 if docs/results.md is not what the results make
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "docs"))  # _generated, also where a test loads this file by its path

from _generated import write_or_check  # noqa: E402  (after docs/ is on the path)

from benchmarks import harness, headline  # noqa: E402  (after the repository is on the path)

RESULTS = REPO / "benchmarks" / "results"
TARGET = REPO / "docs" / "results.md"
# Benchmarks in reading order, with the picture drawn from the same file (benchmarks/plots.py).
ORDER = ("startup", "install_cost", "compile_time", "conformance", "sweep_bench", "second_sweep", "sweep_output", "cli_latency",
         "team_queue", "cluster_run", "distributed", "optimizer_trace", "install_imports", "import_race",
         "cache_bench", "faults")
PICTURES = {"compile_time": ("first_call.png", "First call per model on one GPU, one run per model"),
            "conformance": ("kernel_time.png", "Kernel time of the warm start against cold max-autotune"),
            "sweep_bench": ("sweep_scaling.png", "The sweep on 1, 2 and 4 GPUs of one host")}
# Where the newest run is not the one that answers the benchmark's question: the GPU zoo, not a CPU
# latency re-run.
CURRENT = {"conformance": "nvidia-h200, second samples"}
# One run split over device calls (each call at most 10 minutes): the newest run with every run of its
# commit and machine, shown as the README's headline table shows them.
SPLIT_RUNS = {"startup"}
SAMPLE_FLAGS = ("--processes", "--latency-processes", "--rounds", "--samples", "--runs", "--repeats")
SPREAD_WORDS = re.compile(r"\b(spread|min-max|range|median|p50|p99|stdev)\b", re.IGNORECASE)
BODY_LIMIT = 1000  # characters of a run's Markdown on this page, lowered until the page fits
LIMITS = {"compile_time": 1500, "startup": 3000, "install_cost": 2000}  # their tables are the point
MAX_BYTES = 24 * 1024  # under the 25 KB the page may have, with room for a hand's edit
# A label's lease numbers and commits: the commit has its own column, and lease numbers name nothing here.
LABEL_HISTORY = re.compile(r"\s*\((?:runs? \d[^)]*|[^)]*\b[0-9a-f]{7,40}\b[^)]*)\)")
# The heading other pages link to, where it differs from the benchmark's own title.
TITLES = {"distributed": "Training jobs under torchrun"}
ISSUE = re.compile(r"\s*\(?\bissues? \d+[^).]*\)?")

INTRO = """# Results

Every figure here comes from a committed benchmark (`python -m benchmarks.NAME`) and its results
file, `benchmarks/results/NAME.json`, with `NAME.md` made from it beside it. This page shows one
current run per benchmark: the newest run on a committed tree (for the model zoo, the newest GPU
run). Each section names that run's machine, versions, date (UTC), the commit it ran, its samples
and where its spread is; the other runs stay in `NAME.md`, and earlier ones in git's history.

A ratio is quoted only between figures of one run: each scenario a fresh process with fresh
Inductor and Triton caches, minutes apart on one machine. Absolute times move by 10-20% between
runs and between machines of one kind. The pictures are drawn from the same files by
`python -m benchmarks.plots`; this page is made by `python docs/gen_results.py`. Run both again
whenever a results file changes.

`startup` (a script's whole process, start to first result) replaces the earlier `prefetch`
benchmark; the prefetch runs are in git's history only.
"""


def current_run(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    named = [r for r in runs if r.get("label") == CURRENT.get(name)]
    committed = [r for r in runs if "+" not in str(r.get("commit"))]
    return named[0] if named else max(committed or runs, key=lambda r: str(r.get("date")))


def describe(name: str) -> str:
    """The benchmark module's first paragraph, without issue numbers."""
    doc = importlib.import_module(f"benchmarks.{name}").__doc__ or ""
    text = " ".join(doc.split("\n\n")[0].split())
    return ISSUE.sub("", text).replace("``", "`")


def samples(run: dict[str, Any]) -> str:
    if isinstance(run.get("samples"), int):
        return f"{run['samples']} per figure"
    flags = [f"{flag}={value}" for flag, value in re.findall(r"(--[a-z-]+)[ =](\d+)", str(run.get("command")))
             if flag in SAMPLE_FLAGS]
    return ", ".join(f"`{f}`" for f in flags) or "the benchmark's defaults (its `--help`)"


def versions(info: dict[str, Any]) -> str:
    keys = ("python", "torch", "triton", "cuda", "autotune")
    return ", ".join(f"{k} {info[k]}" for k in keys if info.get(k)) or "-"


def machine(info: dict[str, Any]) -> str:
    gpu = f"{info['gpu']} x{info.get('gpu_count', 1)}; " if info.get("gpu") else "no GPU; "
    return f"{gpu}{info.get('cpu') or '-'} ({info.get('cpu_count')} cores)"


def header(name: str, runs: list[dict[str, Any]], body: list[str]) -> list[str]:
    """A row per run: its machine, versions, date, commit, samples and where its spread is."""
    spread = "in the table" if SPREAD_WORDS.search("\n".join(body)) else f"not in the table; see `{name}.json`"
    rows = []
    for run in runs:
        info = run.get("machine") or run.get("device") or {}
        date = str(run.get("date"))[:16].replace("T", " ")
        rows.append((LABEL_HISTORY.sub("", str(run.get("label"))), machine(info), versions(info), date,
                     run.get("commit") or "unrecorded", samples(run), spread))
    return harness.table(("run", "machine", "versions", "date (UTC)", "commit", "samples", "spread"), rows)


def split_body(runs: list[dict[str, Any]]) -> list[str]:
    """The runs of one split run as one table, a row per model (benchmarks.headline's), then
    where each scenario's whole process goes, phase by phase."""
    from benchmarks.startup import PHASES, phase_rows

    table, absent, _ = headline.rows(runs)
    phases = [[name, *row] for run in runs for name, entry in (run.get("models") or {}).items()
              for row in phase_rows(entry.get("scenarios") or {})]
    return ["Each figure is the median of its processes, with the min-max in brackets.", "",
            *headline.table_lines(table, absent), "",
            "Where each whole process goes: the median seconds of each phase, in the script's order, "
            "and the modules imported by the set-up call and after it.", "",
            *harness.table(["model", "scenario", *PHASES.values(), "modules: set-up / after"], phases)]


def clip(name: str, body: list[str], scale: float) -> list[str]:
    """The run's Markdown up to its limit in characters, cut between lines; the rest is in ``NAME.md``."""
    kept: list[str] = []
    limit = int(LIMITS.get(name, BODY_LIMIT) * scale)
    for line in body:
        if sum(len(k) + 1 for k in kept) + len(line) > limit:
            left = len(body) - len(kept)
            more = f"{left} more line{'s' if left != 1 else ''}"
            return kept + ["", f"({more} in [`{name}.md`](../benchmarks/results/{name}.md).)"]
        kept.append(line)
    return kept


def section(name: str, scale: float) -> list[str]:
    path = RESULTS / f"{name}.json"
    if not path.exists() or "runs" not in json.loads(path.read_text()):
        return []  # none yet, or one run of a layout of its own (install_matrix.json: docs/versions.md)
    store = harness.results_of(path)
    runs = store.data["runs"]
    if not runs:
        return []
    shown = headline.pick_runs(store.data, None) if name in SPLIT_RUNS else [current_run(name, runs)]
    body = split_body(shown) if name in SPLIT_RUNS else store.render(shown[0])
    left = len(runs) - len(shown)
    others = {0: "", 1: f" 1 other run is in `{name}.md`."}.get(left, f" {left} other runs are in `{name}.md`.")
    lines = [f"## {TITLES.get(name, store.title)}", "", f"`{name}.json`. {describe(name)}{others}", ""]
    lines += header(name, shown, body) + [""]
    if name in PICTURES:
        image, alt = PICTURES[name]
        lines += [f"![{alt}](images/{image})", ""]
    return lines + clip(name, body, scale) + [""]


def make() -> str:
    """The page, each run's Markdown clipped a little more until the page fits ``MAX_BYTES``."""
    versions_note = "The install matrix (`install_matrix.json`) is the table of `docs/versions.md`."
    for scale in (1.0, 0.85, 0.7, 0.55, 0.4):
        lines = [INTRO]
        for name in ORDER:
            lines += section(name, scale)
        text = "\n".join(lines + [versions_note, ""])
        if len(text.encode()) <= MAX_BYTES:
            break
    return text


def main(argv: list[str] | None = None) -> int:
    return write_or_check(TARGET, make, __file__, __doc__ or "", argv)


if __name__ == "__main__":
    sys.exit(main())
