"""One typed settings object, fed by CLI flags and ``AUTOTUNE_*`` environment variables.

Precedence: an explicit value (a CLI flag or a keyword argument) beats the
environment, which beats the default. A malformed environment value fails
loudly with the variable's name, like triton's knobs, rather than being ignored.
This is the only reader of ``AUTOTUNE_*``: the layers below (cache, workers) are
handed the values (``Store(settings.cache)``, the pool's ``fault``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from autotune.cache.records import MAX_ARTIFACT_BYTES

if TYPE_CHECKING:
    from autotune.cache.signing import Signer, TrustedKeys

ENV_PREFIX = "AUTOTUNE_"
# What the hook does on a miss: benchmark as max-autotune does, take ATen, raise, or serve
# the nearest swept shape's kernel (then tune if there is none; autotune/job/nearest.py).
ON_MISS = ("tune", "aten", "error", "nearest")
# torch.compile's modes that every supported torch accepts (torch._inductor.list_mode_options); a
# mode outside them is taken if the installed torch lists it (``compile_modes``).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# How a sweep's workers search each request: Inductor's default GEMM/conv configs, or its
# exhaustive space within a time budget per request (workers/search.py).
SEARCHES = ("default", "exhaustive")


class SettingsError(ValueError):
    """A setting has a value that cannot be used."""


def _parse_bool(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off")


def _parse(name: str, raw: str, type_name: str) -> Any:
    base = type_name.replace(" | None", "").strip()
    try:
        if base == "bool":
            return _parse_bool(name, raw)
        if base == "int":
            return int(raw)
        if base == "float":
            return float(raw)
        if base.startswith("tuple"):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
    except SettingsError:
        raise
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not a valid {base}") from exc
    return raw


@dataclass(frozen=True)
class Settings:
    """Everything a sweep, the hook or a CLI command can be told."""

    # Database URL; None means the embedded SQLite file (see cache.url).
    cache: str | None = None
    # torch.compile mode that capture, workers and the job use.
    mode: str = "max-autotune"
    # Ray cluster to join; None starts Ray locally.
    address: str | None = None
    # CPU sweeps: actors; parallel CPU benchmarks disturb each other, so 1.
    workers: int = 1
    # GPU sweeps: how many GPUs to use (None: every GPU Ray sees).
    gpus: int | None = None
    # Sweeps of several models: captures run at once, each in a process of its own (None: one
    # per GPU on a GPU host; on a CPU, in the sweep's process, one model after another).
    capture_processes: int | None = None
    # GPU sweeps: requests each GPU works on at once. A request spends most of its time
    # compiling candidates on the CPU (nearly all of it for a transformer GEMM on a GPU,
    # torch 2.11), so one compiles while another benchmarks; the GPU timings themselves take
    # turns (a lock per GPU, inductor_glue/gpu_lock.py).
    jobs_per_gpu: int = 4
    # GPU sweeps of several models: end-to-end passes each GPU runs at once, whole models only
    # (never more lanes than models). A pass's longest part, coordinate descent, compiles each
    # candidate config on the CPU one after another; a second pass compiles meanwhile, and the
    # timings take turns on the GPU as the requests' do.
    passes_per_gpu: int = 2
    # Sweeps: the search each request is tuned with (one of SEARCHES).
    search: Literal["default", "exhaustive"] = "default"
    # Sweeps with search="exhaustive": seconds of benchmarking one request may spend; once over,
    # the rest of its candidates are left untimed and the best so far wins (None: no budget).
    budget_s: float | None = None
    # Sweeps on a quiet host: time again the cached results that were timed on a busy one
    # (workers/retime.py), the tighter result replacing the noisy.
    retime_busy: bool = True
    # Seconds one request may take on a worker before it is killed and recorded as failed.
    request_timeout: float = 600.0
    # Sweeps sharing a database lease each request; a lease not renewed for this long
    # (its sweep died) is taken over by another sweep.
    lease_seconds: float = 60.0
    # Hook: what to do on a miss (one of ON_MISS).
    on_miss: str = "tune"
    # Hook: store misses' benchmark results under the sweep's keys.
    write_back: bool = True
    # Refuse every write (jobs holding read-only credentials).
    read_only: bool = False
    # Hook: seconds a cache lookup may take before it counts as a failure.
    lookup_timeout: float = 2.0
    # Hook under torchrun: the ranks of a node share one reader of the cache, local rank 0,
    # so a node's ranks make the database requests of one process (autotune/job/node_share.py).
    node_share: bool = True
    # Hook: on a hit, generate only the stored winner among Triton configs (not every loser).
    pin: bool = True
    # Hook: serve pointwise/reduction kernel configs (coordinate descent) from the cache too.
    kernel_configs: bool = True
    # Hook on GPUs: serve the sweep's epilogue-fusion and padding verdicts instead of timing
    # each again, so a job compiles the graph whose kernel configs were stored
    # (inductor_glue/fusion.py, padding.py).
    verdicts: bool = True
    # Device to capture and tune on: "cuda" or "cpu"; None picks cuda when present.
    device: str | None = None
    # Free-form Inductor config overrides, KEY=VALUE.
    inductor_config: tuple[str, ...] = field(default_factory=tuple)
    # Artifact tier: the private key that signs what this process publishes (None: publish nothing).
    signing_key: str | None = None
    # Artifact tier: public key files (PATH.pub) whose signatures this process loads (empty: load nothing).
    trusted_keys: tuple[str, ...] = field(default_factory=tuple)
    # Artifact tier on/off; with no keys configured it is off anyway.
    artifacts: bool = True
    # Artifact tier: the largest payload a job reads, in bytes; a stored one over it is refused
    # before it is read (a miss, with one warning), so a planted row cannot fill a job's memory.
    max_artifact_bytes: int = MAX_ARTIFACT_BYTES
    # Artifact tier: share Dynamo's package too (torch's caching_precompile), so a fresh node
    # skips tracing (on GPUs, torch 2.11, it cuts a transformer's first call well below what the
    # FX graph and AOTAutograd entries alone give). A model Dynamo cannot package, or a job that cannot use the package,
    # falls back to the FX graph and AOTAutograd entries with one warning.
    dynamo_package: bool = True
    # Hook: read the cache ahead on a background thread from warm_start() on (the stored winners
    # and the trusted artifacts of this device), so that the first compile finds them in memory
    # (autotune/job/prefetch.py).
    prefetch: bool = True
    # Hook, an opt-in (off by default on every machine): warm_start() returns at once and installs
    # the hook on a thread; torch.compile and Inductor's selector wait for it
    # (autotune/job/background.py, inductor_glue/selector_hold.py), and so do the script's imports of
    # torch's modules, which two threads cannot import at once (autotune/job/import_gate.py: it
    # replaces two functions of Python's import for the process). Off: the hook installs before
    # warm_start() returns and patches nothing of the interpreter's (docs/guide.md says why).
    background_install: bool = False
    # The sweep's end-to-end pass on GPUs: time each served GEMM in the graph's own process and
    # store that verdict, as cold max-autotune weighs its choices (autotune/job/in_graph.py).
    time_in_graph: bool = True
    # The sweep's log file: Inductor's, Dynamo's, torch's and Ray's output and the tuning
    # processes' (None: one file per sweep beside the SQLite cache, else under
    # $XDG_CACHE_HOME/autotune/logs; autotune/sweep/log_file.py).
    log: str | None = None
    # Tests of the failure path only: "crash:KEY", "hang:KEY", "kill-once:KEY" or "slow:SECONDS",
    # several comma-separated, handed down to the tuning processes and the end-to-end passes
    # (KEY "pass:<model file stem>"; workers/faults.py says what each does); "prefetch:hold" or
    # "prefetch:hang" for the hook's prefetch (autotune/job/prefetch.py).
    fault_inject: str = ""

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then ``AUTOTUNE_*`` variables, then non-None ``overrides``."""
        environ = dict(os.environ if environ is None else environ)
        values: dict[str, Any] = {}
        for f in fields(cls):
            env_name = ENV_PREFIX + f.name.upper()
            if env_name in environ:
                values[f.name] = _parse(env_name, environ[env_name], str(f.type))
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise SettingsError(f"unknown settings: {', '.join(sorted(unknown))}")
        settings = cls(**values)
        settings.validate()
        return settings

    def replace(self, **changes: Any) -> Settings:
        settings = dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.mode not in COMPILE_MODES and self.mode not in compile_modes():
            raise SettingsError(f"mode={self.mode!r} is not a torch.compile mode; use one of "
                                f"{', '.join(compile_modes())} (--mode or AUTOTUNE_MODE)")
        if self.on_miss not in ON_MISS:
            raise SettingsError(
                f"on_miss={self.on_miss!r} is not one of {', '.join(ON_MISS)} (AUTOTUNE_ON_MISS)"
            )
        if self.search not in SEARCHES:
            raise SettingsError(f"search={self.search!r} is not one of {', '.join(SEARCHES)} "
                                "(--search or AUTOTUNE_SEARCH)")
        if self.budget_s is not None and not self.budget_s > 0:
            raise SettingsError(f"budget_s={self.budget_s} must be a positive number of seconds "
                                "(--budget-s or AUTOTUNE_BUDGET_S)")
        if self.workers < 1:
            raise SettingsError(f"workers={self.workers} must be at least 1 (AUTOTUNE_WORKERS)")
        if self.jobs_per_gpu < 1:
            raise SettingsError(f"jobs_per_gpu={self.jobs_per_gpu} must be at least 1 (AUTOTUNE_JOBS_PER_GPU)")
        if self.passes_per_gpu < 1:
            raise SettingsError(f"passes_per_gpu={self.passes_per_gpu} must be at least 1 (AUTOTUNE_PASSES_PER_GPU)")
        if self.gpus is not None and self.gpus < 1:
            raise SettingsError(f"gpus={self.gpus} must be at least 1 (AUTOTUNE_GPUS)")
        if self.device not in (None, "cuda", "cpu"):
            raise SettingsError(f"device={self.device!r} must be cuda or cpu (AUTOTUNE_DEVICE)")
        if self.request_timeout <= 0 or self.lookup_timeout <= 0 or self.lease_seconds <= 0:
            raise SettingsError("timeouts must be positive")
        if self.max_artifact_bytes < 1:
            raise SettingsError(f"max_artifact_bytes={self.max_artifact_bytes} must be at least 1 "
                                "(AUTOTUNE_MAX_ARTIFACT_BYTES)")


@functools.cache
def compile_modes() -> tuple[str, ...]:
    """The modes the installed torch.compile accepts: the keys of the table in
    torch._inductor.list_mode_options, read from its source without importing torch, so that a
    wrong --mode is one line before anything starts; COMPILE_MODES where that source cannot be
    read or has changed shape."""
    try:
        spec = importlib.util.find_spec("torch")  # finds the package, imports nothing
        locations = list(spec.submodule_search_locations or []) if spec else []
        folder = locations[0] if locations else None
        if folder is None:
            return COMPILE_MODES
        tree = ast.parse(Path(folder, "_inductor", "__init__.py").read_bytes())
    except (ImportError, OSError, SyntaxError, ValueError):
        return COMPILE_MODES
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "list_mode_options":
            for inner in ast.walk(node):
                if isinstance(inner, ast.Dict) and inner.keys and all(
                        isinstance(k, ast.Constant) and isinstance(k.value, str) for k in inner.keys):
                    modes = tuple(str(k.value) for k in inner.keys if isinstance(k, ast.Constant))
                    if "max-autotune" in modes:
                        return modes
    return COMPILE_MODES


def warm_start_settings(cache: str | None = None, *, on_miss: str | None = None, write_back: bool | None = None,
                        read_only: bool = False, trusted_keys: Sequence[str] | None = None,
                        signing_key: str | None = None, settings: Settings | None = None) -> Settings:
    """A warm start's settings: ``AUTOTUNE_*`` (or ``settings``) with its arguments on top. An
    argument left None keeps what the environment says (``AUTOTUNE_ON_MISS``, ``AUTOTUNE_WRITE_BACK``),
    else the default: ``tune``, written back."""
    base = settings or Settings.from_env()
    return base.replace(cache=cache, on_miss=on_miss, write_back=write_back, read_only=read_only or base.read_only,
                        trusted_keys=tuple(trusted_keys) if trusted_keys is not None else None,
                        signing_key=signing_key)


def load_keys(settings: Settings) -> tuple[TrustedKeys, Signer | None]:
    """The keys the settings name (KeyFileError for a bad file); none when artifacts are off.

    Here, not in the hook, so that the CLI checks them without importing torch."""
    from autotune.cache import signing

    if not settings.artifacts:
        return signing.NO_TRUSTED_KEYS, None
    trusted = signing.load_trusted(settings.trusted_keys) if settings.trusted_keys else signing.NO_TRUSTED_KEYS
    signer = signing.load_signer(settings.signing_key) if settings.signing_key else None
    return trusted, signer
