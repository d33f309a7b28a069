"""Triton's native modules, served from the artifact tier instead of built with the C compiler.

Triton builds a small C extension per kernel signature it launches itself (a launcher; Inductor's
static launcher covers most kernels, not all) and one for its driver's utilities, with gcc, and keeps
them in its own cache dir. A fresh node has none: each is a compiler run in the first call. Triton
calls its build step (``triton.runtime.build._build``, declared in seams.py) only when its own cache
lacks the module, so that is where a module is fetched first and published after.

The key is what the binary depends on: Triton's version, the module's name and C source (which
spells the kernel's signature), the libraries and flags it links with, the platform, and the Python
ABI (its extension suffix). Machine paths (the include and library dirs) are left out, as Triton's
own cache key leaves them out. A served module is loaded once before it is handed to Triton, so one
that this machine cannot load is built instead of failing the compile.

A module the warm start's prefetch has not reached yet is built, not waited for: the compiler runs
outside the GIL, and the thread that prewarms Triton's backend hash asks for the driver's module at
warm_start(), before the prefetch has opened the store (the first kernel waits for that thread).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import os
import platform
import struct
import sysconfig
from typing import Any, Protocol

from autotune.cache.records import ARTIFACT_TRITON_MODULE
from autotune.inductor_glue import seams
from autotune.inductor_glue.local_cache import write_atomic
from autotune.inductor_glue.patching import StackedPatch

log = logging.getLogger(__name__)


class ModuleTier(Protocol):
    """What this module asks of the artifact tier (artifacts.py's ArtifactTier, which installs
    this patch): written here, beneath it, so that neither imports the other."""

    def fetch(self, kind: str, key: str, *, wait: bool = True) -> bytes | None: ...

    def publish_file(self, kind: str, key: str, path: str) -> None: ...


def module_key(name: str, source: str, linked: list[Any]) -> str:
    """The portable key of a module Triton builds from ``source`` (``linked``: its libraries and flags)."""
    import triton

    parts = [source, linked, *_platform()]
    digest = hashlib.sha256(json.dumps(parts, default=repr).encode()).hexdigest()
    return f"triton-{triton.__version__}:{name}{sysconfig.get_config_var('EXT_SUFFIX')}:{digest}"


@functools.cache
def _platform() -> tuple[str, str, str]:
    """The machine, the OS and the pointer width. Not ``platform.architecture()``: it runs the
    ``file`` command on the interpreter (a process per call, on the compile's thread) and reads
    the binary's format from it only where ``file`` is installed, which would split one platform
    into two keys."""
    return platform.machine(), platform.system(), f"{struct.calcsize('P') * 8}bit"


def _loads(path: str) -> bool:
    """Whether this machine can load the module at ``path`` (its libraries, its C library's version)."""
    try:
        ctypes.CDLL(path)
    except OSError as exc:
        log.info("a stored Triton module does not load here (%s); building it", exc)
        return False
    return True


def _served(tier: ModuleTier, key: str, name: str, srcdir: str) -> str | None:
    """The path of the stored module written where the compiler would write it, or None."""
    payload = tier.fetch(ARTIFACT_TRITON_MODULE, key, wait=False)
    if payload is None:
        return None
    path = os.path.join(srcdir, f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}")
    write_atomic(path, payload, mode=0o755)
    return path if _loads(path) else None


def _patched_build(original: Any, patch: StackedPatch[ModuleTier]) -> Any:
    # Triton 3.6: _build(name, src, srcdir, library_dirs, include_dirs, libraries, ccflags), where src is
    # the C file's path; what follows the two dirs (machine paths) is part of the key.
    def build(name: str, src: str, srcdir: str, *rest: Any, **options: Any) -> Any:
        tier = patch.top
        key = None
        if tier is not None:
            try:
                with open(src, encoding="utf-8") as handle:
                    linked = [*rest[2:], sorted((k, v) for k, v in options.items() if not k.endswith("_dirs"))]
                    key = module_key(name, handle.read(), linked)
                served = _served(tier, key, name, srcdir)  # None where the tier does not read
                if served is not None:
                    return served
            except Exception:  # a cache problem must never fail the compile
                log.debug("could not fetch a Triton module", exc_info=True)
        built = original(name, src, srcdir, *rest, **options)
        if tier is not None and key is not None:
            tier.publish_file(ARTIFACT_TRITON_MODULE, key, built)
        return built

    return build


BUILD_TRITON_MODULE: StackedPatch[ModuleTier] = StackedPatch(seams.TRITON_BUILD, _patched_build)
