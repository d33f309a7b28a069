"""The README's headline table, made again from one run of the startup benchmark.

    python -m benchmarks.headline                          # rewrite README.md's "Headline figures"
    python -m benchmarks.headline --print                  # print the section, write nothing
    python -m benchmarks.headline --check                  # exit 1 if README.md is not what the run makes
    python -m benchmarks.headline --results FILE --label LABEL ...

The run is the newest run in ``--results`` (``benchmarks/results/startup.json``, made by
``python -m benchmarks.startup``) with every other run of the same commit on the same machine:
one run split over device calls, merged by ``python -m benchmarks.harness merge``. ``--label``
names the runs instead; they too must share one commit and one machine. Only the part of
README.md between the headline markers (the whole section, the first time) is rewritten.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO, RESULTS, load

START, END = "<!-- headline:start -->", "<!-- headline:end -->"
SECTION = "## Headline figures"
SCENARIOS = ("floor", "default", "warm-start")
MACHINE_KEYS = ("gpu", "gpu_count", "cpu", "torch", "cuda")  # what "the same machine" compares


def machine_of(run: dict[str, Any]) -> tuple[Any, ...]:
    info = run.get("machine") or {}
    return tuple(info.get(key) for key in MACHINE_KEYS)


def pick_runs(data: dict[str, Any], labels: list[str] | None) -> list[dict[str, Any]]:
    """The named runs, else the newest and every run of its commit and machine; one commit and one
    machine either way (SystemExit naming the problem otherwise)."""
    runs = [r for r in data.get("runs") or () if r.get("models")]
    if labels:
        named = {r.get("label"): r for r in runs}
        absent = [label for label in labels if label not in named]
        if absent:
            raise SystemExit(f"--label: no run {', '.join(map(repr, absent))} in the results; "
                             f"choose from {', '.join(map(repr, named))}")
        chosen = [named[label] for label in labels]
    elif runs:
        newest = max(runs, key=lambda r: str(r.get("date")))
        chosen = [r for r in runs if r.get("commit") == newest.get("commit") and machine_of(r) == machine_of(newest)]
    else:
        raise SystemExit("no startup run in the results; make one with `python -m benchmarks.startup`")
    if len({r.get("commit") for r in chosen}) > 1 or len({machine_of(r) for r in chosen}) > 1:
        raise SystemExit("--label: the runs differ in commit or machine; a headline is one run of one commit "
                         "on one machine")
    return sorted(chosen, key=lambda r: str(r.get("date")))


def machine_name(run: dict[str, Any]) -> str:
    info = run.get("machine") or {}
    if info.get("gpu"):
        return str(info["gpu"]).removeprefix("NVIDIA ")
    return f"{info.get('cpu_count')}-core CPU"


def figure(cell: dict[str, Any], key: str) -> str:
    found = cell.get(key)
    if not isinstance(found, dict):
        return "-"
    return f"{found['median']:.1f} s ({found['min']:.1f}-{found['max']:.1f})"


def short(commit: Any) -> str:
    """A commit as git's short form, with what follows it ("+changes")."""
    if not commit:
        return "unrecorded"
    head, plus, rest = str(commit).partition("+")
    return (head[:7] if len(head) == 40 else head) + plus + rest


def times(value: Any) -> str:
    return f"{value:.2f}x" if isinstance(value, (int, float)) else "-"


def _sweep_failure(entry: dict[str, Any]) -> str | None:
    """Why the model's sweep, which its scenarios need, did not finish; None where it did."""
    sweep = entry.get("sweep") or {}
    if not sweep or sweep.get("status") == "ok":
        return None
    return f"its sweep did not finish: {(sweep.get('error') or sweep.get('status') or '').strip()[:80]}"


def rows(chosen: list[dict[str, Any]]) -> tuple[list[list[str]], list[str], set[int]]:
    """One row per model measured, the models not measured (with why) and the samples per figure."""
    table, absent, samples = [], [], set()
    for run in chosen:
        for name, entry in (run.get("models") or {}).items():
            cells = entry.get("scenarios") or {}
            if not all((cells.get(s) or {}).get("samples") for s in SCENARIOS):
                absent.append(f"{name} ({entry.get('skipped') or _sweep_failure(entry) or 'a scenario has no good process'})")
                continue
            samples |= {cells[s]["samples"] for s in SCENARIOS}
            warm = (entry.get("vs_floor") or {}).get("warm-start") or {}
            table.append([f"{entry.get('title') or name} (`{entry.get('path')}`)",
                          f"{machine_name(run)}, torch {(run.get('machine') or {}).get('torch')}, "
                          f"{str(run.get('date'))[:10]}",
                          "/".join(str(cells[s]["samples"]) for s in SCENARIOS),
                          *(figure(cells[s], "whole_process_s") for s in SCENARIOS),
                          f"**{times(warm.get('whole_process_s'))}**",
                          *(figure(cells[s], "first_call_s") for s in SCENARIOS),
                          times(warm.get("first_call_s"))])
    return table, absent, samples


def section(data: dict[str, Any], labels: list[str] | None = None, results_name: str = "startup.json") -> str:
    """The markers and what goes between them."""
    chosen = pick_runs(data, labels)
    table, absent, samples = rows(chosen)
    first = chosen[0]
    busy = first.get("busy_seconds", 5)
    per = "/".join(map(str, sorted(samples))) or "-"
    # A run's note is printed with it in the results; the headline names the command alone.
    commands = made_by(chosen)
    lines = [
        START,
        "What a user waits for: a script in the user's order (the model's libraries imported at the",
        f"top, the set-up call, the model built, {busy:g} s of Python CPU work, then `torch.compile` and",
        "the first call or training step), in a fresh process with empty local caches. The judged",
        "figure is the whole process, from its start to the first result; the first call (compile to",
        "first result) is beside it. The **floor** is a default-mode compile that loads its own",
        "Mega-cache blob (`torch.compiler.load_cache_artifacts`, Dynamo's `caching_precompile` on);",
        "**default** is a plain default-mode compile; the **warm start** is `autotune.warm_start()` at",
        "the script's top, its max-autotune compile served from a swept cache.",
        "",
        f"The rule every row keeps: one run, one commit ({short(first.get('commit'))}), the same machine,",
        f"{per} processes per figure, the scenarios taking turns; each figure is their median, with",
        "the fastest and slowest in brackets (the processes column: floor/default/warm start), and",
        "each ratio is between medians of that run. Made by `python -m benchmarks.headline` from",
        f"`benchmarks/results/{results_name}` ({commands}); every run, with its method, in",
        "[docs/results.md](docs/results.md).",
        "",
        *table_lines(table, absent),
    ]
    return "\n".join([*lines, END])


def made_by(chosen: list[dict[str, Any]]) -> str:
    """The command, and for a run split over device calls each call's models (every command in full
    is in the results)."""
    if len(chosen) == 1:
        return f"`{str(chosen[0].get('command')).split(' --note ')[0]}`"
    models = "; ".join(f"`{','.join(run.get('models') or {})}`" for run in chosen)
    return f"`python -m benchmarks.startup` in {len(chosen)} device calls, `--models` {models}"


def table_lines(table: list[list[str]], absent: list[str]) -> list[str]:
    """The table of ``rows``' result, and the models it lacks (docs/results.md shows it too)."""
    lines = ["| model | machine, torch, date | processes | whole: floor | whole: default | whole: warm start "
             "| warm/floor | first call: floor | first call: default | first call: warm start | warm/floor |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
             *("| " + " | ".join(row) + " |" for row in table)]
    return lines + (["", f"Not measured in this run: {'; '.join(absent)}."] if absent else [])


def rewrite(readme: str, new: str) -> str:
    """``readme`` with ``new`` between the markers, or as the whole Headline section's body."""
    if START in readme and END in readme:
        head, rest = readme.split(START, 1)
        return head + new + rest.split(END, 1)[1]
    if SECTION not in readme:
        raise SystemExit(f"README.md has no {SECTION!r} section and no headline markers")
    head, rest = readme.split(SECTION, 1)
    tail = rest[rest.find("\n## "):] if "\n## " in rest else "\n"
    return f"{head}{SECTION}\n\n{new}\n{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.headline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS / "startup.json")
    parser.add_argument("--readme", type=Path, default=REPO / "README.md")
    parser.add_argument("--label", action="append", default=None, help="a run to use (repeatable)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--print", dest="show", action="store_true", help="print the section; write nothing")
    what.add_argument("--check", action="store_true", help="exit 1 if README.md differs from what the run makes")
    args = parser.parse_args(argv)
    if not args.results.is_file():
        raise SystemExit(f"--results {args.results}: no such file; run `python -m benchmarks.startup` first")
    new = section(load(args.results), args.label, args.results.name)
    if args.show:
        print(new)
        return 0
    readme = args.readme.read_text()
    updated = rewrite(readme, new)
    if args.check:
        print("README.md's headline is up to date" if updated == readme else "README.md's headline differs")
        return 0 if updated == readme else 1
    args.readme.write_text(updated)
    print(f"wrote the headline of {args.readme} from {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
