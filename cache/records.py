"""Plain, typed records that flow between capture, workers, the store and the hook.

They are the store's whole vocabulary: everything it saves or returns is one of
these, made only of JSON-compatible values (no pickles, no code). Keys are
sha256 digests of the fields that identify a record, so the same request gets
the same key on every host.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

from autotune.cache.errors import MalformedRow

T = TypeVar("T")
V = TypeVar("V")

# Status of a stored tuning result.
STATUS_OK = "ok"  # a winner was found and validated against ATen
STATUS_FAILED = "failed"  # the request could not be tuned (crash, timeout, no valid choice)
STATUS_MISMATCH = "key_mismatch"  # the reproduced key/candidates differ from the recorded ones
STATUS_INVALID = "invalid"  # the winner gave wrong numbers
STATUSES = (STATUS_OK, STATUS_FAILED, STATUS_MISMATCH, STATUS_INVALID)

# Why a candidate has no time.
FAILURE_KINDS = (
    "compile_error",
    "out_of_resources",
    "wrong_numerics",
    "timeout",
    "crash",
    "benchmark_error",
)


def digest(*parts: Any) -> str:
    """A stable sha256 hex digest of JSON-serialisable parts."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class _SetsAside:
    malformed: list[MalformedRow]

    def set_aside(self, error: MalformedRow) -> None:
        """Keep a row that failed validation out, once (the rows of one malformed environment
        all fail with its error)."""
        if all((e.table, e.row_id) != (error.table, error.row_id) for e in self.malformed):
            self.malformed.append(error)


class Listing(_SetsAside, list[T]):
    """Records read from the database, in order. A row that failed validation is left out
    and kept in ``malformed`` (one MalformedRow per row, naming its table and id), so that
    one bad row hides only itself and the caller decides how to report it."""

    def __init__(self, records: Iterable[T] = (), malformed: Iterable[MalformedRow] = ()) -> None:
        super().__init__(records)
        self.malformed = list(malformed)


class KeyedListing(_SetsAside, dict[str, V]):
    """Like Listing, for records read by key (kernel configs)."""

    def __init__(self, records: Iterable[tuple[str, V]] = (), malformed: Iterable[MalformedRow] = ()) -> None:
        super().__init__(records)
        self.malformed = list(malformed)


@dataclass(frozen=True)
class Environment:
    """Everything outside the request that can change a timing or a kernel's source."""

    device_kind: str  # "cuda", "cpu", ...
    device_name: str  # GPU name, or on CPU the CPU model plus its vector ISA
    torch_version: str
    triton_version: str | None
    cuda_version: str | None
    system_hash: str  # Inductor's CacheBase.get_system()["hash"]
    config_fingerprint: str  # digest of the Inductor config values that change choices or source
    config: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        return digest(
            self.device_kind,
            self.device_name,
            self.torch_version,
            self.triton_version,
            self.cuda_version,
            self.system_hash,
            self.config_fingerprint,
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Environment:
        return cls(**data)


# The ops whose inputs are recorded with their aliasing (``InputLayout.alias``): Inductor's
# GEMM and convolution lowerings take one tensor per input, so a worker rebuilds shared
# buffers as views. CPU mkldnn ops (packed_linear, linear_binary, ...) are recorded and
# reproduced as before: their builders take weights as module parameters, and Inductor's
# C++ template benchmark fails on a linear_binary whose input and addend are one tensor.
ALIASED_OPS = ("mm", "bmm", "addmm", "baddbmm", "convolution")
# The ops whose CPU inputs are recorded as graph constants where they are (``InputLayout.constant``).
CONSTANT_OPS = ("mm", "bmm", "addmm", "baddbmm")


@dataclass(frozen=True)
class InputLayout:
    """One input of a request, as Inductor's inputs_key sees it."""

    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    dtype: str  # e.g. "torch.bfloat16"
    device: str  # device type, e.g. "cuda" (never an index)
    # Dimensions whose size is symbolic in the graph (dynamic shapes); sizes then hold
    # Inductor's size hints, as inputs_key does.
    symbolic: tuple[int, ...] = ()
    # The size expression of each symbolic dimension, in the graph's own symbols ("s27*s77",
    # "16*s77"): Inductor writes them into kernel source, so a worker reproduces them exactly.
    # Empty for inputs recorded before expressions were.
    exprs: tuple[str, ...] = ()
    # The position of the first earlier input of the request that is a view of the same
    # buffer (a tensor and its own transpose, or the same tensor twice), None for an input
    # with a buffer of its own. Inductor passes one buffer to the kernel then, so its source
    # differs from that of two separate tensors of the same layouts.
    alias: int | None = None
    # A constant of the graph (a weight frozen by ``freezing``) rather than one of its inputs.
    # Inductor's C++ GEMM templates pack a constant into blocks as they compile, so their
    # source differs from the same GEMM's on an input. Recorded for CPU GEMMs only
    # (``CONSTANT_OPS``): Triton's templates read either alike, and GPU keys stay as they were.
    constant: bool = False

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "sizes": list(self.sizes),
            "strides": list(self.strides),
            "offset": self.offset,
            "dtype": self.dtype,
            "device": self.device,
        }
        if self.symbolic:  # absent for static inputs: rows written before dynamic shapes stay equal
            data["symbolic"] = list(self.symbolic)
        if self.exprs:
            data["exprs"] = list(self.exprs)
        if self.alias is not None:  # absent where the input has its own buffer: older rows stay equal
            data["alias"] = self.alias
        if self.constant:  # absent for an input: older rows stay equal
            data["constant"] = True
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputLayout:
        return cls(
            sizes=tuple(int(s) for s in data["sizes"]),
            strides=tuple(int(s) for s in data["strides"]),
            offset=int(data["offset"]),
            dtype=str(data["dtype"]),
            device=str(data["device"]),
            symbolic=tuple(int(d) for d in data.get("symbolic", ())),
            exprs=tuple(str(e) for e in data.get("exprs", ())),
            alias=None if data.get("alias") is None else int(data["alias"]),
            constant=data.get("constant") is True,
        )


# The arguments of an op's ATen choice that select another kernel for the same inputs:
# mkldnn's fused epilogues (linear_unary, linear_binary, ...) and a convolution's geometry.
# GEMMs' alpha and beta are left out: their keys stay as they were (see the README's limits).
VARIANT_KWARGS = ("attr", "scalars", "algorithm", "binary_attr", "binary_alpha", "unary_attr", "unary_scalars",
                  "unary_algorithm", "stride", "padding", "dilation", "groups", "transposed", "output_padding")


def request_variant(params: dict[str, Any]) -> dict[str, Any]:
    """The kernel-selecting arguments of a request's ATen choice (``params["aten"]``)."""
    aten = params.get("aten") or {}
    return {name: aten[name] for name in VARIANT_KWARGS if name in aten}


@dataclass(frozen=True)
class TuningRequest:
    """One autotune request exactly as Inductor makes it.

    Identity is (op, inputs_key, precision), with the kernel-selecting arguments of its ATen
    choice (``request_variant``) and its symbolic dimensions; inputs, params and the candidate set
    are what a worker needs to reproduce it and what the hook checks at lookup.
    """

    op: str  # Inductor's name: "mm", "addmm", "bmm", "convolution", "packed_linear", ...
    inputs_key: str  # Inductor's create_inputs_key(input_nodes)
    precision: str  # torch.get_float32_matmul_precision() at request time
    inputs: tuple[InputLayout, ...] = ()
    params: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    choice_hashes: tuple[str, ...] = ()  # sorted hash_key() of every candidate offered

    @property
    def key(self) -> str:
        # Inductor asks with the same (op, inputs_key) for kernels that differ by an argument
        # its inputs_key leaves out (a Linear with a fused GELU or none; convolutions that
        # differ by dilation on the same input and weight): each is its own request.
        base: tuple[Any, ...] = (self.op, self.inputs_key, self.precision)
        variant = request_variant(self.params)
        if variant:  # absent for a plain GEMM: its key stays as it was
            base += ("variant", variant)
        aliases = self.aliases
        if aliases:  # inputs_key is the same for one buffer viewed twice and two buffers; the kernels differ
            base += ("aliases", aliases)
        constants = tuple(i for i, layout in enumerate(self.inputs) if layout.constant)
        if constants:  # inputs_key is the same for a frozen weight and an input; a C++ template's source differs
            base += ("constants", constants)
        symbolic = tuple(i.symbolic for i in self.inputs)
        if not any(symbolic):
            return digest(*base)
        # inputs_key holds size hints only, so a graph with a dynamic batch asks with the
        # same inputs_key as the static graph of that size, but gets other candidates
        # (kernels for a symbolic size): it is another request.
        exprs = tuple(i.exprs for i in self.inputs)
        if not any(exprs):  # recorded before size expressions were
            return digest(*base, "symbolic", symbolic)
        # Two graphs can ask with the same hints but other expressions (M = s0*s1 or 32*s0):
        # their kernels differ, so they are different requests.
        return digest(*base, "symbolic", symbolic, exprs)

    @property
    def aliases(self) -> tuple[int | None, ...]:
        """Each input's ``alias``, or () where every input has a buffer of its own."""
        aliases = tuple(i.alias for i in self.inputs)
        return aliases if any(a is not None for a in aliases) else ()

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "inputs_key": self.inputs_key,
            "precision": self.precision,
            "inputs": [i.to_json() for i in self.inputs],
            "params": self.params,
            "choice_hashes": list(self.choice_hashes),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TuningRequest:
        return cls(
            op=str(data["op"]),
            inputs_key=str(data["inputs_key"]),
            precision=str(data["precision"]),
            inputs=tuple(InputLayout.from_json(i) for i in data.get("inputs", [])),
            params=dict(data.get("params") or {}),
            choice_hashes=tuple(sorted(data.get("choice_hashes", []))),
        )


@dataclass(frozen=True)
class CandidateResult:
    """One candidate choice and how it did."""

    choice_hash: str  # Inductor's choice.hash_key()
    kind: str  # "aten", "triton", "cpp", "extern", ...
    name: str
    description: str = ""
    template_id: str | None = None
    params: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    time_ms: float | None = None  # None when it failed; the median of its timed rounds
    failure_kind: str | None = None  # one of FAILURE_KINDS
    failure_message: str | None = None
    # How far its timed rounds disagree, relative to the median ((max - min) / median), and how
    # many rounds there were; None where it was timed once (or before rounds were kept).
    spread: float | None = None
    repeats: int | None = None

    @property
    def ok(self) -> bool:
        return self.time_ms is not None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for name in ("spread", "repeats"):  # absent when unknown: older readers take the line
            if data[name] is None:
                del data[name]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CandidateResult:
        return cls(**data)


# The search that found a stored winner, when no other was asked for.
SEARCH_DEFAULT = "default"
# Why a result stores ATen though another candidate looked faster: the difference was
# within the measured noise of the two timings (workers/noise.py).
FALLBACK_WITHIN_NOISE = "within_noise"
# Why: it would have won on a quiet host, but the host was busy, and a busy CPU's timings
# of one candidate against another mean little (workers/noise.py).
FALLBACK_BUSY_HOST = "busy_host"


@dataclass(frozen=True)
class Provenance:
    created_at: datetime = field(default_factory=utcnow)
    host: str = ""
    sweep_id: str | None = None
    tuning_seconds: float | None = None
    source: str = "sweep"  # "sweep", "write_back", "import"
    search: str = SEARCH_DEFAULT  # which search found the winner

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["created_at"] = self.created_at.isoformat()
        if self.search == SEARCH_DEFAULT:  # absent for the default: older readers take the line
            del data["search"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Provenance:
        data = dict(data)
        created = datetime.fromisoformat(data.pop("created_at"))
        if created.tzinfo is None:
            created = created.replace(tzinfo=timezone.utc)
        return cls(created_at=created, **data)


@dataclass(frozen=True)
class TuningResult:
    """A tuned request: every candidate, the winner and its validation."""

    env: Environment
    request: TuningRequest
    candidates: tuple[CandidateResult, ...]
    winner_hash: str | None
    status: str = STATUS_OK  # one of STATUSES
    validation: dict[str, Any] | None = None  # {"passed", "max_abs_err", "atol", "rtol"}
    error: str | None = None  # request-level failure reason
    provenance: Provenance = field(default_factory=Provenance)
    # Why ATen was stored though another candidate looked faster (FALLBACK_WITHIN_NOISE), else None.
    fallback_reason: str | None = None

    @property
    def winner(self) -> CandidateResult | None:
        return next((c for c in self.candidates if c.choice_hash == self.winner_hash), None)

    @property
    def winner_spread(self) -> float | None:
        """The noise the winner was chosen under: the largest spread of the winner and the two
        fastest candidates (what it was compared with); None where none has one."""
        winner = self.winner
        if winner is None:
            return None
        fastest = sorted((c for c in self.candidates if c.time_ms is not None), key=lambda c: c.time_ms or 0.0)[:2]
        spreads = [c.spread for c in (winner, *fastest) if c.spread is not None]
        return max(spreads) if spreads else None

    @property
    def aten_time_ms(self) -> float | None:
        times = [c.time_ms for c in self.candidates if c.kind == "aten" and c.time_ms is not None]
        return min(times) if times else None

    @property
    def speedup_over_aten(self) -> float | None:
        winner, aten = self.winner, self.aten_time_ms
        if winner is None or winner.time_ms is None or aten is None or winner.time_ms <= 0:
            return None
        return aten / winner.time_ms

    def timings(self) -> dict[str, float]:
        """choice hash -> ms, failures as +inf (what Inductor itself records), the winner the
        fastest: Inductor takes the fastest, and a candidate that timed faster than a winner
        stored for the noise (``fallback_reason``) is served just behind it."""
        winner = self.winner
        behind = math.nextafter(winner.time_ms, math.inf) if winner is not None and winner.time_ms is not None \
            else None
        return {
            c.choice_hash: math.inf if c.time_ms is None
            else max(c.time_ms, behind) if behind is not None and c is not winner
            else c.time_ms
            for c in self.candidates
        }

    def to_json(self) -> dict[str, Any]:
        data = {
            "env": self.env.to_json(),
            "request": self.request.to_json(),
            "candidates": [c.to_json() for c in self.candidates],
            "winner_hash": self.winner_hash,
            "status": self.status,
            "validation": self.validation,
            "error": self.error,
            "provenance": self.provenance.to_json(),
        }
        if self.fallback_reason is not None:  # absent otherwise: older readers take the line
            data["fallback_reason"] = self.fallback_reason
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TuningResult:
        return cls(
            env=Environment.from_json(data["env"]),
            request=TuningRequest.from_json(data["request"]),
            candidates=tuple(CandidateResult.from_json(c) for c in data["candidates"]),
            winner_hash=data.get("winner_hash"),
            status=data.get("status", STATUS_OK),
            validation=data.get("validation"),
            error=data.get("error"),
            provenance=Provenance.from_json(data["provenance"])
            if data.get("provenance")
            else Provenance(),
            fallback_reason=data.get("fallback_reason"),
        )


@dataclass(frozen=True)
class MissRecord:
    """A request the hook could not answer, logged so the next sweep tunes it."""

    env: Environment
    request: TuningRequest
    first_seen: datetime = field(default_factory=utcnow)
    last_seen: datetime = field(default_factory=utcnow)
    count: int = 1
    host: str = ""


# --- the artifact tier: compiled code, loaded only when signed by a trusted key ---

ARTIFACT_FX_GRAPH = "fx_graph"  # Inductor's FX graph cache entry (a pickled compiled graph, kernels bundled)
ARTIFACT_AOT_AUTOGRAD = "aot_autograd"  # AOTAutograd's cache entry (forward and backward)
ARTIFACT_DYNAMO = "dynamo"  # Dynamo's package (caching_precompile): traced code and guards
ARTIFACT_CPP_KERNEL = "cpp_kernel"  # a compiled C++ kernel library (.so), by Inductor's source+flags hash
# A native module Triton builds with the C compiler (a kernel's launcher, its driver's utilities),
# by Triton's version, the module's source and the Python ABI: gcc's seconds on a fresh node.
ARTIFACT_TRITON_MODULE = "triton_module"
ARTIFACT_KINDS = (ARTIFACT_FX_GRAPH, ARTIFACT_AOT_AUTOGRAD, ARTIFACT_DYNAMO, ARTIFACT_CPP_KERNEL,
                  ARTIFACT_TRITON_MODULE)
# The largest payload a reader takes (AUTOTUNE_MAX_ARTIFACT_BYTES): a larger one is refused
# before it is read, so a planted row cannot fill a job's memory. Compiled graphs with their
# kernels are megabytes; a Dynamo package of a large model tens of megabytes.
MAX_ARTIFACT_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Artifact:
    """One compiled artifact under Inductor's own cache key, with its signature.

    ``key`` is the key Inductor (or Dynamo) looks the artifact up by, so a changed
    model, torch, Triton, config or device misses. Written once: the first
    writer of a (kind, key) wins and the row is never changed.
    """

    kind: str
    key: str
    payload: bytes = field(repr=False)
    signature: bytes | None = field(default=None, repr=False)
    public_key: bytes | None = field(default=None, repr=False)
    torch_version: str = ""
    device: str = ""
    host: str = ""
    created_at: datetime = field(default_factory=utcnow)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.payload).hexdigest()

    @property
    def size(self) -> int:
        return len(self.payload)

    @property
    def signer(self) -> str | None:
        """The signing key's fingerprint (cache.signing.fingerprint), None when unsigned."""
        from autotune.cache.signing import fingerprint

        return fingerprint(self.public_key) if self.public_key else None


@dataclass(frozen=True)
class ArtifactInfo:
    """An artifact's row without its payload (for ls and stats)."""

    id: int
    kind: str
    key: str
    size: int
    digest: str
    signer: str | None
    torch_version: str
    device: str
    host: str
    created_at: datetime
