"""What crosses the node share's socket (autotune/job/node_share.py): data, never code.

A message is a JSON document (sent without NaN or Infinity) followed by the raw bytes it
names (an artifact's payload, signature and public key), each length-prefixed::

    !II  JSON length, blob count  |  JSON (UTF-8)  |  (!Q length, bytes) per blob

Nothing in a message is ever executed or unpickled. A call names one of ``METHODS``, the
store calls a job makes (its lookups and its write-back), each argument by name; anything else
(``prune``, a lease, a method of the socket's Python objects) is refused. Every value is
typed by the method: a stored result that arrives from local rank 0 is checked by the checks
an import makes of a line (``cache/jsonl.py``, ``cache/validation.py``) plus those the store
makes of a row (a status ``ok`` with no timed candidate), so a NaN time, a wrong type or an
unknown field makes it a ``MalformedRow``, read as absent with one warning, as a bad row of the
database is. What a rank sends local rank 0 to write is checked the same way before the store
sees it.
"""

from __future__ import annotations

import json
import math
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any

from autotune.cache import errors as cache_errors
from autotune.cache.errors import CacheError, MalformedRow
from autotune.cache.records import (
    MAX_ARTIFACT_BYTES,
    STATUS_OK,
    Artifact,
    ArtifactInfo,
    Environment,
    KeyedListing,
    Listing,
    TuningRequest,
    TuningResult,
)
from autotune.cache.validation import ENV, check, check_kernel_config, check_request, check_timed

# The largest JSON part of a message (a listing of every stored result of a device), and of a
# blob (an artifact's payload at the largest cap a reader may set, AUTOTUNE_MAX_ARTIFACT_BYTES).
MAX_JSON_BYTES = 256 * 1024 * 1024
MAX_BLOB_BYTES = 4 * 1024 * 1024 * 1024
MAX_BLOBS = 3
_HEADER = struct.Struct("!II")
_BLOB = struct.Struct("!Q")
_REQUIRED = object()
_FROM = "as local rank 0 sent it"  # where a received row that fails its checks came from


class WireError(ValueError):
    """A message that is not one the node share sends (refused, never acted on)."""


Blobs = list[bytes]


# ------------------------------------------------------------------ framing


def send(sock: socket.socket, message: dict[str, Any], blobs: Blobs | None = None) -> None:
    blobs = blobs or []
    text = json.dumps(message, allow_nan=False, separators=(",", ":")).encode("utf-8")
    sock.sendall(_HEADER.pack(len(text), len(blobs)) + text)
    for blob in blobs:  # sent as they are: a payload of megabytes is not copied into the frame
        sock.sendall(_BLOB.pack(len(blob)))
        sock.sendall(blob)


def receive(sock: socket.socket) -> tuple[Any, Blobs]:
    """A message: its JSON, parsed, and its blobs. WireError for one that is not well formed;
    ConnectionError when the other side closed."""
    size, count = _HEADER.unpack(read_exactly(sock, _HEADER.size))
    if size > MAX_JSON_BYTES or count > MAX_BLOBS:
        raise WireError(f"a message of {size} bytes and {count} blobs is not one the node share sends")
    try:
        # NaN and Infinity parse as Python's json (and the store's SQLite JSON columns) reads them,
        # so that the typed checks below refuse them where the database path does (a time).
        message = json.loads(read_exactly(sock, size).decode("utf-8"))
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise WireError(f"not JSON ({type(exc).__name__})") from None
    blobs = []
    for _ in range(count):
        (length,) = _BLOB.unpack(read_exactly(sock, _BLOB.size))
        if length > MAX_BLOB_BYTES:
            raise WireError(f"a blob of {length} bytes is over {MAX_BLOB_BYTES}")
        blobs.append(read_exactly(sock, length))
    return message, blobs


def read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the other rank closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# ------------------------------------------------------------------ typed values


def _plain(value: Any) -> Any:
    """Free-form JSON data (a config, params, a kernel config) as the store keeps it: tuples as
    lists, a non-finite float as null (JSON has none), any other object as its text (as the
    environment's fingerprint reads Inductor's config: ``records.digest``)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float)):
        return value
    return str(value)


def _typed(data: Any, types: tuple[type, ...], where: str) -> Any:
    if (data.__class__ is bool and bool not in types) or not isinstance(data, types):
        raise ValueError(f"{where} is a {type(data).__name__}, not {' or '.join(t.__name__ for t in types)}")
    return data


@dataclass(frozen=True)
class Codec:
    """How one typed value crosses: ``encode`` on the sending side, ``decode`` (which checks
    everything and raises ValueError, TypeError or KeyError) on the receiving side."""

    encode: Callable[[Any, Blobs], Any]
    decode: Callable[[Any, Blobs], Any]


def _scalar(*types: type) -> Codec:
    return Codec(lambda value, blobs: _typed(value, types, "a value"),
                 lambda data, blobs: _typed(data, types, "a value"))


STR, OPT_STR, INT, OPT_INT, BOOL = (_scalar(str), _scalar(str, type(None)), _scalar(int),
                                     _scalar(int, type(None)), _scalar(bool))
NONE = _scalar(type(None))


def _env(data: Any, blobs: Blobs) -> Environment:
    check(data, ENV, "environment")
    return Environment(**{**data, "config": data.get("config") or {}})


def _request(data: Any, blobs: Blobs) -> TuningRequest:
    check_request(data)
    return TuningRequest.from_json(data)


def _result(data: Any, blobs: Blobs) -> TuningResult:
    """A stored result: the import's checks of a line, and the store's of a row."""
    from autotune.cache.jsonl import parse_result

    result = parse_result(data)
    check_timed(result.status == STATUS_OK, [c.time_ms for c in result.candidates])
    return result


def _time(data: Any, where: str) -> datetime:
    value = datetime.fromisoformat(_typed(data, (str,), where))
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


def _blob(blobs: Blobs, index: Any, where: str) -> bytes:
    if index.__class__ is not int or not 0 <= index < len(blobs):
        raise ValueError(f"{where} names no blob of the message")
    return blobs[index]


def _put_blob(blobs: Blobs, value: bytes | None) -> int | None:
    if value is None:
        return None
    blobs.append(bytes(value))
    return len(blobs) - 1


def _encode_artifact(artifact: Artifact, blobs: Blobs) -> dict[str, Any]:
    return {"kind": artifact.kind, "key": artifact.key, "payload": _put_blob(blobs, artifact.payload),
            "signature": _put_blob(blobs, artifact.signature), "public_key": _put_blob(blobs, artifact.public_key),
            "torch_version": artifact.torch_version, "device": artifact.device, "host": artifact.host,
            "created_at": artifact.created_at.isoformat()}


def _artifact(data: Any, blobs: Blobs) -> Artifact:
    fields = {"kind", "key", "payload", "signature", "public_key", "torch_version", "device", "host", "created_at"}
    if not isinstance(data, dict) or data.keys() != fields:
        raise ValueError("an artifact must hold exactly its fields")
    for name in ("kind", "key", "torch_version", "device", "host"):
        _typed(data[name], (str,), name)
    optional = {name: None if data[name] is None else _blob(blobs, data[name], name)
                for name in ("signature", "public_key")}
    return Artifact(kind=data["kind"], key=data["key"], payload=_blob(blobs, data["payload"], "payload"),
                    torch_version=data["torch_version"], device=data["device"], host=data["host"],
                    created_at=_time(data["created_at"], "created_at"), **optional)


def _encode_info(info: ArtifactInfo, blobs: Blobs) -> dict[str, Any]:
    return {**info.__dict__, "created_at": info.created_at.isoformat()}


def _info(data: Any, blobs: Blobs) -> ArtifactInfo:
    if not isinstance(data, dict):
        raise ValueError("an artifact's listing entry must be an object")
    # Imported here, through the store's imports, not with this module: the install builds the
    # node share, and SQLAlchemy's import (the artifact store's) is the prefetch thread's to make.
    from autotune.job import store_imports

    store_imports.join()
    from autotune.cache import artifacts_store

    return artifacts_store.info_from_values({**data, "created_at": _time(data.get("created_at"), "created_at")})


def _configs(data: Any, blobs: Blobs) -> dict[str, dict[str, Any]]:
    if not isinstance(data, dict):
        raise ValueError("kernel configs must be an object")
    for key, value in data.items():
        check_kernel_config(key, value)
    return data


RESULT = Codec(lambda r, blobs: _plain(r.to_json()), _result)
OPT_RESULT = Codec(lambda r, blobs: None if r is None else _plain(r.to_json()),
                   lambda data, blobs: None if data is None else _result(data, blobs))
# Not Environment.to_json: its asdict copies the config, and a copied object's text differs.
ENV_CODEC = Codec(lambda env, blobs: _plain({f.name: getattr(env, f.name) for f in fields(env)}), _env)
REQUEST = Codec(lambda request, blobs: _plain(request.to_json()), _request)
ARTIFACT = Codec(_encode_artifact, _artifact)
CONFIGS = Codec(lambda items, blobs: _plain(dict(items)), _configs)


def _opt_artifact(data: Any, blobs: Blobs) -> Artifact | None:
    return None if data is None else _artifact(data, blobs)


OPT_ARTIFACT = Codec(lambda a, blobs: None if a is None else _encode_artifact(a, blobs), _opt_artifact)


def _listing(row: Codec, table: str, keyed: bool = False) -> Codec:
    """A listing: its rows, each decoded on its own (one that fails its checks is set aside as
    a malformed row of ``table``, as the store sets aside a bad row), and the rows the store
    set aside."""

    def encode(found: Any, blobs: Blobs) -> dict[str, Any]:
        rows = {k: row.encode(v, blobs) for k, v in found.items()} if keyed else [row.encode(r, blobs) for r in found]
        bad = [[e.table, e.row_id if isinstance(e.row_id, (int, str)) else str(e.row_id), e.problem]
               for e in getattr(found, "malformed", ())]
        return {"rows": rows, "malformed": bad}

    def decode(data: Any, blobs: Blobs) -> Any:
        if not isinstance(data, dict) or data.keys() != {"rows", "malformed"}:
            raise ValueError("a listing must hold its rows and the malformed ones")
        found: Any = KeyedListing() if keyed else Listing()
        items = _typed(data["rows"], (dict,) if keyed else (list,), "rows")
        for index, item in enumerate(items.items() if keyed else items):
            try:
                if keyed:
                    key, value = item
                    check_kernel_config(key, value)
                    found[key] = value
                else:
                    found.append(row.decode(item, blobs))
            except (ValueError, TypeError, KeyError) as exc:
                found.set_aside(MalformedRow(table, f"#{index} {_FROM}", str(exc)))
        for entry in _typed(data["malformed"], (list,), "malformed"):
            table_name, row_id, problem = _typed(entry, (list,), "a malformed row")
            found.set_aside(MalformedRow(_typed(table_name, (str,), "table"), _typed(row_id, (int, str), "row"),
                                         _typed(problem, (str,), "problem")))
        return found

    return Codec(encode, decode)


def _id_result(row: Any, blobs: Blobs) -> tuple[int, TuningResult]:
    row_id, result = _typed(row, (list,), "a listed result")
    return _typed(row_id, (int,), "a result's id"), _result(result, blobs)


_ID_RESULT = Codec(lambda row, blobs: [row[0], _plain(row[1].to_json())], _id_result)
_DICT = Codec(lambda value, blobs: _plain(value), lambda data, blobs: _typed(data, (dict,), "a kernel config"))


# ------------------------------------------------------------------ the calls a job makes


@dataclass(frozen=True)
class Method:
    """One store call the node share serves: its parameters (name, codec, default) as the
    store's own signature has them, what it returns, and whether it is a read (answered once
    per node) or a write (passed on each time)."""

    params: tuple[tuple[str, Codec, Any], ...]
    returns: Codec
    read: bool

    def bind(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by name, as Python would bind them (TypeError as Python's)."""
        names = [p[0] for p in self.params]
        if len(args) > len(names) or set(kwargs) - set(names) or set(kwargs) & set(names[:len(args)]):
            raise TypeError(f"{name}() got arguments it does not take")
        bound = {**dict(zip(names, args)), **kwargs}
        for param, _, default in self.params:
            if param not in bound:
                if default is _REQUIRED:
                    raise TypeError(f"{name}() is missing argument {param!r}")
                bound[param] = default
        return bound


METHODS: dict[str, Method] = {
    # the lookups: the hook's, its prefetch's and the artifact tier's
    "lookup": Method((("env", ENV_CODEC, _REQUIRED), ("request_key", STR, _REQUIRED)), OPT_RESULT, True),
    "results_for_env": Method((("env", ENV_CODEC, _REQUIRED), ("status", OPT_STR, STATUS_OK)),
                              _listing(RESULT, "requests"), True),
    "list_results": Method((("op", OPT_STR, None), ("device", OPT_STR, None), ("limit", OPT_INT, None),
                            ("status", OPT_STR, None)), _listing(_ID_RESULT, "requests"), True),
    "kernel_configs": Method((("env", ENV_CODEC, _REQUIRED), ("prefix", STR, "")),
                             _listing(_DICT, "kernel_configs", keyed=True), True),
    "get_artifact": Method((("kind", STR, _REQUIRED), ("key", STR, _REQUIRED), ("max_bytes", INT, MAX_ARTIFACT_BYTES)),
                           OPT_ARTIFACT, True),
    "artifacts": Method((("kind", OPT_STR, None), ("device", OPT_STR, None), ("signer", OPT_STR, None),
                         ("limit", OPT_INT, 100)), _listing(Codec(_encode_info, _info), "artifacts"), True),
    # the job's writes: its misses, its write-back, its kernel configs and published artifacts
    "record_miss": Method((("env", ENV_CODEC, _REQUIRED), ("request", REQUEST, _REQUIRED), ("host", OPT_STR, None)),
                          NONE, False),
    "put_result": Method((("result", RESULT, _REQUIRED),), NONE, False),
    "put_kernel_configs": Method((("env", ENV_CODEC, _REQUIRED), ("items", CONFIGS, _REQUIRED)), INT, False),
    "put_artifact": Method((("artifact", ARTIFACT, _REQUIRED),), BOOL, False),
}


def encode_call(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], Blobs]:
    """A call as a message; AttributeError for a method the node share does not serve."""
    method = METHODS.get(name)
    if method is None:
        raise AttributeError(f"the node share serves no {name!r}")
    blobs: Blobs = []
    bound = method.bind(name, args, kwargs)
    encoded = {param: codec.encode(bound[param], blobs) for param, codec, _ in method.params}
    return {"call": name, "args": encoded}, blobs


def read_key(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """What identifies a read among a node's calls (None for a write or a call not served)."""
    method = METHODS.get(name)
    if method is None or not method.read:
        return None
    message, _ = encode_call(name, args, kwargs)
    return json.dumps(message, sort_keys=True, separators=(",", ":"))


def decode_call(message: Any, blobs: Blobs) -> tuple[str, dict[str, Any]]:
    """The method and its checked arguments; WireError for anything but a call the node share serves."""
    if not isinstance(message, dict) or message.keys() != {"call", "args"} or not isinstance(message["args"], dict):
        raise WireError("not a call")
    name = message["call"]
    method = METHODS.get(name) if isinstance(name, str) else None
    if method is None:
        raise WireError(f"{str(name)[:60]!r} is not a call the node share serves")
    if message["args"].keys() != {p[0] for p in method.params}:
        raise WireError(f"{name}'s arguments are not its parameters")
    try:
        return name, {param: codec.decode(message["args"][param], blobs) for param, codec, _ in method.params}
    except (ValueError, TypeError, KeyError) as exc:
        raise WireError(f"{name}: {exc}") from None


def encode_reply(name: str, value: Any) -> tuple[dict[str, Any], Blobs]:
    blobs: Blobs = []
    return {"ok": METHODS[name].returns.encode(value, blobs)}, blobs


def encode_error(exc: BaseException) -> dict[str, Any]:
    """An error as data: its class's name (only the cache's are raised again as such) and its message."""
    if isinstance(exc, MalformedRow):
        row_id = exc.row_id if isinstance(exc.row_id, (int, str)) else str(exc.row_id)
        return {"error": {"type": "MalformedRow", "table": exc.table, "row_id": row_id, "problem": exc.problem}}
    return {"error": {"type": type(exc).__name__, "message": str(exc)}}


# The errors raised again by name in the asking rank, as its own store would raise them.
_ERRORS: dict[str, type[CacheError]] = {cls.__name__: cls for cls in (
    CacheError, cache_errors.CacheUnavailable, cache_errors.CacheWriteRefused, cache_errors.SchemaOutdated,
    cache_errors.ReadOnlyError)}


def decode_reply(name: str, message: Any, blobs: Blobs, **context: Any) -> Any:
    """The call's answer, checked as the store checks a row; a MalformedRow for a row that fails
    (``lookup`` and ``get_artifact`` raise it, as the store does); the error local rank 0 met,
    raised again; WireError for a reply that is not one."""
    if isinstance(message, dict) and message.keys() == {"ok"}:
        return _checked_answer(name, message["ok"], blobs, **context)
    if not isinstance(message, dict) or message.keys() != {"error"} or not isinstance(message["error"], dict):
        raise WireError("not a reply")
    error = message["error"]
    if error.get("type") == "MalformedRow":
        raise MalformedRow(str(error.get("table")), str(error.get("row_id")), str(error.get("problem")))
    raise _ERRORS.get(str(error.get("type")), CacheError)(f"local rank 0: {error.get('message')}")


def _checked_answer(name: str, data: Any, blobs: Blobs, **context: Any) -> Any:
    try:
        answer = METHODS[name].returns.decode(data, blobs)
    except (ValueError, TypeError, KeyError) as exc:
        table = {"lookup": "requests", "get_artifact": "artifacts"}.get(name)
        if table is None:
            raise WireError(f"{name}'s answer: {exc}") from None
        raise MalformedRow(table, f"{context.get('row', '?')} {_FROM}", str(exc)) from None
    if name == "get_artifact" and answer is not None and len(answer.payload) > context.get("max_bytes", 0):
        raise MalformedRow("artifacts", f"{context.get('row', '?')} {_FROM}",
                           f"its payload of {len(answer.payload)} bytes is over the cap asked for")
    return answer
