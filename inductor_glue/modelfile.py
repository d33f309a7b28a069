"""The model file contract.

``MODEL.py`` defines ``example(batch_size: int | None = None)`` returning
``(module, example_inputs_tuple)``; ``--entry NAME`` picks another function.
The file may set ``torch._inductor.config`` options at import: those are
recorded as overrides so that every worker applies them too.

It may also set ``DYNAMIC_DIMS``: which dimensions ``autotune sweep --dynamic`` marks
dynamic, by the positional index of an example input, e.g. ``{0: (0, 1)}`` for
input_ids of shape (batch, seq). Without it, dimension 0 of every tensor input.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import keyword
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_ENTRY = "example"
DYNAMIC_DIMS = "DYNAMIC_DIMS"  # the module-level name
TRAIN_STEP = "train_step"  # a module-level function that marks a training step's file

DynamicDims = dict[int, tuple[int, ...]]  # example input's index -> its dynamic dimensions


class ModelFileError(Exception):
    """The model file breaks the contract. The message is one line: problem and fix."""


@dataclass
class ModelFile:
    path: Path
    entry: str
    factory: Callable[..., Any]
    config_overrides: dict[str, Any]  # Inductor config the file changed at import
    dynamic_dims: DynamicDims | None = None  # DYNAMIC_DIMS, None when the file sets none
    # The file defines train_step(): a training step's model, captured forward and backward as
    # with --train (a sweep of several models may mix training and inference files).
    trains: bool = False

    def build(self, batch_size: int | None) -> tuple[Any, tuple[Any, ...]]:
        """Call the entry and check what it returns."""
        import torch

        before = _config_snapshot()
        try:
            result = self.factory(batch_size) if batch_size is not None else self.factory()
        except Exception as exc:
            raise ModelFileError(
                f"{self.path}: {self.entry}({batch_size or ''}) raised {type(exc).__name__}: {exc}"
            ) from exc
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ModelFileError(
                f"{self.path}: {self.entry}() must return (module, example_inputs_tuple), "
                f"got {type(result).__name__}"
            )
        self.config_overrides.update(_take_config_changes(before))
        module, inputs = result
        if not callable(module):
            raise ModelFileError(f"{self.path}: {self.entry}() returned a module that is not callable")
        if isinstance(inputs, torch.Tensor) or not isinstance(inputs, (tuple, list)):
            raise ModelFileError(
                f"{self.path}: {self.entry}() must return the example inputs as a tuple, "
                f"got {type(inputs).__name__}; wrap a single tensor as (x,)"
            )
        if not _has_tensor(inputs):
            raise ModelFileError(
                f"{self.path}: {self.entry}() returned example inputs with no tensor in them; "
                "return (module, (torch.randn(...), ...)) with the inputs a real call would get"
            )
        self.marked_dims(tuple(inputs))  # a DYNAMIC_DIMS that does not fit the inputs fails here
        return module, tuple(inputs)

    def marked_dims(self, inputs: tuple[Any, ...]) -> DynamicDims:
        """The dimensions `--dynamic` marks on these example inputs: DYNAMIC_DIMS, or
        dimension 0 of every tensor input when the file names none."""
        import torch

        if self.dynamic_dims is None:
            return {i: (0,) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.dim() >= 1}
        return _check_dims_against_inputs(self.path, self.dynamic_dims, inputs)


_DIMS_EXAMPLE = "e.g. DYNAMIC_DIMS = {0: (0, 1)} for input 0 of shape (batch, seq)"


def _read_dynamic_dims(path: Path, value: Any) -> DynamicDims:
    """DYNAMIC_DIMS as {int: (int, ...)}; a wrong type is one ModelFileError line."""
    if not isinstance(value, dict):
        raise ModelFileError(
            f"{path}: {DYNAMIC_DIMS} must be a dict from an example input's position to its dynamic "
            f"dimensions, got {type(value).__name__}; {_DIMS_EXAMPLE}"
        )
    dims: DynamicDims = {}
    for index, named in value.items():
        if isinstance(named, int) and not isinstance(named, bool):
            named = (named,)
        ok_index = isinstance(index, int) and not isinstance(index, bool)
        ok_dims = isinstance(named, (tuple, list)) and all(isinstance(d, int) and not isinstance(d, bool)
                                                           for d in named)
        if not (ok_index and ok_dims):
            raise ModelFileError(
                f"{path}: {DYNAMIC_DIMS} entry {index!r}: {named!r} must map an input position (int) to "
                f"an int or a tuple of ints; {_DIMS_EXAMPLE}"
            )
        dims[index] = tuple(named)
    return dims


def _check_dims_against_inputs(path: Path, dims: DynamicDims, inputs: tuple[Any, ...]) -> DynamicDims:
    """DYNAMIC_DIMS checked against the example inputs; negative dimensions counted from the end."""
    import torch

    checked: DynamicDims = {}
    for index, named in dims.items():
        if not 0 <= index < len(inputs):
            raise ModelFileError(
                f"{path}: {DYNAMIC_DIMS} names input {index}, but the example has {len(inputs)} "
                f"input(s) (positions 0 to {len(inputs) - 1}); key it by the input's position"
            )
        tensor = inputs[index]
        if not isinstance(tensor, torch.Tensor):
            raise ModelFileError(
                f"{path}: {DYNAMIC_DIMS} names input {index}, which is a {type(tensor).__name__}, not a "
                "tensor; name only tensor inputs"
            )
        bad = [d for d in named if not -tensor.dim() <= d < tensor.dim()]
        if bad:
            raise ModelFileError(
                f"{path}: {DYNAMIC_DIMS}[{index}] names dimension {bad[0]}, but input {index} has "
                f"{tensor.dim()} (shape {tuple(tensor.shape)}); name dimensions 0 to {tensor.dim() - 1}"
            )
        checked[index] = tuple(sorted({d % tensor.dim() for d in named}))
    return checked


def _has_tensor(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        value = list(value.values())
    return isinstance(value, (tuple, list)) and any(_has_tensor(v) for v in value)


def _config_snapshot() -> dict[str, Any]:
    from torch._inductor import config

    return dict(config.get_config_copy())


def _jsonable_override(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str, type(None)))


def module_name_for(path: str | Path) -> str:
    """The module name a model file is imported under: its stem (``model.py`` -> ``model``),
    as a training script's ``import model`` names it, so that what Dynamo records about the
    model's classes and functions (its package's guards and inlined sources) names the same
    module in the sweep and in the job. A stem that is no identifier, or that names another
    module already imported or on ``sys.path``, gets a name of its own instead."""
    path = Path(path).resolve()
    stem = path.stem
    if stem.isidentifier() and not keyword.iskeyword(stem) and _free_or_same(stem, path):
        return stem
    return "autotune_model_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]


def _free_or_same(name: str, path: Path) -> bool:
    loaded = sys.modules.get(name)
    if loaded is not None:
        return _same_file(getattr(loaded, "__file__", None), path)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is None or _same_file(spec.origin, path)


def _same_file(origin: str | None, path: Path) -> bool:
    try:
        return origin is not None and Path(origin).resolve() == path
    except OSError:
        return False


def check_model_file(path: str | Path, entry: str = DEFAULT_ENTRY) -> None:
    """The checks a model file passes without being imported (so without torch), in milliseconds:
    it exists, is Python that compiles, and may bind ``entry`` at its top level. Each failure is
    the ModelFileError line ``load_model_file`` would raise, before a sweep starts anything."""
    path = Path(path)
    if not entry.isidentifier() or keyword.iskeyword(entry):
        raise ModelFileError(f"--entry {entry!r} is not a Python function name; pass the name of the function "
                             "in the model file that returns (module, example_inputs), e.g. --entry example")
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file; pass the path of a Python file that defines {entry}()")
    if path.suffix != ".py":
        raise ModelFileError(f"{path}: not a Python file; pass a .py file that defines {entry}()")
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot be read ({exc.strerror}); make it readable") from exc
    except (SyntaxError, ValueError) as exc:  # ValueError: a null byte
        where = f"{path}:{exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else str(path)
        problem = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        raise ModelFileError(f"{where}: syntax error ({problem}); fix the file so that `python {path}` runs") from exc
    if not any(may_bind(node, entry) for node in tree.body):
        raise ModelFileError(_no_entry(path, entry))


def _no_entry(path: Path, entry: str) -> str:
    return (f"{path}: defines no function {entry}(); add `def {entry}(batch_size=None): "
            f"return module, (inputs,)` or pass --entry NAME")


def may_bind(node: ast.stmt, name: str) -> bool:
    """Whether a module-level statement may bind ``name``: a star import or a compound
    statement (if, try, with, a loop, match) is taken to."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any(a.name == "*" or (a.asname or a.name).split(".")[0] == name for a in node.names)
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t))
    if isinstance(node, ast.Expr):  # globals()[...] = / setattr(module, ...) hide behind a call: taken to
        return any(isinstance(n, ast.Name) and n.id in ("globals", "setattr", "exec") for n in ast.walk(node))
    return isinstance(node, _COMPOUND)


# Statements that may bind a name in a branch; try/except* is Python 3.11's.
_COMPOUND = (ast.If, ast.Try, getattr(ast, "TryStar", ast.Try), ast.With, ast.For, ast.While, ast.Match)


def check_config_pairs(pairs: tuple[str, ...] | list[str]) -> None:
    """--inductor-config's KEY=VALUE form, checked without torch (its keys are checked against
    torch's config when the sweep parses them)."""
    for pair in pairs:
        key, sep, _ = pair.partition("=")
        if not sep or not key.strip():
            raise ModelFileError(_not_a_pair(pair))


def _not_a_pair(pair: str) -> str:
    return f"--inductor-config {pair!r}: expected KEY=VALUE, e.g. max_autotune_gemm_backends=ATEN,TRITON"


def load_model_file(path: str | Path, entry: str = DEFAULT_ENTRY) -> ModelFile:
    """Import the file and find its entry; every failure is one ModelFileError line."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file; pass the path of a Python file that defines {entry}()")
    if path.suffix != ".py":
        raise ModelFileError(f"{path}: not a Python file; pass a .py file that defines {entry}()")
    before = _config_snapshot()
    module_name = module_name_for(path)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ModelFileError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ModelFileError(
            f"{path}: failed to import ({type(exc).__name__}: {exc}); fix the file so that "
            f"`python {path}` runs"
        ) from exc
    factory = getattr(module, entry, None)
    if factory is None or not callable(factory):
        raise ModelFileError(_no_entry(path, entry))
    try:
        inspect.signature(factory)
    except (TypeError, ValueError):
        pass
    overrides = _take_config_changes(before)
    raw_dims = getattr(module, DYNAMIC_DIMS, None)
    dims = None if raw_dims is None else _read_dynamic_dims(path, raw_dims)
    trains = callable(getattr(module, TRAIN_STEP, None))
    return ModelFile(path=path, entry=entry, factory=factory, config_overrides=overrides, dynamic_dims=dims,
                     trains=trains)


def _take_config_changes(before: dict[str, Any]) -> dict[str, Any]:
    """The Inductor config changed since ``before``, which is then restored.

    Restoring keeps the driver's config clean, so loading a file twice records
    the same overrides; capture and workers apply them explicitly.
    """
    from torch._inductor import config

    after = _config_snapshot()
    changed = {key: value for key, value in after.items() if before.get(key) != value}
    for key in changed:
        setattr(config, key, before[key])
    return {key: value for key, value in changed.items() if _jsonable_override(value)}


def parse_config_overrides(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings to typed Inductor config values (checked against the config)."""
    from torch._inductor import config

    known = config.get_config_copy()
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ModelFileError(_not_a_pair(pair))
        if key not in known:
            raise ModelFileError(f"--inductor-config {key}: not an option of torch._inductor.config")
        overrides[key] = _coerce(raw.strip(), known[key], key)
    return overrides


def _coerce(raw: str, current: Any, key: str) -> Any:
    if isinstance(current, bool) or current is None and raw.lower() in ("true", "false"):
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ModelFileError(f"--inductor-config {key}={raw}: expected a boolean")
    if isinstance(current, int):
        try:
            return int(raw)
        except ValueError as exc:
            raise ModelFileError(f"--inductor-config {key}={raw}: expected an integer") from exc
    if isinstance(current, float):
        try:
            return float(raw)
        except ValueError as exc:
            raise ModelFileError(f"--inductor-config {key}={raw}: expected a number") from exc
    return raw
