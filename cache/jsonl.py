"""Versioned JSON Lines export/import format of the cache.

Line 1 is a header ``{"format": "autotune-cache", "version": 3}``; every other
line is one ``TuningResult.to_json()``, or (since version 2) one pointwise/reduction
kernel config ``{"kernel_config": {"env": ..., "key": ..., "value": {...}}}``, or
(since version 3) one compiled artifact ``{"artifact": {"kind", "key", "payload"
(base64), "digest", "signature" (hex or null), "public_key" (hex or null),
"torch_version", "device", "host", "created_at"}}``. Versions 1 and 2 are still
read. Import validates the whole file before writing anything, so a bad line
leaves the cache untouched; artifacts are checked (digest, sizes) but their
signatures are kept as they are: readers verify them before loading.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import IO, Any

from autotune.cache.errors import ImportValidationError
from autotune.cache.records import ARTIFACT_KINDS, FAILURE_KINDS, STATUSES, Artifact, Environment, TuningResult
from autotune.cache.signing import PUBLIC_KEY_BYTES, SIGNATURE_BYTES
from autotune.cache.validation import (
    CANDIDATE,
    ENV,
    NULL,
    PROVENANCE,
    RESULT,
    Spec,
    check,
    check_request,
    stored_repeats,
    stored_spread,
)

FORMAT = "autotune-cache"
VERSION = 3
READABLE_VERSIONS = (1, 2, 3)

_STR, _OPT_STR = (str,), (str, NULL)

_ARTIFACT: Spec = {
    "kind": (_STR, True),
    "key": (_STR, True),
    "payload": (_STR, True),
    "digest": (_STR, True),
    "signature": (_OPT_STR, True),
    "public_key": (_OPT_STR, True),
    "torch_version": (_STR, True),
    "device": (_STR, True),
    "host": (_STR, True),
    "created_at": (_STR, True),
}


@dataclass(frozen=True)
class KernelConfig:
    """One stored pointwise/reduction kernel config (plain JSON data)."""

    env: Environment
    key: str
    value: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"kernel_config": {"env": self.env.to_json(), "key": self.key, "value": self.value}}


@dataclass
class Contents:
    results: list[TuningResult] = field(default_factory=list)
    kernel_configs: list[KernelConfig] = field(default_factory=list)
    # Artifact lines are validated but not kept: payloads can be tens of MB each,
    # so the store reads them again, one at a time, with read_artifacts().
    artifacts: int = 0


@dataclass(frozen=True)
class ExportReport:
    """How many records of each sort write() wrote."""

    results: int = 0
    kernel_configs: int = 0
    artifacts: int = 0


def header() -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION}


def dumps(record: TuningResult | KernelConfig) -> str:
    return json.dumps(record.to_json(), separators=(",", ":"))


def artifact_to_json(artifact: Artifact) -> dict[str, Any]:
    return {
        "artifact": {
            "kind": artifact.kind,
            "key": artifact.key,
            "payload": base64.b64encode(artifact.payload).decode("ascii"),
            "digest": artifact.digest,
            "signature": artifact.signature.hex() if artifact.signature else None,
            "public_key": artifact.public_key.hex() if artifact.public_key else None,
            "torch_version": artifact.torch_version,
            "device": artifact.device,
            "host": artifact.host,
            "created_at": artifact.created_at.isoformat(),
        }
    }


def write(
    fp: IO[str],
    results: Iterable[TuningResult],
    kernel_configs: Iterable[KernelConfig] = (),
    artifacts: Iterable[Artifact] = (),
) -> ExportReport:
    """Write the header, the results, the kernel configs, then the artifacts.

    Every iterable is consumed one item at a time, so a generator of artifacts
    never holds more than one payload in memory.
    """
    fp.write(json.dumps(header()) + "\n")
    counts = [0, 0, 0]
    for index, lines in enumerate((
        (dumps(r) for r in results),
        (dumps(c) for c in kernel_configs),
        (json.dumps(artifact_to_json(a), separators=(",", ":")) for a in artifacts),
    )):
        for line in lines:
            fp.write(line + "\n")
            counts[index] += 1
    return ExportReport(*counts)


def read(fp: IO[str]) -> Contents:
    """Parse and validate every line; raise ImportValidationError at the first bad one."""
    contents = Contents()
    for number, data in _records(fp):
        with _line(number):
            if _is_a("kernel_config", data):
                contents.kernel_configs.append(parse_kernel_config(data["kernel_config"]))
            elif _is_a("artifact", data):
                parse_artifact(data["artifact"])
                contents.artifacts += 1
            else:
                contents.results.append(parse_result(data))
    return contents


def read_artifacts(fp: IO[str]) -> Iterator[Artifact]:
    """The artifacts of a file, one at a time (validated again: cheap next to the I/O)."""
    for number, data in _records(fp):
        if _is_a("artifact", data):
            with _line(number):
                artifact = parse_artifact(data["artifact"])
            yield artifact


def _is_a(tag: str, data: Any) -> bool:
    return isinstance(data, dict) and tag in data


def _records(fp: IO[str]) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON) of each line after the header."""
    seen_header = False
    for number, line in enumerate(fp, start=1):
        if not line.strip():
            continue
        data = _parse_json(line, number)
        if not seen_header:
            _check_header(data, number)
            seen_header = True
            continue
        yield number, data
    if not seen_header:
        raise ImportValidationError(1, f"empty file: expected a header line {json.dumps(header())}")


@contextmanager
def _line(number: int) -> Iterator[None]:
    """Report a problem found while checking a record as a problem of its line."""
    try:
        yield
    except (ValueError, TypeError, KeyError) as exc:
        raise ImportValidationError(number, str(exc)) from None


def parse_kernel_config(data: Any) -> KernelConfig:
    check(data, {"env": ((dict,), True), "key": (_STR, True), "value": ((dict,), True)}, "kernel_config")
    check(data["env"], ENV, "kernel_config.env")
    if not data["key"]:
        raise ValueError("kernel_config.key must not be empty")
    return KernelConfig(Environment.from_json(data["env"]), data["key"], data["value"])


def parse_artifact(data: Any) -> Artifact:
    """Check one artifact: kind, base64 payload whose sha256 is its digest, and a
    signature and public key of the right sizes (both or neither). The signature
    itself is not verified here: readers do that against the keys they trust."""
    check(data, _ARTIFACT, "artifact")
    if data["kind"] not in ARTIFACT_KINDS:
        raise ValueError(f"artifact.kind {data['kind']!r} is not one of {', '.join(ARTIFACT_KINDS)}")
    if not data["key"]:
        raise ValueError("artifact.key must not be empty")
    payload = _base64(data["payload"], "artifact.payload")
    actual = hashlib.sha256(payload).hexdigest()
    if data["digest"].lower() != actual:
        raise ValueError(f"artifact.digest {data['digest']!r} does not match the payload (its sha256 is {actual}); "
                         "the line is corrupt: export it again")
    signature = _hex(data["signature"], SIGNATURE_BYTES, "artifact.signature")
    public_key = _hex(data["public_key"], PUBLIC_KEY_BYTES, "artifact.public_key")
    if (signature is None) != (public_key is None):
        raise ValueError("artifact.signature and artifact.public_key must both be set or both be null")
    return Artifact(
        kind=data["kind"],
        key=data["key"],
        payload=payload,
        signature=signature,
        public_key=public_key,
        torch_version=data["torch_version"],
        device=data["device"],
        host=data["host"],
        created_at=_timestamp(data["created_at"], "artifact.created_at"),
    )


def _base64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where} is not valid base64") from None


def _hex(text: str | None, size: int, where: str) -> bytes | None:
    if text is None:
        return None
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{where} is not hexadecimal") from None
    if len(raw) != size:
        raise ValueError(f"{where} must be {size} bytes ({2 * size} hex digits), got {len(raw)}")
    return raw


def _timestamp(text: str, where: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{where} is not an ISO 8601 timestamp") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def _parse_json(line: str, number: int) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise ImportValidationError(number, f"not valid JSON ({exc.msg} at column {exc.colno})") from None


def _check_header(data: Any, number: int) -> None:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ImportValidationError(
            number, f'not an autotune cache export: the first line must be {json.dumps(header())}'
        )
    version = data.get("version")
    if version not in READABLE_VERSIONS:
        raise ImportValidationError(
            number, f"unsupported format version {version!r} (this autotune reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))})"
        )


def parse_result(data: Any) -> TuningResult:
    """Check one line's structure and types, then build the record."""
    check(data, RESULT, "result")
    check(data["env"], ENV, "env")
    check_request(data["request"])
    check(data["provenance"], PROVENANCE, "provenance")
    hashes = [_check_candidate(c, i) for i, c in enumerate(data["candidates"])]
    status = data.get("status", STATUSES[0])
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    winner = data.get("winner_hash")
    if winner is not None and winner not in hashes:
        raise ValueError(f"winner_hash {winner!r} is not the choice_hash of any candidate")
    try:
        datetime.fromisoformat(data["provenance"]["created_at"])
    except ValueError:
        raise ValueError("provenance.created_at is not an ISO 8601 timestamp") from None
    return TuningResult.from_json(data)


def _check_candidate(cand: Any, i: int) -> str:
    where = f"candidates[{i}]"
    check(cand, CANDIDATE, where)
    kind = cand.get("failure_kind")
    if kind is not None and kind not in FAILURE_KINDS:
        raise ValueError(f"{where}.failure_kind {kind!r} is not one of {', '.join(FAILURE_KINDS)}")
    stored_spread(cand.get("spread"), f"{where}.spread")
    stored_repeats(cand.get("repeats"), f"{where}.repeats")
    time_ms = cand.get("time_ms")
    if time_ms is not None and not (math.isfinite(time_ms) and time_ms >= 0):
        raise ValueError(f"{where}.time_ms must be a finite number >= 0 or null, got {time_ms!r}")
    return cand["choice_hash"]
