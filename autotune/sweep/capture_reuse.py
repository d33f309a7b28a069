"""A finished capture, kept in the cache and reused by a later sweep of the same model.

Capture compiles the model once in dry-run mode (``inductor_glue/capture.py``): most of a
second sweep of an unchanged, fully cached model. What it finds depends only on what goes
into that compile, so a sweep stores the requests a capture streamed, in order, under a key
that hashes all of it, and a later sweep whose key is the same replays them instead of
compiling: the same requests, so the same plan.

The key has two parts, ``capture:<source>/<setup>``:

- ``source`` (``source_digest``), known before torch is imported: the model file's bytes and
  those of every Python file in its folder (or below it) that it imports, directly or through
  another such file, found from its import statements; the entry; and the sweep options that
  shape capture (batch sizes, --inductor-config, --train, --dynamic, --ddp/--fsdp). A sweep
  asks whether any record starts with it before it starts Ray (``may_exist``): a sweep that
  may reuse its captures starts Ray only if it has something to tune.
- ``setup`` (``setup_digest``), once the model file is imported: the mode; the device it
  captures on (the GPU's name; the CPU's model, flags and thread count, and the C++ compiler);
  torch's, Triton's, CUDA's, Python's and autotune's versions; the Inductor config the model
  file sets and the one in force; the environment variables that steer torch.compile,
  Inductor, Triton and the C++ compiler (``TORCHINDUCTOR_*``, ``TORCHDYNAMO_*``,
  ``TORCH_COMPILE_*``, ``TRITON_*``, ``ATEN_CPU_CAPABILITY``, ``CXX``, ``CC``; not those that
  name a directory or a path, which move caches, not kernels); the effective training flag.

Not covered: a module the model imports from elsewhere (an installed package other than
torch and Triton), one it imports by other means than an import statement (``importlib``),
and autotune's own code between two checkouts of one version (a checkout whose capture code
changed). ``--force`` captures anew and replaces the record.

Records are rows of the kernel-config table (JSON objects, one per key, on SQLite and
PostgreSQL alike, no table of their own), filed under the environment of the capture's first
request (else the one the pass marks use) and found by key in any environment, so a team
sharing a database shares them. A record that fails validation is left alone and the model
captured anew.
"""

from __future__ import annotations

import ast
import datetime as dt
import hashlib
import json
import logging
import os
import platform
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.cache.records import Environment, TuningRequest

if TYPE_CHECKING:
    from autotune.inductor_glue.modelfile import ModelFile

    from .report import SweepOptions

log = logging.getLogger(__name__)

PREFIX = "capture:"
_ENV_PREFIXES = ("TORCHINDUCTOR_", "TORCHDYNAMO_", "TORCH_COMPILE_", "TRITON_")
_ENV_NAMES = ("ATEN_CPU_CAPABILITY", "CXX", "CC")
_ENV_SKIPPED_SUFFIXES = ("_DIR", "_PATH", "_HOME")


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()[:32]


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_digest(path: str, options: SweepOptions) -> str:
    """What the model file and the options put into capture: no torch needed."""
    what = {
        "model": _file_digest(Path(path)), "entry": options.entry, "batch_sizes": list(options.batch_sizes),
        "inductor_config": list(options.inductor_config), "train": options.train, "dynamic": options.dynamic,
        "distributed": options.distributed.to_json() if options.distributed is not None else None,
        "local_modules": local_modules(path),
    }
    return _digest(what)


def setup_digest(model: ModelFile, kwargs: dict[str, Any]) -> str:
    """What the machine, the software and the imported model put into capture. ``kwargs``:
    capture's keywords for this model (mode, device, parsed Inductor overrides, train)."""
    from autotune.inductor_glue.env import relevant_config

    what = {
        "mode": kwargs["mode"], "device": _device(kwargs["device"]), "train": kwargs["train"],
        "inductor_config": kwargs["inductor_config"], "model_config": model.config_overrides,
        "config": relevant_config(), "versions": _versions(), "env": _env_vars(),
    }
    return _digest(what)


def record_key(source: str, setup: str) -> str:
    return f"{PREFIX}{source}/{setup}"


def _device(device: str) -> dict[str, Any]:
    import torch

    from autotune.inductor_glue.env import cpu_model

    if device == "cuda":
        return {"kind": device, "name": torch.cuda.get_device_name(0), "cuda": torch.version.cuda}
    # The CPU's flags and the C++ compiler stand in for the vector ISA Inductor picks, which
    # it probes by building and loading C++ programs: seconds that reuse is meant to save.
    return {"kind": device, "name": cpu_model(), "flags": _cpu_flags(), "threads": torch.get_num_threads(),
            "machine": platform.machine(), "compiler": _compiler()}


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return ""


def _compiler() -> dict[str, Any] | None:
    """The C++ compiler Inductor would run, by where it is and when it changed."""
    from torch._inductor import config

    name = getattr(config.cpp, "cxx", (None, "g++"))
    names = [n for n in (name if isinstance(name, tuple) else (name,)) if n]
    found = next((shutil.which(n) for n in names if shutil.which(n)), None)
    if found is None:
        return None
    real = Path(found).resolve()
    stat = real.stat()
    return {"path": str(real), "size": stat.st_size, "mtime": int(stat.st_mtime)}


def _versions() -> dict[str, Any]:
    import torch

    import autotune
    from autotune.inductor_glue.env import triton_version

    return {"torch": torch.__version__, "triton": triton_version(), "python": sys.version,
            "autotune": autotune.__version__}


def _env_vars() -> dict[str, str]:
    return {name: value for name, value in sorted(os.environ.items())
            if (name.startswith(_ENV_PREFIXES) or name in _ENV_NAMES) and not name.endswith(_ENV_SKIPPED_SUFFIXES)}


def local_modules(model_path: str | Path) -> dict[str, str]:
    """Every Python file in the model file's folder (or below it) that the model file imports,
    directly or through another such file, read from the import statements (not from what this
    process happens to have imported): relative path -> digest of its bytes."""
    own = Path(model_path).resolve()
    folder = own.parent
    found: dict[str, str] = {}
    todo = [own]
    while todo:
        for path in _imported_files(todo.pop(), folder):
            name = str(path.relative_to(folder))
            if path != own and name not in found:
                found[name] = _file_digest(path)
                todo.append(path)
    return dict(sorted(found.items()))


def _imported_files(path: Path, folder: Path) -> list[Path]:
    """The files under ``folder`` that ``path``'s import statements may name (a module, and the
    ``__init__.py`` of each package on the way to it)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    dotted: list[tuple[Path, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            dotted += [(folder, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = folder
            if node.level:  # relative: from the importing file's package
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
            stem = node.module or ""
            dotted += [(base, stem)] if stem else []
            dotted += [(base, f"{stem}.{alias.name}".lstrip(".")) for alias in node.names if alias.name != "*"]
    files: list[Path] = []
    for base, name in dotted:
        here = base
        for part in name.split("."):
            here = here / part
            for candidate in (here.with_suffix(".py"), here / "__init__.py"):
                resolved = candidate.resolve() if candidate.is_file() else None
                if resolved is not None and resolved.is_relative_to(folder):
                    files.append(resolved)
    return files


@dataclass
class Record:
    """One stored capture: the requests in the order capture streamed them, each with the
    environment it was found in."""

    found: list[tuple[TuningRequest, Environment | None]]
    lookups: int
    seconds: float
    at: str  # when it was captured, ISO 8601 UTC
    host: str

    def to_json(self, model: str) -> dict[str, Any]:
        envs: list[dict[str, Any]] = []
        keys: dict[str, int] = {}
        rows = []
        for request, env in self.found:
            index = None
            if env is not None:
                if env.key not in keys:
                    keys[env.key] = len(envs)
                    envs.append(env.to_json())
                index = keys[env.key]
            rows.append({"request": request.to_json(), "env": index})
        return {"model": model, "requests": rows, "envs": envs, "lookups": self.lookups,
                "seconds": round(self.seconds, 3), "at": self.at, "host": self.host}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        """A stored record; ValueError (or KeyError/TypeError) when it is not one."""
        envs = [Environment.from_json(e) for e in data["envs"]]
        found = []
        for row in data["requests"]:
            index = row["env"]
            if index is not None and not (isinstance(index, int) and 0 <= index < len(envs)):
                raise ValueError(f"request's environment index {index!r} is out of range")
            found.append((TuningRequest.from_json(row["request"]), None if index is None else envs[index]))
        at = data["at"]
        dt.datetime.fromisoformat(at)  # raises ValueError unless it is a time
        return cls(found, int(data["lookups"]), float(data["seconds"]), at, str(data["host"]))

    @classmethod
    def now(cls, found: list[tuple[TuningRequest, Environment | None]], lookups: int, seconds: float) -> Record:
        at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        return cls(list(found), lookups, seconds, at, socket.gethostname())


def may_exist(store: Any, sources: list[str]) -> bool:
    """Whether every one of these models has some stored capture of its source and options
    (under some setup). Never raises: a cache that cannot say counts as no."""
    try:
        return all(store.kernel_config_keys(f"{PREFIX}{source}/", limit=1) for source in sources)
    except Exception:  # noqa: BLE001 - the sweep captures, as it would without records
        log.debug("could not look for stored captures", exc_info=True)
        return False


def find(store: Any, key: str) -> Record | None:
    """The record stored under ``key``; None when there is none, or it fails validation (logged)."""
    try:
        data = store.find_kernel_config(key)
    except Exception:  # noqa: BLE001 - a row that cannot be read is one to capture anew
        log.warning("could not read the stored capture %s; capturing anew", key, exc_info=True)
        return None
    if data is None:
        return None
    try:
        return Record.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("the stored capture %s is not one (%s); capturing anew", key, exc)
        return None


def save(store: Any, env: Environment, key: str, model: str, record: Record) -> None:
    """Store ``record`` under ``key``. Never raises: the sweep's own work does not depend on it."""
    try:
        store.put_kernel_configs(env, {key: record.to_json(Path(model).name)})
    except Exception:  # noqa: BLE001 - the next sweep captures anew
        log.warning("could not store the capture of %s", model, exc_info=True)
