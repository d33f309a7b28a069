"""Pointwise and reduction kernel configs, kept in the SQL cache.

Under max-autotune, Inductor tunes every generated pointwise/reduction Triton
kernel the first time it runs (heuristic configs, then coordinate descent) and
saves the winner as a small JSON file beside the kernel's source, usually
``<cache dir>/<xx>/<hash>.best_config``, which it reads back before compiling
the kernel again. The file's name is a hash of the kernel source and torch's
own key, so its path under the cache dir is a portable key (Inductor's
Mega-cache keys them the same way).

The hook copies each file Inductor saves into the ``kernel_configs`` table
(data only: tile sizes, warps, stages) and, on a fresh node, writes the stored
ones back into the cache dir before the first compile. Inductor then compiles
each kernel once, with its tuned config, and tunes nothing.

The files are read inside Inductor's compile subprocesses too, which is why
this writes files rather than patching a cache class in this process.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from autotune.inductor_glue import descent, seams
from autotune.inductor_glue.local_cache import inductor_cache_dir, write_atomic
from autotune.inductor_glue.patching import StackedPatch

log = logging.getLogger(__name__)

PREFIX = "best_config:"
SUFFIX = ".best_config"

Saver = Callable[[str, dict[str, Any]], None]  # (key, config)



def key_for(path: str, root: str | None = None) -> str | None:
    """The portable key of a local .best_config path: its path under the cache dir.

    None for a file outside the cache dir (no other node would look for it there).
    """
    root = os.path.realpath(root or inductor_cache_dir())
    relative = os.path.relpath(os.path.realpath(path), root)
    if relative.startswith(os.pardir) or os.path.isabs(relative):
        return None
    return PREFIX + relative.replace(os.sep, "/")


def path_for(key: str, root: str) -> str | None:
    """Where a stored key goes under root; None for anything that is not a plain key."""
    if not key.startswith(PREFIX) or "\0" in key:  # no path holds a NUL byte (os.path raises ValueError)
        return None
    parts = key[len(PREFIX):].split("/")
    if not parts[-1].endswith(SUFFIX) or len(parts) > 4:
        return None
    if any(not p or p in (".", "..") or os.sep in p or (os.altsep and os.altsep in p) for p in parts):
        return None  # data from a shared database never chooses a path outside the cache dir
    return os.path.join(root, *parts)


def materialize(configs: dict[str, dict[str, Any]], root: str | None = None) -> int:
    """Write stored configs as Inductor's local files; existing files are kept. Returns how many."""
    root = root or inductor_cache_dir()
    written = 0
    for key, value in configs.items():
        path = path_for(key, root)
        if path is None or not isinstance(value, dict) or os.path.exists(path):
            continue
        write_atomic(path, json.dumps(value).encode())
        written += 1
    return written


def _read_saved(cache: Any) -> tuple[str, dict[str, Any]] | None:
    local = getattr(cache, "local_cache", None)
    if not local:
        return None
    path = local[1]
    key = key_for(path)
    try:
        with open(path) as handle:
            value = json.load(handle)
    except (OSError, ValueError):
        return None
    return (key, value) if key is not None and isinstance(value, dict) else None


# Config files this process wrote itself. Inductor saves a kernel's pointwise-autotune winner
# before it runs coordinate descent from it (and marks it "found by coordesc" already when
# descent is on), so a file saved here is not a finished config: descent must still run.
_TUNED_HERE: set[str] = set()


def _patched_save(original: Any, patch: StackedPatch[Saver]) -> Any:
    def save(self: Any, *args: Any, **kwargs: Any) -> Any:
        outcome = original(self, *args, **kwargs)
        local = getattr(self, "local_cache", None)
        if local:
            _TUNED_HERE.add(os.path.realpath(local[1]))
        saver = patch.top
        if saver is not None:
            try:
                saved = _read_saved(self)
                if saved is not None:
                    saver(*saved)
            except Exception:  # keeping a copy must never break the kernel's run
                log.debug("could not copy a tuned kernel config", exc_info=True)
        return outcome

    return save


_SAVE: StackedPatch[Saver] = StackedPatch(seams.AUTOTUNE_CACHE_SAVE, _patched_save)


def _served_config(autotuner: Any, launcher: Any) -> bool:
    """The coordinate-descent rule (inductor_glue/descent.py): keep a launcher whose config
    came from the cache, marked as descent's own."""
    if not (_cache_hit(autotuner) or _stored_config_is(autotuner, getattr(launcher, "config", None))):
        return False
    try:
        launcher.config.found_by_coordesc = True
    except AttributeError:
        pass
    return True


def _cache_hit(autotuner: Any) -> bool:
    """Whether Inductor read the kernel's config from its autotune cache."""
    info = getattr(autotuner, "autotune_cache_info", None) or {}
    return info.get("autotune_cache_state") == "hit"


def _stored_config_is(autotuner: Any, config: Any) -> bool:
    """Whether the cache dir holds a tuned config for this kernel and it is ``config``.

    A kernel loaded from a compiled graph (an FX graph cache hit, e.g. an artifact)
    was built with its one tuned config, but Inductor re-reads its autotune cache
    with that one-config list, whose hash differs from the list the stored config
    was tuned from: a "miss", and coordinate descent runs again. Worse, its
    ``filename`` is still the path on the node that compiled it (seen on a CUDA host,
    torch 2.11), where no config file exists here. So the file is looked up where
    it is on this node: the same place under this node's cache dir (beside the
    kernel, named from its source hash); the config is trusted when it is the
    very one stored.
    """
    filename = getattr(autotuner, "filename", None)
    if config is None or not filename:
        return False
    try:
        from torch._inductor.runtime.autotune_cache import AutotuneCache

        here = os.path.join(inductor_cache_dir(), os.path.basename(os.path.dirname(filename)),
                            os.path.basename(filename))
        meta: Any = getattr(autotuner, "inductor_meta", {}) or {}  # a TypedDict on newer torch
        cache = AutotuneCache.create(meta, here, "")
        if cache is None or not cache.local_cache or os.path.realpath(cache.local_cache[1]) in _TUNED_HERE:
            return False  # none stored, or tuned by this process and not finished yet
        with open(cache.local_cache[1]) as handle:
            stored = json.load(handle)
    except (OSError, ValueError, ImportError, TypeError):
        return False
    kwargs = dict(getattr(config, "kwargs", {}) or {})
    return (isinstance(stored, dict) and bool(kwargs)
            and all(stored.get(name) == value for name, value in kwargs.items())
            and stored.get("num_warps") == getattr(config, "num_warps", None)
            and stored.get("num_stages") == getattr(config, "num_stages", None))


# Do not run coordinate descent again on a kernel whose config came from the cache
# (``_served_config``). Inductor (2.11) re-runs it when the cached config is also one of
# the kernel's heuristic configs (coordinate descent found nothing better): the compiled
# heuristic config lacks the "found by coordesc" mark. On GPUs that is a good share of a
# CNN's kernels and of a warm compile's time, for the same answer.


def _scaling_only_untuned(original: Any, patch: StackedPatch[bool]) -> Any:
    def _dynamic_scale_rblock(self: Any, *args: Any, **kwargs: Any) -> Any:
        if patch.top and _served_one_config(self):
            return None
        return original(self, *args, **kwargs)

    return _dynamic_scale_rblock


def _served_one_config(autotuner: Any) -> bool:
    """Whether the kernel runs a config read from the cache: Inductor's own cache hit, or
    (a kernel from a compiled graph) its one compiled config is the stored one."""
    if _cache_hit(autotuner):
        return True
    results = getattr(autotuner, "compile_results", None) or []
    return len(results) == 1 and _stored_config_is(autotuner, getattr(results[0], "config", None))


# Do not add halved-RBLOCK candidates to a reduction whose config came from the cache.
# Torch 2.11 adds them after every compile of a register-heavy reduction, cache hit or
# not: two launchers, so the kernel is benchmarked and descended again at its first run
# (Whisper's encoder on GPUs: one layer-norm kernel retuned by every warm start, and
# by the sweep's own second compile). The stored config already won against those
# candidates when it was tuned. Upstream fixed it later (pytorch/pytorch#181292, #181789).
_SCALE: StackedPatch[bool] = StackedPatch(seams.SCALE_RBLOCK, _scaling_only_untuned)


def push(saver: Saver) -> None:
    """Send every config Inductor saves from now on to ``saver`` as well, and trust
    the configs it reads from its cache (see ``_served_config`` and ``_SCALE``)."""
    _SAVE.push(saver)
    descent.push(_served_config)
    _SCALE.push(True)


def pop() -> None:
    _SAVE.pop()
    descent.pop(_served_config)
    _SCALE.pop()


def _waiting_triton(original: Any, patch: StackedPatch[Callable[[], None]]) -> Any:
    def triton(self: Any, *args: Any, **kwargs: Any) -> Any:
        ready = patch.top
        if ready is not None:
            ready()
        return original(self, *args, **kwargs)

    return triton


_COMPILES: StackedPatch[Callable[[], None]] = StackedPatch(seams.ASYNC_COMPILE_TRITON, _waiting_triton)


def _waiting_emit(original: Any, patch: StackedPatch[Callable[[], None]]) -> Any:
    func = original.__func__ if isinstance(original, staticmethod) else original

    def read_and_emit(*args: Any, **kwargs: Any) -> Any:
        ready = patch.top
        if ready is not None:
            ready()
        return func(*args, **kwargs)

    return staticmethod(read_and_emit)


# A compiled graph loaded from a cache (an artifact) brings its kernels in a bundle and
# compiles none: its kernels' configs must be on disk before the bundle is unpacked.
_BUNDLES: StackedPatch[Callable[[], None]] = StackedPatch(seams.BUNDLER_READ_AND_EMIT, _waiting_emit)


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    called: list[bool] = []

    def call() -> None:
        if not called:
            called.append(True)
            fn()

    return call


def hold_compiles_until(ready: Callable[[], None]) -> None:
    """Run ``ready()`` (once) before Inductor compiles its next Triton kernel.

    The hook loads the stored configs in the background (reading the database
    and computing the environment key take a second or more on a GPU node) while
    Dynamo traces and Inductor lowers; the files only have to exist before the
    first kernel is handed to the compile workers, which read them, or before a
    cached graph's kernels are unpacked.
    """
    once = _once(ready)
    _COMPILES.push(once)
    _BUNDLES.push(once)


def release_compiles() -> None:
    """Undo the latest ``hold_compiles_until`` (after waiting for it, if no compile did)."""
    ready = _COMPILES.top
    if ready is not None:
        ready()
    _COMPILES.pop()
    _BUNDLES.pop()
