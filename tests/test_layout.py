"""The package layout: one direction of imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Top to bottom: each may import only what stands below it.
LAYERS = ["autotune", "workers", "inductor_glue", "cache"]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", LAYERS)
def test_no_package_imports_one_above_it(package: str) -> None:
    above = set(LAYERS[: LAYERS.index(package)])
    offenders = {str(p.relative_to(ROOT)): sorted(_imports(p) & above)
                 for p in (ROOT / package).rglob("*.py") if _imports(p) & above}
    assert offenders == {}

