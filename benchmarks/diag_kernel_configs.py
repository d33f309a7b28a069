"""Which config each pointwise/reduction kernel ran with, scenario by scenario.

Run on the machine that ran ``compile_time.py --keep-tmp``, with the same torch: for
every Triton kernel source in each scenario's Inductor cache dir under ROOT (the kept
per-model temporary dir), it prints the kernel's name, its source hash, the config file
Inductor keeps beside it (tile sizes, warps, stages, the time it measured, whether
coordinate descent found it) and the config the shared cache (ROOT/cache.db) holds under
the same key. Kernels with the same name in two scenarios but another source hash were
generated differently (another fusion or layout), so no stored config could reach them.

    python benchmarks/diag_kernel_configs.py /tmp/compile_time_gpt2_hf_xxxx --match tanh,gelu
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

_KERNEL = re.compile(r"^def (triton_\w+)\(", re.M)
SHOWN = ("XBLOCK", "YBLOCK", "R0_BLOCK", "RBLOCK", "num_warps", "num_stages", "time_taken_ms", "found_by_coordesc")


def config_path(source: Path) -> Path:
    """Where Inductor keeps the tuned config of the kernel in ``source`` (its own key)."""
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    cache = AutotuneCache.create({}, str(source), "")
    assert cache is not None and cache.local_cache is not None
    return Path(cache.local_cache[1])


def stored_configs(db: Path) -> dict[str, dict[str, Any]]:
    if not db.exists():
        return {}
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select key, value from kernel_configs").fetchall()
    return {key: json.loads(value) if isinstance(value, str) else value for key, value in rows}


def _short(config: dict[str, Any] | None) -> str:
    if not config:
        return "-"
    return " ".join(f"{k}={config[k]}" for k in SHOWN if k in config)


def kernels(inductor: Path) -> list[tuple[str, Path]]:
    found = []
    for source in inductor.rglob("*.py"):
        text = source.read_text(errors="replace")
        if "@triton_heuristics." not in text:
            continue
        found += [(name, source) for name in _KERNEL.findall(text)]
    return sorted(found)


def report(root: Path, match: list[str]) -> str:
    stored = stored_configs(root / "cache.db")
    out = [f"{len(stored)} kernel configs in {root / 'cache.db'}"]
    for scenario in sorted(p for p in root.iterdir() if (p / "inductor").is_dir()):
        inductor = scenario / "inductor"
        out += ["", f"== {scenario.name}"]
        for name, source in kernels(inductor):
            if match and not any(m in name for m in match):
                continue
            path = config_path(source)
            local = json.loads(path.read_text()) if path.exists() else None
            key = "best_config:" + path.relative_to(inductor).as_posix() if path.is_relative_to(inductor) else "?"
            out.append(f"{name:60s} src {source.stem[:12]}  local: {_short(local)}")
            out.append(f"{'':60s} stored: {_short(stored.get(key))}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="compile_time.py's kept per-model temporary dir")
    parser.add_argument("--match", default="", help="comma-separated substrings of kernel names to show")
    args = parser.parse_args()
    print(report(args.root, [m for m in args.match.split(",") if m]))


if __name__ == "__main__":
    main()
