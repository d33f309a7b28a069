"""The package layout: one direction of imports, and one import name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Top to bottom: each may import only what stands below it. The folders stand at the
# repository's top and install as autotune.<folder>; the coordinator is autotune itself.
LAYERS = ["cli", "autotune", "workers", "inductor_glue", "cache"]
FOLDERS = {"autotune": ROOT / "autotune", "workers": ROOT / "workers",
           "inductor_glue": ROOT / "inductor_glue", "cache": ROOT / "cache"}


def _layer(module: str) -> str | None:
    """The layer an absolute module name belongs to (None: not ours)."""
    parts = module.split(".")
    if parts[0] != "autotune":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "autotune"


def _imported_names(path: Path) -> list[str]:
    """Every absolute module name the file imports."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _imported_layers(path: Path) -> set[str]:
    return {layer for name in _imported_names(path) if (layer := _layer(name))}


def _sources(folder: Path) -> list[Path]:
    # autotune/cli.py links to the top-level cli.py, which stands above every folder.
    return [p for p in folder.rglob("*.py") if not p.is_symlink()]


@pytest.mark.parametrize("package", LAYERS[1:])
def test_no_package_imports_one_above_it(package: str) -> None:
    above = set(LAYERS[: LAYERS.index(package)])
    offenders = {str(p.relative_to(ROOT)): sorted(_imported_layers(p) & above)
                 for p in _sources(FOLDERS[package]) if _imported_layers(p) & above}
    assert offenders == {}


def test_no_module_imports_a_top_level_name_a_user_may_shadow() -> None:
    """Every import of our own code goes through `autotune.`: a training script's own
    cache.py, workers/ or cli.py must never be picked up in place of ours."""
    ours = {"cache", "workers", "inductor_glue", "cli"}
    offenders: dict[str, list[str]] = {}
    for path in [ROOT / "cli.py", *(p for folder in FOLDERS.values() for p in _sources(folder))]:
        bad = sorted(name for name in _imported_names(path) if name.split(".")[0] in ours)
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}
