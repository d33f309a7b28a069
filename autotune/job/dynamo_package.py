"""Dynamo's package in the artifact tier: a fresh node skips tracing too.

With ``torch._dynamo.config.caching_precompile`` on, ``torch.compile`` asks
``DynamoCache.load(fn)`` for a package before it traces ``fn``: the traced
bytecode, its guards and the compiled backends, read from
``<inductor cache dir>/dynamo/<source id>/entry``. Dynamo's own guards (and
its check of the inlined functions' source) still decide whether a loaded
package applies; a package that does not is dropped and ``fn`` is traced.

Here the load is preceded by a fetch of that entry from the store, verified
before it is written where Dynamo will unpickle it; and ``publish()`` (called
by the hook's flush, after the job has run forward and backward) signs and
stores the entries this process recorded. Torch's source id is only the
function's qualified name and first line, so the stored key adds the
environment (torch, device, Inductor config) and a hash of the function's
source file: another model with a ``forward`` on the same line never collides.

A model Dynamo cannot package (a class defined inside a function, a frozen
mkldnn weight) is counted once and left to the FX graph and AOTAutograd
entries, which serve it all the same.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import os
import pickle
from collections.abc import Callable
from typing import Any

from autotune.cache.records import ARTIFACT_DYNAMO
from autotune.inductor_glue import seams
from autotune.inductor_glue.patching import StackedPatch

log = logging.getLogger(__name__)


class PackageSeam:
    def __init__(self, tier: Any) -> None:
        self.tier = tier
        self.keys: dict[str, str] = {}  # torch's source id -> our key, filled at load time
        self.published: set[str] = set()
        self.refused = 0
        self._undo_precompile = seams.CACHING_PRECOMPILE.set_for_every_thread(True)  # the install's thread may be its own
        for patch in _PATCHES:
            patch.push(self)
        self._quieted = _quiet_precompile_notices()

    def remove(self) -> None:
        for patch in reversed(_PATCHES):
            patch.pop()
        _PRECOMPILE_NOTICES.release(self._quieted)
        self._undo_precompile()

    # --- load side -----------------------------------------------------------------
    def before_load(self, fn: Any) -> None:
        from torch._dynamo.package import CompilePackage, DynamoCache

        source_id = CompilePackage.source_id_from_fn(fn)
        key = self.keys.get(source_id)
        if key is None:  # once per function: it hashes the source file and the module's repr
            key = self.keys[source_id] = _stored_key(fn, source_id)
        path = os.path.join(DynamoCache.path_prefix(), source_id, "entry")
        if os.path.exists(path):
            return
        payload = self.tier.fetch(ARTIFACT_DYNAMO, key)
        if payload is not None:
            from autotune.inductor_glue.local_cache import write_atomic


            write_atomic(path, payload, mode=0o644)

    # --- publish side ----------------------------------------------------------------
    def publish(self) -> int:
        """Sign and store every package recorded so far (once each); returns how many."""
        if not self.tier.writes:
            return 0
        from torch._dynamo.precompile_context import PrecompileContext

        try:
            entries, _ = PrecompileContext.create_cache_entries()
        except Exception as exc:  # noqa: BLE001 - torch refused: the other entries still serve
            self._refuse(f"{type(exc).__name__}: {exc}")
            return 0
        count = 0
        for source_id, entry in entries.items():
            key = self.keys.get(source_id)
            if key is None or key in self.published or not _has_guarded_code(entry):
                continue
            try:
                payload = pickle.dumps(entry)
            except Exception as exc:  # noqa: BLE001 - e.g. mkldnn weights, local classes
                self._refuse(f"{type(exc).__name__}: {exc}")
                continue
            self.published.add(key)
            self.tier.publish(ARTIFACT_DYNAMO, key, payload)
            count += 1
        return count

    def _refuse(self, reason: str) -> None:
        """Count and (once a process) log a package not made or not used: the FX graph and
        AOTAutograd entries serve the model all the same."""
        self.refused += 1
        stats = getattr(self.tier, "stats", None)
        if stats is not None:
            stats.packages_refused = self.refused  # live in handle.stats, not only after a flush
        if self.refused == 1:
            log.warning("autotune: no Dynamo package for this model (%s); Dynamo traces it, and its FX graph "
                        "and AOTAutograd entries are shared instead", reason.splitlines()[0][:300])


class _PrecompileNotices(logging.Filter):
    """Torch's warnings about what ``caching_precompile`` itself does: one line per guard it
    drops (an ID_MATCH on each parameter, a MODULE_MATCH on each module the model reads) and
    one per graph it leaves out of the package (a frozen weight's static address). They are
    notes on the mode this tier turns on, not on the job, whose output they filled with a warning
    per parameter. Kept in autotune's log at debug level; torch's other warnings pass."""

    NOTICES = ("is dropped with caching_precompile=True", "Detected a package bypass")

    def __init__(self) -> None:
        super().__init__()
        self.holders = 0  # seams installed: a second warm_start() may install before the first leaves

    def release(self, loggers: list[logging.Logger]) -> None:
        self.holders -= 1
        for logger in loggers if self.holders == 0 else ():
            logger.removeFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and any(notice in record.msg for notice in self.NOTICES):
            log.debug("torch (caching_precompile): %s", record.getMessage())
            return False
        return True


_PRECOMPILE_NOTICES = _PrecompileNotices()


def _quiet_precompile_notices() -> list[logging.Logger]:
    """The torch loggers that now filter out caching_precompile's notices (none where this torch
    lacks them: its warnings then show, nothing else changes)."""
    quieted = []
    _PRECOMPILE_NOTICES.holders += 1
    for seam in (seams.GUARDS_LOG, seams.OUTPUT_GRAPH_LOG):
        logger = seam.resolve() if seam.problem() is None else None
        if isinstance(logger, logging.Logger):
            logger.addFilter(_PRECOMPILE_NOTICES)  # a set: a second seam (a nested install) adds nothing
            quieted.append(logger)
    return quieted


def _has_guarded_code(entry: Any) -> bool:
    """A package worth storing: at least one traced frame kept its guards and code."""
    codes = getattr(getattr(entry, "dynamo", None), "codes", None) or []
    return any(getattr(code, "guarded_codes", None) and not getattr(code, "bypassed", False) for code in codes)


def _stored_key(fn: Any, source_id: str) -> str:
    from autotune.inductor_glue.env import default_device, package_environment

    return f"{package_environment(default_device())}:{_source_file_digest(fn)}{_module_digest(fn)}:{source_id}"


def _module_digest(fn: Any) -> str:
    """For a module's forward, a hash of the module tree (its repr: layers and sizes): every
    ``nn.Sequential`` shares one forward in torch's own file, and one model's package must
    not be offered to another."""
    import torch

    owner = getattr(fn, "__self__", None)
    if not isinstance(owner, torch.nn.Module):
        return ""
    return "-" + hashlib.sha256(repr(owner).encode()).hexdigest()[:16]


def _source_file_digest(fn: Any) -> str:
    """A hash of the file that defines fn (its whole source: classes it calls included)."""
    from torch._dynamo.eval_frame import innermost_fn

    inner = innermost_fn(fn)
    try:
        path = inspect.getsourcefile(inner) or ""
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()[:24]
    except (OSError, TypeError):
        code = getattr(inner, "__code__", None)
        return hashlib.sha256(code.co_code if code else repr(inner).encode()).hexdigest()[:24]


def _patched_load(original: Any, patch: StackedPatch[PackageSeam]) -> Any:
    def load(self: Any, fn: Callable[..., Any]) -> Any:
        seam = patch.top
        if seam is not None:
            try:
                seam.before_load(fn)
            except Exception:  # a cache problem never fails the compile
                log.debug("could not fetch a Dynamo package", exc_info=True)
        entry = original(self, fn)
        if entry is not None and seam is not None:
            problem = _why_not_applicable(entry)
            if problem is not None:
                seam._refuse(f"the stored package does not apply here: {problem}")
                return None  # Dynamo traces fn, as without a package
        return entry

    return load


def _why_not_applicable(entry: Any) -> str | None:
    """What CompilePackage.initialize would fail on, checked before it runs: on torch 2.11 its
    ImportError for a module this process cannot import (a model file the sweep loaded under
    another name) is not caught, and the compile fails. None when the entry can be tried."""
    import importlib

    from torch._dynamo import package as dynamo_package

    dynamo: Any = getattr(entry, "dynamo", None)
    try:
        dynamo.check_versions()
    except Exception as exc:  # noqa: BLE001 - another Python or torch
        return f"{type(exc).__name__}: {exc}"
    hash_lines = getattr(dynamo_package, "_hash_sourcelines", None)
    for code in getattr(getattr(dynamo, "source_info", None), "inlined_sources", None) or ():
        try:
            module = importlib.import_module(code.module)
        except Exception as exc:  # noqa: BLE001
            return f"module {code.module} cannot be imported here ({type(exc).__name__}); import the model under " \
                   "the name the sweep gave it (its file's stem)"
        if hash_lines is not None and hash_lines(module, code.firstlineno, code.lastlineno) != code.checksum:
            return f"the source of {code.module} (lines {code.firstlineno}-{code.lastlineno}) changed"
    return None


# What serialize_guards returns for guards it could not pickle; add_guarded_code then
# drops the frame from the package instead of storing it.
_UNSERIALIZABLE = b"autotune:guards-not-serializable"


def _patched_serialize_guards(original: Any, patch: StackedPatch[PackageSeam]) -> Any:
    """Guards Dynamo cannot pickle (a class it cannot import by name, say) raise a
    PicklingError that fails the compile, and torch's own bypass for a PackageError
    then trips an assertion (torch 2.13). So: leave this frame out of the package
    and go on compiling, as a job without packages would."""

    def serialize_guards(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            seam = patch.top
            if seam is None:
                raise
            seam._refuse(f"{type(exc).__name__}: {exc}")
            return _UNSERIALIZABLE

    return serialize_guards


def _patched_add_guarded_code(original: Any, patch: StackedPatch[PackageSeam]) -> Any:
    def add_guarded_code(self: Any, guards_state: bytes, *args: Any, **kwargs: Any) -> Any:
        if guards_state is _UNSERIALIZABLE:
            _bypass(self)
            return None
        return original(self, guards_state, *args, **kwargs)

    return add_guarded_code


def _bypass(package: Any) -> None:
    """Leave the frame being compiled out of the package, its backends not installed: the
    whole entry up to torch 2.13 (bypass_current_entry), this compile's guarded code and
    backends from torch 2.15 (bypass_current_compile, what torch's own bypass calls)."""
    getattr(package, seams.PACKAGE_BYPASS.present_attr().rpartition(".")[2])()


def _patched_install(original: Any, patch: StackedPatch[PackageSeam]) -> Any:
    """Torch falls back to tracing when installing a loaded package raises RuntimeError,
    but not for other errors (a KeyError for a module this process never imported),
    and its fallback initializes the package a second time, which asserts (torch
    2.11-2.13). So undo the install and the initialization, then raise RuntimeError:
    the fallback traces ``fn`` as if nothing had been stored."""

    def install(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            seam = patch.top
            if seam is not None:
                seam._refuse(f"the stored package does not apply here: {type(exc).__name__}: {exc}")
            try:
                self.uninstall()
            except Exception:  # noqa: BLE001 - best effort: the globals it had installed
                log.debug("could not uninstall a half-installed package", exc_info=True)
            self._initialized = False
            raise RuntimeError(f"autotune: cannot install a Dynamo package: {exc}") from exc

    return install


def _patched_context_call(original: Any, patch: StackedPatch[PackageSeam]) -> Any:
    """Torch post-compiles a loaded package's graphs under the global Inductor config, not
    under the options of the ``torch.compile`` that loads it (a TODO in
    ``deserialize_bundled_cache_entry``, torch 2.11-2.13): a max-autotune job then runs its
    graphs without CUDA graphs, launch by launch, far slower than cold max-autotune with
    the same kernels. So the load and install that ``torch.compile`` does here
    run under the config its backend would have patched in, as a cold compile's FX cache
    hit does."""

    def call(self: Any, fn: Any) -> Any:
        if patch.top is None:
            return original(self, fn)
        with _backend_config(getattr(self, "callback", None)):
            return original(self, fn)

    return call


def _backend_config(callback: Any) -> contextlib.AbstractContextManager[Any]:
    """Inductor's config patched with the options of the compile's backend (its mode's
    ``triton.cudagraphs``, ``max_autotune``, ...); nothing for another backend."""
    import torch._inductor.config as inductor_config

    backend = callback
    while hasattr(backend, "_torchdynamo_orig_backend"):
        backend = backend._torchdynamo_orig_backend
    options = getattr(backend, "config", None)
    if getattr(backend, "compiler_name", None) != "inductor" or not isinstance(options, dict) or not options:
        return contextlib.nullcontext()
    return inductor_config.patch(options)


_LOAD: StackedPatch[PackageSeam] = StackedPatch(seams.PACKAGE_LOAD, _patched_load)
_GUARDS: StackedPatch[PackageSeam] = StackedPatch(seams.SERIALIZE_GUARDS, _patched_serialize_guards)
_ADD: StackedPatch[PackageSeam] = StackedPatch(seams.ADD_GUARDED_CODE, _patched_add_guarded_code)
_INSTALL: StackedPatch[PackageSeam] = StackedPatch(seams.PACKAGE_INSTALL, _patched_install)
_CONTEXT: StackedPatch[PackageSeam] = StackedPatch(seams.DYNAMO_CONTEXT_CALL, _patched_context_call)
_PATCHES = (_LOAD, _GUARDS, _ADD, _INSTALL, _CONTEXT)


def install(tier: Any) -> PackageSeam | None:
    """The seam, or None where this torch lacks one that Dynamo's package needs (warned once,
    naming it): on a GPU that includes the CUDA-graph reload's, since a package loaded
    without it runs its graphs without CUDA graphs."""
    import torch

    if not seams.usable(seams.DYNAMO_PACKAGE):
        return None
    if torch.cuda.is_available() and not seams.usable(seams.CUDAGRAPH_RELOAD):
        return None
    return PackageSeam(tier)
