"""``autotune doctor``: which of autotune's features the installed torch leaves on.

Each feature depends on private torch attributes (``inductor_glue/seams.py``). A feature
is on when every seam it needs resolves on this torch, and off otherwise, naming the
seam and what happens instead. The verdict is about the torch install, so it is reached
the same way on any machine: a GPU-only feature (pinning, kernel configs, the two kinds
of verdicts, CUDA-graph reload) is still checked on a CPU, and shown as such, but only
the features this machine would use decide the exit status: 0 when all of them are on,
1 otherwise.
"""

from __future__ import annotations

import platform
from typing import Any

GPU_ONLY_NOTE = "GPUs only"


def diagnose() -> dict[str, Any]:
    """The report ``autotune doctor --json`` prints."""
    import torch

    from autotune.inductor_glue import seams
    from autotune.inductor_glue.env import cpu_model, triton_version

    gpu = torch.cuda.is_available()
    features = [_feature(seams.state(feature), gpu) for feature in seams.FEATURES]
    absent = [{"seam": seam.path, "why": seam.why} for seam in seams.SEAMS
              if not seam.required and seam.problem() is not None]
    return {
        "torch": torch.__version__,
        "triton": triton_version() or "not installed",
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if gpu else f"cpu ({cpu_model()})",
        "features": features,
        "optional_seams_absent": absent,
        "ok": all(entry["on"] for entry in features if entry["used_here"]),
    }


def _feature(state: Any, gpu: bool) -> dict[str, Any]:
    feature = state.feature
    return {
        "key": feature.key,
        "name": feature.name,
        "on": state.on,
        "gpu_only": feature.gpu_only,
        "used_here": gpu or not feature.gpu_only,
        "missing": [{"seam": seam.path, "kind": seam.kind, "problem": problem} for seam, problem in state.missing],
        "instead": None if state.on else feature.fallback,
    }


def exit_code(report: dict[str, Any]) -> int:
    return 0 if report["ok"] else 1


def render(report: dict[str, Any]) -> list[str]:
    """The report as lines of text."""
    lines = [f"{label:<8} {report[key]}" for label, key in
             (("torch", "torch"), ("triton", "triton"), ("Python", "python"), ("device", "device"))]
    width = max(len(entry["name"]) for entry in report["features"])
    for entry in report["features"]:
        note = "" if entry["used_here"] else f"  ({GPU_ONLY_NOTE}: not used here)"
        if entry["on"]:
            lines.append(f"{entry['name']:<{width}}  on{note}")
            continue
        missing = ", ".join(item["seam"] for item in entry["missing"])
        lines.append(f"{entry['name']:<{width}}  off: no {missing}; {entry['instead']}{note}")
    for item in report["optional_seams_absent"]:
        lines.append(f"(not in this torch, and handled: {item['seam']})")
    return lines
