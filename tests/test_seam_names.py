"""Every private torch, Triton or CPython name the product's code touches is declared in
inductor_glue/seams.py, by name: declaring a module declares none of its names.

The code is read with ``ast`` (none of it runs), so the check takes seconds. What it sees as
a touched name:

- an attribute chain rooted at an imported torch, Triton or standard-library module, or at a
  name imported from one (``torch._dynamo.config.x``, ``select_algorithm.AlgorithmSelectorCache``);
- ``from torch._inductor.x import y`` (the name ``torch._inductor.x.y``);
- ``getattr``/``setattr``/``hasattr``/``delattr`` and ``vars(x)["name"]`` with a string constant
  or a module-level name bound to one, and the keys of ``config.patch({...})``;
- a private attribute (``_name``, not a dunder) on any object, where the product itself defines
  no attribute, function or variable of that name: it belongs to something torch handed us.

A name is private when a component of its dotted path starts with one underscore, or when it
lies in a module documented as internal (``INTERNAL_MODULES``). Past the first name inside a
module, only private attributes count: ``V.graph.sizevars`` is ``V``'s, ``V.graph._x`` is a
name of its own. A name the code computes at run time (an option passed in a variable) is not
seen: it is declared by hand, as inductor_glue/search_space.py's options are.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

import autotune
import autotune.cache
import autotune.inductor_glue
import autotune.workers
from autotune.inductor_glue import seams

# The fast subset CI also runs on the oldest supported torch (.ci/run).
pytestmark = pytest.mark.torch_subset

# The product's packages where this process imports them (the checkout under an editable
# install, site-packages under the wheel); autotune's holds cli.py and every subpackage.
PACKAGES = [Path(module.__file__).resolve().parent
            for module in (autotune, autotune.cache, autotune.workers, autotune.inductor_glue)]
ROOTS = frozenset({"torch", "triton", "functorch", "_frozen_importlib"}) | frozenset(sys.stdlib_module_names)
# Modules torch or Triton document as internal although no component of their name is private.
INTERNAL_MODULES = ("torch.fx.experimental", "triton.runtime", "triton.compiler", "triton.backends")
# Private-looking names that are public, documented API: not seams.
PUBLIC = frozenset({
    "os._exit",  # documented: exit without cleanup
    # torch's documented compile API (torch.compiler's docs name them with their underscore)
    "torch._dynamo.mark_dynamic", "torch._dynamo.mark_static", "torch._dynamo.maybe_mark_dynamic",
    "torch._dynamo.reset",
    # a config module's documented context manager
    "torch._inductor.config.patch", "torch._dynamo.config.patch", "torch._functorch.config.patch",
})
# Documented attributes of standard types, which the product's own objects carry.
PUBLIC_ATTRIBUTES = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults",  # namedtuple
                               "_value_", "_name_", "_missing_", "_generate_next_value_"})  # enum
# The product's own attributes, which it sets on torch's objects (``graph._autotune_fingerprint``).
OWN_PREFIX = "_autotune"
ATTRIBUTE_CALLS = frozenset({"getattr", "setattr", "hasattr", "delattr"})


@dataclass(frozen=True)
class Touch:
    name: str  # a dotted path, or ".attr" for a private attribute of an object of unknown origin
    where: str  # file:line


def _sources() -> list[Path]:
    return sorted({path.resolve() for folder in PACKAGES for path in folder.rglob("*.py")})


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _private_path(path: str) -> bool:
    return any(_is_private(part) for part in path.split(".")) or path.startswith(
        tuple(f"{module}." for module in INTERNAL_MODULES)) or path in INTERNAL_MODULES


@functools.cache
def _module_file_exists(path: str) -> bool:
    """Whether ``path`` names a module, found on disk without importing anything."""
    top, _, rest = path.partition(".")
    if top not in ROOTS:
        return False
    if top in sys.builtin_module_names or top == "_frozen_importlib":
        return not rest
    spec = importlib.util.find_spec(top)  # a top-level spec imports nothing
    if spec is None:
        return False
    if not rest:
        return True
    for location in spec.submodule_search_locations or ():
        base = Path(location, *rest.split("."))
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file() or any(
                base.with_name(base.name + suffix).is_file() for suffix in EXTENSION_SUFFIXES):  # torch._C
            return True
    return False


def _split(path: str) -> tuple[str, list[str]]:
    """``path`` as its longest module prefix and the attributes after it."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if _module_file_exists(module):
            return module, parts[cut:]
    return parts[0], parts[1:]


def names_needed(path: str) -> list[str]:
    """The names a touch of ``path`` needs declared: its first name inside its module when that
    is private, and each private attribute after it."""
    module, attrs = _split(path)
    needed = []
    if not attrs:
        return [module] if _private_path(module) else []
    first = f"{module}.{attrs[0]}"
    if _private_path(first):
        needed.append(first)
    for depth in range(1, len(attrs)):
        if _is_private(attrs[depth]):
            needed.append(".".join([module, *attrs[:depth + 1]]))
    return [name for name in needed if name not in PUBLIC]


def project_private_names(walked: list[list[ast.AST]]) -> set[str]:
    """Private names the product defines: its functions, classes and variables, and the
    attributes its methods assign on their own instance or class."""
    defined: set[str] = set()
    for nodes in walked:
        for node in nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.alias):
                defined.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
        for klass in (n for n in nodes if isinstance(n, ast.ClassDef)):
            for method in klass.body:
                if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef) and method.args.args:
                    receiver = method.args.args[0].arg
                    for node in ast.walk(method):
                        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                                and isinstance(node.value, ast.Name) and node.value.id == receiver):
                            defined.add(node.attr)
    return {name for name in defined if _is_private(name)}


def _foreign(attr: str, own: set[str]) -> bool:
    """Whether a private attribute of an object of unknown origin is someone else's."""
    return (_is_private(attr) and attr not in own and attr not in PUBLIC_ATTRIBUTES
            and not attr.startswith(OWN_PREFIX))


class _Scanner:
    """The names one file touches."""

    def __init__(self, tree: ast.Module, where: str, own: set[str]) -> None:
        self.nodes, self.where, self.own = list(ast.walk(tree)), where, own
        self.bound: dict[str, str] = {}  # a local name -> the dotted path it stands for
        self.constants = {target.id: statement.value.value for statement in tree.body
                          if isinstance(statement, ast.Assign | ast.AnnAssign)
                          and isinstance(statement.value, ast.Constant) and isinstance(statement.value.value, str)
                          for target in (statement.targets if isinstance(statement, ast.Assign)
                                         else [statement.target]) if isinstance(target, ast.Name)}

    def touches(self) -> Iterator[Touch]:
        yield from self._imports()
        self._bind_assignments()
        # A chain counts once, whole: torch._dynamo.config.x is not torch._dynamo as well.
        inner = {id(node.value) for node in self.nodes if isinstance(node, ast.Attribute)}
        for node in self.nodes:
            if isinstance(node, ast.Attribute) and id(node) not in inner:
                yield from self._attribute(node)
            elif isinstance(node, ast.Call):
                yield from self._call(node)
            elif isinstance(node, ast.Subscript):
                yield from self._vars_subscript(node)

    def _touch(self, path: str, node: ast.AST) -> Iterator[Touch]:
        for name in names_needed(path):
            yield Touch(name, f"{self.where}:{getattr(node, 'lineno', 0)}")

    def _imports(self) -> Iterator[Touch]:
        for node in self.nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in ROOTS:
                        self.bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                            alias.name.split(".")[0]
                        yield from self._touch(alias.name, node)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] in ROOTS:
                    for alias in node.names:
                        path = f"{node.module}.{alias.name}"
                        self.bound[alias.asname or alias.name] = path
                        yield from self._touch(path, node)

    def _bind_assignments(self) -> None:
        """``x = torch._inductor.config`` and ``x = sys.modules.get("m")``: x stands for the path."""
        for node in self.nodes:
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            path = self._module_by_name(value) or (self.path_of(value) if value is not None else None)
            if path is not None:
                for target in targets:
                    if isinstance(target, ast.Name) and target.id not in self.bound:
                        self.bound[target.id] = path

    def _module_by_name(self, node: ast.AST | None) -> str | None:
        """The module of ``sys.modules.get("m")``, ``sys.modules["m"]``, ``importlib.import_module("m")``."""
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            callee = self.path_of(node.func)
            if callee in ("sys.modules.get", "importlib.import_module") and isinstance(node.args[0].value, str):
                return node.args[0].value
        if isinstance(node, ast.Subscript) and self.path_of(node.value) == "sys.modules":
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                return node.slice.value
        return None

    def path_of(self, node: ast.AST) -> str | None:
        """The dotted path an expression stands for, where it is rooted at a bound name."""
        if isinstance(node, ast.Name):
            return self.bound.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.path_of(node.value)
            return f"{base}.{node.attr}" if base is not None else None
        return self._module_by_name(node)

    def _attribute(self, node: ast.Attribute) -> Iterator[Touch]:
        path = self.path_of(node)
        if path is not None:
            yield from self._touch(path, node)
        elif _foreign(node.attr, self.own):
            yield Touch(f".{node.attr}", f"{self.where}:{node.lineno}")

    def _call(self, node: ast.Call) -> Iterator[Touch]:
        module = self._module_by_name(node)
        if module is not None:  # importlib.import_module("torch._x") on its own
            yield from self._touch(module, node)
        callee = self.path_of(node.func)
        if callee is not None and callee.endswith(".patch") and node.args and isinstance(node.args[0], ast.Dict):
            for key in node.args[0].keys:  # config.patch({"key": value}): the option set by name
                name = self._string(key)
                if name is not None:
                    yield from self._touch(f"{callee.removesuffix('.patch')}.{name}", node)
        if callee is not None and callee.endswith(".patch"):
            for keyword in node.keywords:  # config.patch(key=value)
                if keyword.arg is not None:
                    yield from self._touch(f"{callee.removesuffix('.patch')}.{keyword.arg}", node)
        if isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_CALLS and len(node.args) >= 2:
            name = self._string(node.args[1])
            if name is not None:
                yield from self._named_attribute(node.args[0], name, node)

    def _string(self, node: ast.AST | None) -> str | None:
        """A string constant, or a module-level name bound to one (``KEY = "option"``)."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return self.constants.get(node.id)
        return None

    def _vars_subscript(self, node: ast.Subscript) -> Iterator[Touch]:
        """``vars(x)["name"]`` and ``vars(x).get("name")`` (the latter is a call on an attribute)."""
        holder, key = node.value, node.slice
        if (isinstance(holder, ast.Call) and isinstance(holder.func, ast.Name) and holder.func.id == "vars"
                and holder.args and self._string(key) is not None):
            yield from self._named_attribute(holder.args[0], self._string(key) or "", node)

    def vars_get(self) -> Iterator[Touch]:
        for node in self.nodes:
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name)
                    and node.func.value.func.id == "vars" and node.func.value.args and node.args
                    and self._string(node.args[0]) is not None):
                yield from self._named_attribute(node.func.value.args[0], self._string(node.args[0]) or "", node)

    def _named_attribute(self, owner: ast.AST, name: str, node: ast.AST) -> Iterator[Touch]:
        base = self.path_of(owner)
        if base is not None:
            yield from self._touch(f"{base}.{name}", node)
        elif _foreign(name, self.own):
            yield Touch(f".{name}", f"{self.where}:{getattr(node, 'lineno', 0)}")


def touched_names() -> list[Touch]:
    scanners = [_Scanner(ast.parse(path.read_text(), str(path)), _shown(path), set()) for path in _sources()]
    own = project_private_names([scanner.nodes for scanner in scanners])
    found = []
    for scanner in scanners:
        scanner.own = own
        found.extend([*scanner.touches(), *scanner.vars_get()])
    return found


def _shown(path: Path) -> str:
    for folder in PACKAGES:
        if path.is_relative_to(folder.parent):
            return str(path.relative_to(folder.parent))
    return str(path)


def declared_names() -> set[str]:
    names = set()
    for seam in seams.SEAMS:
        for attr in (seam.attr, *seam.alternatives):
            names.add(f"{seam.module}.{attr}" if attr else seam.module)
    return names


def covers(declared: set[str], name: str) -> bool:
    if name.startswith("."):  # an attribute of an object of unknown origin: a seam ending in it
        return any(path.endswith(name) for path in declared)
    # A module is imported, and a class named, to reach the names declared in it.
    return name in declared or any(path.startswith(f"{name}.") for path in declared)


def _release_here(seam: seams.Seam) -> str:
    """This machine's release in the terms of ``seam.checked_on``: torch's, Triton's or Python's."""
    top = seam.module.partition(".")[0]
    if top == "triton":
        try:
            return "triton " + ".".join(metadata.version("triton").split(".")[:2])
        except metadata.PackageNotFoundError:
            return "no triton"
    if seam.of_the_interpreter:
        return f"Python {sys.version_info.major}.{sys.version_info.minor}"
    return "{}.{}".format(*seams._release(metadata.version("torch")))


def test_every_private_name_the_code_touches_is_declared_by_name() -> None:
    declared = declared_names()
    undeclared = sorted({f"{touch.where}: {touch.name}" for touch in touched_names()
                         if not covers(declared, touch.name)})
    assert not undeclared, "declare these in inductor_glue/seams.py:\n" + "\n".join(undeclared)


def test_each_entry_names_its_features_why_and_the_releases_it_was_checked_on() -> None:
    """An entry no feature depends on is optional: nothing turns off without it."""
    releases = {*seams.CHECKED_ON, *seams.TRITON_CHECKED_ON, *seams.PYTHON_CHECKED_ON}
    for seam in seams.SEAMS:
        assert seam.why and seam.checked_on and set(seam.checked_on) <= releases, seam.path
        assert seam.features or not seam.required, f"{seam.path}: no feature, yet required"
    paths = [seam.path for seam in seams.SEAMS]
    assert len(paths) == len(set(paths))


def test_each_declared_name_resolves_here_unless_its_releases_leave_this_one_out() -> None:
    """A name resolves where it was checked; one missing here is optional (its code copes)."""
    problems = {}
    for seam in seams.SEAMS:
        if not seam.needed():  # a workaround for other torch releases: never touched here
            continue
        problem = seam.problem()
        if problem is not None and (seam.required or _release_here(seam) in seam.checked_on):
            problems[seam.path] = problem
    assert problems == {}


def test_no_entry_claims_a_release_the_install_matrix_saw_without_it() -> None:
    """benchmarks/results/install_matrix.json: `autotune doctor --json` on each tested torch."""
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "install_matrix.json"
    if not results.is_file():
        pytest.skip("no install matrix results beside these tests (the wheel's copy of them)")
    by_path = {seam.path: seam for seam in seams.SEAMS}
    wrong = []
    for row in json.loads(results.read_text())["rows"]:
        release = "{}.{}".format(*seams._release(row.get("torch_before") or row["torch_spec"]))
        for absent in (row.get("doctor") or {}).get("optional_seams_absent", []):
            seam = by_path.get(absent["seam"])
            if seam is not None and release in seam.checked_on:
                wrong.append(f"{seam.path}: absent on torch {release}")
    assert wrong == []


SAMPLE = """
import sys, threading
import torch
import torch._inductor.config as inductor_config
from torch._inductor.select_algorithm import AlgorithmSelectorCache
from torch._dynamo import package

def touch(obj, graph):
    torch._dynamo.config.some_option = 1
    inductor_config.some_key
    getattr(obj, "_hidden", None)
    setattr(package, "CompilePackage", None)
    sys._getframe(1)
    threading._shutdown
    graph._private_thing = 1
    AlgorithmSelectorCache._private
    AlgorithmSelectorCache.lookup  # a public attribute of a named class: AlgorithmSelectorCache's
    torch.compile, torch._dynamo.mark_dynamic, threading.current_thread()  # public
    hasattr(inductor_config, OPTION)
    inductor_config.patch({"patched_key": 1}, other_key=2)

OPTION = "named_key"
"""


def test_the_checker_sees_each_kind_of_touch() -> None:
    scanner = _Scanner(ast.parse(SAMPLE), "sample.py", own=set())
    found = {touch.name for touch in [*scanner.touches(), *scanner.vars_get()]}
    assert found == {
        "torch._inductor.config", "torch._inductor.config.some_key", "torch._dynamo.config.some_option",
        "torch._inductor.select_algorithm.AlgorithmSelectorCache",
        "torch._inductor.select_algorithm.AlgorithmSelectorCache._private",
        "torch._dynamo.package", "torch._dynamo.package.CompilePackage",
        "sys._getframe", "threading._shutdown", "._hidden", "._private_thing",
        "torch._inductor.config.named_key", "torch._inductor.config.patched_key", "torch._inductor.config.other_key",
    }
    declared = {"torch._inductor.config.some_key", "torch._inductor.select_algorithm.AlgorithmSelectorCache",
                "x.Graph._private_thing"}
    assert covers(declared, "torch._inductor.config")  # imported to reach a declared name
    assert covers(declared, "._private_thing")  # an entry ending in it
    assert not covers({"torch._inductor.config"}, "torch._inductor.config.some_key")  # a module's names


def test_docs_versions_md_states_the_registrys_count() -> None:
    """docs/gen_versions.py counts the seams from the registry (tests/test_doctor.py checks the
    whole page is in step); this names the count that drifted by hand before."""
    page = Path(__file__).resolve().parents[1] / "docs" / "versions.md"
    if not page.is_file():
        pytest.skip("no docs beside these tests (the wheel's copy of them)")
    stated = re.search(r"declares (\d+) seams", " ".join(page.read_text().split()))
    assert stated is not None and int(stated.group(1)) == len(seams.SEAMS), "run python docs/gen_versions.py"
