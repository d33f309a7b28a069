"""The package layout: one direction of imports, two wings, no import circle, and one import name."""

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


# autotune/ has two wings, one per journey, and the modules both share at its top (settings,
# shapes, the doctor, the cache listing; cli.py links to the command line above them all).
# The sweep may use the job's wing only where it compiles as a job does (the end-to-end pass
# installs the hook) or reads the store as a job does; the job never imports the sweep.
WINGS = {"sweep": ROOT / "autotune" / "sweep", "job": ROOT / "autotune" / "job"}
SWEEP_USES_OF_JOB = {"autotune.job.hook", "autotune.job.store_client"}
SHARED = {p.stem for p in (ROOT / "autotune").glob("*.py") if not p.is_symlink()} - {"__init__"}


def _module_name(path: Path) -> str:
    """The installed module name of a source file (autotune.cache.x for cache/x.py)."""
    for package, folder in FOLDERS.items():
        if path.is_relative_to(folder):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            prefix = ["autotune"] if package == "autotune" else ["autotune", package]
            return ".".join(prefix + (parts[:-1] if parts[-1] == "__init__" else parts))
    raise ValueError(path)


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path, *, module_level: bool) -> set[str]:
    """Every module the file imports, relative imports resolved, and `from m import n` counted as
    m and as m.n (n may be a module). TYPE_CHECKING blocks are left out (types only); with
    ``module_level``, so are imports inside functions (made when called, not when imported)."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if module_level and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = package[: len(package) - child.level + 1] if child.level else []
                module = ".".join(base + ([child.module] if child.module else []))
                found.add(module)
                found.update(f"{module}.{alias.name}" for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def _all_sources() -> dict[str, Path]:
    return {_module_name(p): p for folder in FOLDERS.values() for p in _sources(folder)}


def _wing(module: str) -> str | None:
    """sweep, job or shared for a module of autotune/ (None: another layer, or the face)."""
    parts = module.split(".")
    if parts[0] != "autotune" or len(parts) < 2:
        return None
    if parts[1] in WINGS:
        return parts[1]
    return "shared" if parts[1] in SHARED else None


@pytest.mark.parametrize("wing", ["sweep", "job", "shared"])
def test_each_wing_imports_only_what_it_may(wing: str) -> None:
    """Lazy imports count too: a wing that imports another inside a function still leans on it."""
    paths = list(_sources(WINGS[wing])) if wing in WINGS else \
        [ROOT / "autotune" / f"{name}.py" for name in sorted(SHARED)]
    offenders: dict[str, list[str]] = {}
    for path in paths:
        bad = set()
        for name in _imports(path, module_level=False):
            there = _wing(name)
            if there is None or there == wing or there == "shared":
                continue
            if wing == "sweep" and there == "job" and name in SWEEP_USES_OF_JOB:
                continue
            if wing == "sweep" and there == "job" and any(name.startswith(f"{m}.") for m in SWEEP_USES_OF_JOB):
                continue  # a name taken from one of them
            bad.add(name)
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}


def test_no_import_circle() -> None:
    """No modules import each other in a loop as they load (module level; TYPE_CHECKING left out)."""
    sources = _all_sources()
    graph = {name: sorted(_imports(path, module_level=True) & set(sources) - {name}) for name, path in sources.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def walk(name: str, path: list[str]) -> None:
        state[name] = 1
        for other in graph[name]:
            if state.get(other) == 1:
                circles.append(path[path.index(other):] + [other])
            elif other not in state:
                walk(other, [*path, other])
        state[name] = 2

    for name in graph:
        if name not in state:
            walk(name, [name])
    assert circles == []

