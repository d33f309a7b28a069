"""The pictures of docs/results.md, drawn from the committed results (run it whenever they change):

- ``first_call.png``: the first call per model, default vs cold max-autotune vs the warm start
  with artifacts, and the floor where the same run measured it (compile_time.json, GPU runs):
  each model once, from the newest single run of it on committed code;
- ``kernel_time.png``: each zoo model's summed GPU kernel time, warm start against cold
  max-autotune in the same dynamic mode (conformance.json, GPU runs);
- ``sweep_scaling.png``: the sweep's wall time on 1, 2 and 4 GPUs of one host, against cold
  max-autotune and ideal scaling (sweep_bench.json, runs with more than one GPU).

    python -m benchmarks.plots [--results benchmarks/results] [--out docs/images]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from benchmarks import conformance, harness  # noqa: E402

MODEL_NAMES = {"resnet": "ResNet-18 bf16 b16", "gpt": "4 transformer blocks d1024", "gpt2_hf": "HF GPT-2 small",
               "lm_train": "LM training step", "mlp": "MLP (CPU)"}
FIRST_CALL = (("default", "default mode", "#8c8c8c"), ("max-autotune-cold", "max-autotune, cold", "#d62728"),
              ("warm-start-artifacts", "autotune warm start + artifacts", "#2ca02c"),
              ("floor", "floor: default + Mega-cache + precompile", "#1f77b4"))
IMAGES = ("first_call.png", "kernel_time.png", "sweep_scaling.png")


def _gpu_runs(path: Path) -> list[dict[str, Any]]:
    return [r for r in harness.load(path)["runs"] if (r.get("machine") or {}).get("gpu")]


def _where(runs: list[dict[str, Any]]) -> str:
    """The machine, versions and dates of the runs a picture shows, for its title."""
    machine = runs[0]["machine"]
    dates = sorted({str(r["date"])[:10] for r in runs})
    span = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return f"{machine['gpu']}, torch {machine.get('torch')}, triton {machine.get('triton')}; {span}"


def one_run_per_model(runs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str, dict[str, Any]]]:
    """Each model once: from the newest run that measured it on committed code, a run being one
    benchmark command (a label naming several runs is a merge of them, and is left out)."""
    chosen: dict[str, tuple[dict[str, Any], str, dict[str, Any]]] = {}
    for run in sorted(runs, key=lambda r: str(r["date"])):
        if "+" in str(run.get("commit")) or re.search(r"\bruns\b", str(run.get("label"))):
            continue
        for model, entry in run["models"].items():
            chosen[model] = (run, model, entry["scenarios"])
    return [chosen[m] for m in MODEL_NAMES if m in chosen] + [v for m, v in chosen.items() if m not in MODEL_NAMES]


def first_call(results: Path, out: Path) -> None:
    groups = one_run_per_model(_gpu_runs(results / "compile_time.json"))
    runs = [run for run, _, _ in groups]
    fig, ax = plt.subplots(figsize=(11, 5.5))
    width = 0.2
    for i, (scenario, label, color) in enumerate(FIRST_CALL):
        for g, (_, _, scenarios) in enumerate(groups):
            r = scenarios.get(scenario) or {}
            if r.get("status") == "ok":
                x = g + (i - 1.5) * width
                ax.bar(x, r["first_call_s"], width, color=color, label=label if g == next(
                    k for k, grp in enumerate(groups) if (grp[2].get(scenario) or {}).get("status") == "ok") else None)
                ax.annotate(f"{r['first_call_s']:.1f}", (x, r["first_call_s"]), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)), [f"{MODEL_NAMES.get(m, m)}\n{run['date'][:10]}, code {run['commit']}"
                                       for run, m, _ in groups], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("first call: compile + first run (s, log scale)")
    ax.set_title(f"First call per model: each model once, from the newest run of it on committed code\n"
                 f"{_where(runs)}", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(FIRST_CALL), frameon=False)
    fig.tight_layout()
    _save(fig, out / "first_call.png")


def kernel_time(results: Path, out: Path) -> None:
    runs = _gpu_runs(results / "conformance.json")
    tables = [[r for r in conformance.rows(run) if r["status"] == "ok" and r["latency_ratio"] is not None
               and r["cold_basis"] == r["dynamic"]] for run in runs]
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 0.3 * max(map(len, tables)) + 2.2),
                             squeeze=False)
    goal = 1 + conformance.ct.LATENCY_TOLERANCE
    for ax, run, table in zip(axes[0], runs, tables):
        values = [r["latency_ratio"] for r in table]
        ax.barh(range(len(table)), values, height=0.7, color=["#d62728" if v > goal else "#2ca02c" for v in values],
                hatch=["//" if r["predates_verdicts"] else "" for r in table], edgecolor="white")
        for y, v in enumerate(values):
            ax.annotate(f"{v:.2f}", (v, y), va="center", fontsize=7, xytext=(2, 0), textcoords="offset points")
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.axvline(goal, color="#d62728", linestyle="--", linewidth=0.8)
        ax.set_yticks(range(len(table)), [f"{r['model']} {r['mode']}, {r['dynamic']}" for r in table], fontsize=8)
        ax.set_ylim(max(map(len, tables)) - 0.5, -0.5)  # the same bar height in every panel, first row on top
        ax.set_xlim(0, max(values + [goal]) * 1.12)
        ax.set_xlabel("summed GPU kernel time per call: warm start / cold")
        dates = sorted(str(i["date"])[:10] for i in run.get("invocations") or [run])
        # A run labelled beyond its machine ("nvidia-h200, second samples") says so in its title.
        label = str(run.get("label") or "")
        kind = f" ({label.split(', ', 1)[1]})" if ", " in label else ""
        ax.set_title(f"{run['machine']['gpu']}{kind}, torch {run['machine'].get('torch')}\n{len(table)} judged rows, "
                     f"runs {dates[0]} to {dates[-1]}", fontsize=9)
    handles = [Line2D([], [], color="#d62728", linestyle="--", label=f"goal: within {goal - 1:.0%} of cold"),
               Patch(facecolor="#2ca02c", hatch="//", edgecolor="white",
                     label="warm start from before the pass's fusion verdicts were served")]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle("Model zoo: kernel time of the warm start against cold max-autotune, dynamic mode for mode",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    _save(fig, out / "kernel_time.png")


def sweep_scaling(results: Path, out: Path) -> None:
    runs = [r for r in _gpu_runs(results / "sweep_bench.json")
            if any((e.get("sweep2") or {}).get("status") == "ok" for e in r["models"].values())]
    fig, axes = plt.subplots(1, len(runs), figsize=(4.6 * len(runs), 4.6), squeeze=False, sharey=True)
    colors = dict(zip(MODEL_NAMES, ("#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#7f7f7f")))
    for ax, run in zip(axes[0], runs):
        for model, entry in run["models"].items():
            points = [(n, entry[f"sweep{n}"]["wall_s"]) for n in (1, 2, 4)
                      if (entry.get(f"sweep{n}") or {}).get("status") == "ok"]
            if len(points) < 2:
                continue
            gpus, walls = zip(*points)
            color = colors.get(model, "black")
            ax.plot(gpus, walls, "o-", color=color)
            ax.plot(gpus, [walls[0] / n for n in gpus], ":", color=color)
            if (entry.get("cold") or {}).get("status") == "ok":
                ax.axhline(entry["cold"]["wall_s"], color=color, linestyle="--", linewidth=0.8)
        ax.set_xticks([1, 2, 4])
        ax.set_xlabel("GPUs of one host")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{run['machine']['gpu']} x{run['machine']['gpu_count']}\n{run['date'][:10]}, code {run['commit']}",
                     fontsize=9)
    axes[0][0].set_ylabel("wall time of the whole sweep command (s)")
    handles = [Line2D([], [], color=colors[m], linewidth=6, label=MODEL_NAMES[m]) for m in ("gpt", "resnet")]
    handles += [Line2D([], [], color="black", linestyle=style, marker=marker, label=label)  # type: ignore[arg-type]
                for style, marker, label in
                (("-", "o", "autotune sweep"), (":", "", "ideal scaling: T1 / N"),
                 ("--", "", "max-autotune cold, one compile"))]
    fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(f"The sweep on 1, 2 and 4 GPUs of one host (torch {runs[0]['machine'].get('torch')}; "
                 "each model's points from one lease)", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    _save(fig, out / "sweep_scaling.png")


def _save(fig: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})  # no version stamp: the same results, the same file
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plots", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=harness.RESULTS)
    parser.add_argument("--out", type=Path, default=harness.REPO / "docs" / "images")
    args = parser.parse_args(argv)
    for draw in (first_call, kernel_time, sweep_scaling):
        draw(args.results, args.out)
    print(f"wrote {', '.join(IMAGES)} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
