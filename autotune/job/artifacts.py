"""The artifact tier at compile time: Inductor's own caches, backed by the SQL store, signed.

Three seams, each keyed by the key torch itself looks the artifact up by, so a
changed model, torch, Triton, config or device misses safely:

- **FX graph and AOTAutograd entries** go through Inductor's remote-cache
  layer (``torch._inductor.remote_cache``): ``RemoteFxGraphCache`` and
  ``RemoteAOTAutogradCache`` get our backend through ``backend_override_cls``,
  and ``fx_graph_remote_cache`` / ``enable_remote_autograd_cache`` are turned
  on (neither is part of any cache key). A graph entry bundles its Triton
  kernels, so a hit compiles nothing.
- **C++ builds** (CPU): ``CppBuilder.build`` writes a library or object file
  whose path under the cache dir is a hash of its source and compiler command
  line (kernels, and the probes that pick the vector ISA); before it builds,
  the file is fetched by that path.
- **Triton's native modules** (a kernel's launcher, the driver's utilities), which Triton builds
  with the C compiler when its own cache lacks them: fetched before the compiler runs. See
  ``autotune/job/triton_modules.py``.
- **Dynamo's package** (``caching_precompile``): ``DynamoCache.load`` reads
  ``<cache dir>/dynamo/<source id>/entry``; the entry is fetched there first.
  See ``autotune/job/dynamo_package.py``.

Every payload is verified against the trusted keys *before* it is handed to
torch, i.e. before anything in it is unpickled, imported or dlopened. A
payload that does not verify is a miss: torch compiles as it would have.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autotune.cache import protocols
from autotune.cache.errors import MalformedRow, or_malformed
from autotune.cache.records import (
    ARTIFACT_AOT_AUTOGRAD,
    ARTIFACT_CPP_KERNEL,
    ARTIFACT_FX_GRAPH,
    MAX_ARTIFACT_BYTES,
    Artifact,
)
from autotune.cache.signing import OK, Signer, TrustedKeys
from autotune.cache.text import escape_control
from autotune.inductor_glue import seams
from autotune.inductor_glue.local_cache import inductor_cache_dir, write_atomic
from autotune.inductor_glue.patching import StackedPatch

from .triton_modules import BUILD_TRITON_MODULE

if TYPE_CHECKING:
    from .prefetch import Prefetch

log = logging.getLogger(__name__)

# Payloads can be megabytes: a fetch may take longer than a winner's lookup.
FETCH_TIMEOUT_FACTOR = 5.0


class ArtifactTier:
    """Fetches verified artifacts and publishes signed ones; never raises into torch.

    ``call(fn, timeout)`` runs ``fn(store)`` bounded and returns None on any
    failure (the hook's policy: the first error disables the cache with one
    warning). ``submit(fn)`` runs a write in the background. A stored row that fails
    validation, a payload over ``max_bytes`` among them (refused before it is read), is a miss
    reported to ``malformed`` (the hook warns once per row).
    """

    def __init__(self, *, trusted: TrustedKeys, signer: Signer | None, device: str, stats: Any,
                 call: Callable[[Callable[[protocols.Store], Any], float], Any],
                 submit: Callable[[Callable[[], None]], None], timeout: float,
                 max_bytes: int = MAX_ARTIFACT_BYTES,
                 malformed: Callable[[MalformedRow], None] | None = None,
                 prefetched: Prefetch | None = None) -> None:
        self.trusted = trusted
        self.signer = signer
        self.device = device
        self.stats = stats  # the hook's HookStats: artifacts_loaded / _rejected / _published
        self._call = call
        self._submit = submit
        self._timeout = timeout * FETCH_TIMEOUT_FACTOR
        self._max_bytes = max_bytes
        self._malformed = malformed or (lambda error: log.warning("autotune: %s", escape_control(str(error))))
        self._warned = False
        self._lock = threading.Lock()
        self._prefetched = prefetched  # artifacts fetched and checked ahead of the compile

    @property
    def reads(self) -> bool:
        return bool(self.trusted)

    @property
    def writes(self) -> bool:
        return self.signer is not None

    def fetch(self, kind: str, key: str, *, wait: bool = True) -> bytes | None:
        """The payload stored under (kind, key) if it verifies, else None (a miss). With ``wait``
        false, one the prefetch has not reached yet is a miss too, without waiting for it."""
        if not self.reads:
            return None
        if not wait and self._prefetched is not None and not self._prefetched.settled(kind, key):
            return None
        held = self._prefetched.artifact(kind, key) if self._prefetched is not None else None
        if held is not None:  # the prefetch warned of a payload it dropped: counted here, not warned again
            return self._judged(kind, held.payload, held.verdict, held.signer, warn=False)
        stored = self._call(lambda store: or_malformed(lambda: store.get_artifact(kind, key, self._max_bytes)),
                            self._timeout)
        if isinstance(stored, MalformedRow):
            with self._lock:
                self.stats.artifacts_rejected += 1
            self._malformed(stored)
            return None
        if stored is None:
            return None
        verdict = self.trusted.verify(kind, key, stored.payload, stored.signature, stored.public_key)
        return self._judged(kind, stored.payload, verdict, stored.signer)

    def _judged(self, kind: str, payload: bytes, verdict: str, signer: str | None, *, warn: bool = True) -> bytes | None:
        """The payload if its verdict is OK, else None; counted, and the first rejection warned
        (unless ``warn`` is false: the prefetch warned of it)."""
        with self._lock:
            if verdict == OK:
                self.stats.artifacts_loaded += 1
                return payload
            self.stats.artifacts_rejected += 1
            warn, self._warned = warn and not self._warned, self._warned or warn
        if warn:  # one warning per process; later rejections are counted only
            log.warning("autotune: rejected a %s artifact (%s, signer %s); compiling it instead. "
                        "Trust its signer with AUTOTUNE_TRUSTED_KEYS if you mean to", kind,
                        verdict.replace("_", " "), signer or "none")
        else:
            log.info("autotune: rejected a %s artifact (%s)", kind, verdict)
        return None

    def count_compiled(self) -> None:
        """A C++ library compiled here because no trusted build was stored (HookStats.cpp_compiled)."""
        with self._lock:
            self.stats.cpp_compiled += 1

    def publish(self, kind: str, key: str, payload: bytes) -> None:
        """Sign and store in the background; the first writer of a key wins."""
        signer = self.signer
        if signer is None:
            return
        import socket

        import torch

        artifact = Artifact(kind=kind, key=key, payload=bytes(payload),
                            signature=signer.sign(kind, key, payload), public_key=signer.public_key,
                            torch_version=torch.__version__, device=self.device, host=socket.gethostname())

        def put() -> None:
            if self._call(lambda store: store.put_artifact(artifact), self._timeout):
                with self._lock:
                    self.stats.artifacts_published += 1

        self._submit(put)

    def publish_file(self, kind: str, key: str, path: str) -> None:
        """Publish the file a build wrote (when this tier writes); a file gone is not published."""
        if not self.writes:
            return
        try:
            with open(path, "rb") as handle:
                self.publish(kind, key, handle.read())
        except OSError:
            log.debug("could not publish the %s at %s", kind, path, exc_info=True)


# ------------------------------------------------------------------ remote caches


def _backend_class() -> type:
    class SignedStoreBackend(seams.REMOTE_BACKEND.resolve()):  # type: ignore[misc]
        """Bytes in, bytes out: Inductor's JSON serde sits above, so this sees the
        exact bytes that will be decoded (and unpickled) after a get."""

        kind = ""

        def _get(self, key: str) -> bytes | None:
            tier = _active()
            return tier.fetch(self.kind, key) if tier is not None else None

        def _put(self, key: str, data: bytes) -> None:
            tier = _active()
            if tier is not None and isinstance(data, (bytes, bytearray)):
                tier.publish(self.kind, key, bytes(data))

    return SignedStoreBackend


def _backend_for(kind: str) -> Callable[[], Any]:
    def make() -> Any:
        backend = _backend_class()()
        backend.kind = kind
        return backend

    return make


class _Switches:
    """Inductor's remote-cache switches and backend overrides, set while a tier is active."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def on(self) -> None:
        # For every thread: the background install sets them on a thread of its own.
        for seam, value in (
            (seams.FX_REMOTE_SWITCH, True),
            (seams.AOT_REMOTE_SWITCH, True),
            (seams.FX_BACKEND_OVERRIDE, _backend_for(ARTIFACT_FX_GRAPH)),
            (seams.AOT_BACKEND_OVERRIDE, _backend_for(ARTIFACT_AOT_AUTOGRAD)),
        ):
            self._undo.append(seam.set_for_every_thread(value))

    def off(self) -> None:
        while self._undo:
            self._undo.pop()()


# --------------------------------------------------------------------- C++ kernels


def cpp_key(target: str, root: str | None = None) -> str | None:
    """The portable key of a C++ library Inductor builds: torch's version plus the
    path under the cache dir, which hashes the source and the full compiler command
    line (ISA flags included). None for a file outside the cache dir."""
    import torch

    root = os.path.realpath(root or inductor_cache_dir())
    relative = os.path.relpath(os.path.realpath(target), root)
    if relative.startswith(os.pardir) or os.path.isabs(relative):
        return None
    return f"torch-{torch.__version__}:{relative.replace(os.sep, '/')}"


def _patched_build(original: Any, patch: StackedPatch[ArtifactTier]) -> Any:
    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        tier = patch.top
        target = key = None
        missed = False  # the tier reads, and had no library under this key
        if tier is not None:
            try:
                target = self.get_target_file_path()
                key = cpp_key(target)
                if key is not None and not os.path.exists(target):
                    payload = tier.fetch(ARTIFACT_CPP_KERNEL, key)
                    if payload is not None:
                        write_atomic(target, payload, mode=0o755)  # a shared library
                        return None
                    missed = tier.reads
            except Exception:  # a cache problem must never fail the compile
                log.debug("could not fetch a C++ build", exc_info=True)
        outcome = original(self, *args, **kwargs)
        if missed and tier is not None:
            tier.count_compiled()
        if tier is not None and key is not None and target is not None:
            tier.publish_file(ARTIFACT_CPP_KERNEL, key, target)
        return outcome

    return build


# The tiers installed, innermost last: Inductor builds its backends itself, so they find the tier here.
_TIERS: list[ArtifactTier] = []


def _active() -> ArtifactTier | None:
    return _TIERS[-1] if _TIERS else None


# Every C++ build Inductor makes goes through CppBuilder.build: kernel libraries, their
# object files, and the probes that pick the CPU's vector ISA (which compile and load
# small programs in every fresh cache dir, a large share of a CPU warm start).
_COMPILE_CPP: StackedPatch[ArtifactTier] = StackedPatch(seams.CPP_BUILD, _patched_build)


class ArtifactSeams:
    """Installs the tier into torch's caches; ``remove()`` puts everything back. A torch
    without one of the FX/AOT or C++ seams gets none of them (one warning), and Dynamo's
    package, which has seams of its own, may still serve."""

    def __init__(self, tier: ArtifactTier, *, dynamo_package: bool) -> None:
        from . import dynamo_package as packages

        self.tier = tier
        self._switches = _Switches()
        self._graphs = seams.usable(seams.ARTIFACTS)
        if self._graphs:
            self._switches.on()
            _COMPILE_CPP.push(tier)
            BUILD_TRITON_MODULE.push(tier)  # not patched where Triton is not installed
        _TIERS.append(tier)
        self.package = packages.install(tier) if dynamo_package else None

    def publish_packages(self) -> int:
        """Sign and store Dynamo's packages recorded so far (after forward and backward ran)."""
        if self.package is None:
            return 0
        try:
            return self.package.publish()
        except Exception:  # noqa: BLE001 - publishing is a bonus, never a failure
            log.debug("could not publish Dynamo packages", exc_info=True)
            return 0

    def remove(self) -> None:
        if self.package is not None:
            self.package.remove()
            self.package = None
        if self._graphs:
            _COMPILE_CPP.pop()
            BUILD_TRITON_MODULE.pop(self.tier)
        if self.tier in _TIERS:
            _TIERS.remove(self.tier)
        self._switches.off()
