"""What a stored record may hold: one set of checks for the lines an import reads
(``cache/jsonl.py``) and the rows the store reads back (``cache/store/_rows.py``), so that
a hostile value is refused wherever it comes from. Each check raises ValueError with a
message naming the field (``where``) and what is wrong with it.
"""

from __future__ import annotations

import math
from typing import Any

# A field's accepted types (NULL, JSON's null, where it may be null).
Spec = dict[str, tuple[tuple[type, ...], bool]]  # name -> (types, required)
NULL = type(None)
_STR, _OPT_STR = (str,), (str, NULL)
_NUM_OR_NULL = (int, float, NULL)

ENV: Spec = {
    "device_kind": (_STR, True),
    "device_name": (_STR, True),
    "torch_version": (_STR, True),
    "triton_version": (_OPT_STR, True),
    "cuda_version": (_OPT_STR, True),
    "system_hash": (_STR, True),
    "config_fingerprint": (_STR, True),
    "config": ((dict,), False),
}
REQUEST: Spec = {
    "op": (_STR, True),
    "inputs_key": (_STR, True),
    "precision": (_STR, True),
    "inputs": ((list,), False),
    "params": ((dict,), False),
    "choice_hashes": ((list,), False),
}
LAYOUT: Spec = {
    "sizes": ((list,), True),
    "strides": ((list,), True),
    "offset": ((int,), True),
    "dtype": (_STR, True),
    "device": (_STR, True),
    "symbolic": ((list,), False),
    "exprs": ((list,), False),
    "alias": ((int, NULL), False),
    "constant": ((bool,), False),
}
CANDIDATE: Spec = {
    "choice_hash": (_STR, True),
    "kind": (_STR, True),
    "name": (_STR, True),
    "description": (_STR, False),
    "template_id": (_OPT_STR, False),
    "params": ((dict,), False),
    "time_ms": (_NUM_OR_NULL, False),
    "failure_kind": (_OPT_STR, False),
    "failure_message": (_OPT_STR, False),
    "spread": (_NUM_OR_NULL, False),
    "repeats": ((int, NULL), False),
}
PROVENANCE: Spec = {
    "created_at": (_STR, True),
    "host": (_STR, False),
    "sweep_id": (_OPT_STR, False),
    "tuning_seconds": (_NUM_OR_NULL, False),
    "source": (_STR, False),
    "search": (_STR, False),
}
RESULT: Spec = {
    "env": ((dict,), True),
    "request": ((dict,), True),
    "candidates": ((list,), True),
    "winner_hash": (_OPT_STR, False),
    "status": (_STR, False),
    "validation": ((dict, NULL), False),
    "error": (_OPT_STR, False),
    "provenance": ((dict,), True),
    "fallback_reason": (_OPT_STR, False),
}

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", dict: "an object", list: "a list", bool: "a boolean",
               NULL: "null"}


def check(obj: Any, spec: Spec, where: str) -> None:
    """``obj`` is a dict holding only the fields of ``spec``, each of an accepted type."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where} must be a JSON object, got {json_type(obj)}")
    if not obj.keys() <= spec.keys():
        raise ValueError(f"{where} has unknown field {sorted(obj.keys() - spec.keys())[0]!r}")
    check_fields(obj, spec, where)


def check_fields(obj: dict[str, Any], spec: Spec, where: str) -> None:
    """The fields of ``spec`` in ``obj`` (which may hold others) are of an accepted type, and the
    required ones are there. Plain isinstance calls: it runs on the hook's lookup path."""
    for name, (types, required) in spec.items():
        if name in obj:
            value = obj[name]
            # A bool is an int to isinstance: it passes only where the spec names bool.
            if (value.__class__ is bool and bool not in types) or not isinstance(value, types):
                expected = " or ".join(_TYPE_NAMES[t] for t in types)
                raise ValueError(f"{where}.{name} must be {expected}, got {json_type(value)}")
        elif required:
            raise ValueError(f"{where} is missing required field {name!r}")


def check_request(request: Any, where: str = "request") -> None:
    """A request's fields, its input layouts and its candidate set."""
    check(request, REQUEST, where)
    for i, layout in enumerate(request.get("inputs", [])):
        check(layout, LAYOUT, f"{where}.inputs[{i}]")
        for name in ("sizes", "strides", "symbolic"):
            if not all(is_int(v) for v in layout.get(name, ())):
                raise ValueError(f"{where}.inputs[{i}].{name} must be a list of integers")
        if not all(isinstance(e, str) for e in layout.get("exprs", ())):
            raise ValueError(f"{where}.inputs[{i}].exprs must be a list of strings")
        alias = layout.get("alias")
        if alias is not None and not 0 <= alias < i:  # a worker indexes the request's inputs with it
            raise ValueError(f"{where}.inputs[{i}].alias must name an earlier input (0 to {i - 1}), got {alias}")
    if not all(isinstance(h, str) for h in request.get("choice_hashes", [])):
        raise ValueError(f"{where}.choice_hashes must be a list of strings")


def stored_time_ms(value: Any, where: str) -> float | None:
    """A candidate's stored time in ms: a number >= 0, or None when it failed. +inf also says
    "failed" (Inductor's own mark) and reads as None; NaN, -inf, a negative number or any
    other type is no time, and Inductor handed such a timing fails the whole compile."""
    if value is None:
        return None
    if value.__class__ is bool or not isinstance(value, (int, float)):
        raise ValueError(f"{where} is {json_type(value)} ({value!r}), not a time in ms")
    if value == math.inf:
        return None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{where} is {value!r}, not a time in ms")
    return float(value)


def stored_spread(value: Any, where: str) -> float | None:
    """A timing's spread (relative to its median): a finite number >= 0, or None when unknown.
    NaN, infinity or a negative number would make any difference look like noise, or none."""
    if value is None:
        return None
    if value.__class__ is bool or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{where} is {value!r}, not a spread (a finite number >= 0)")
    return float(value)


def stored_repeats(value: Any, where: str) -> int | None:
    """How many rounds a timing took: an integer >= 1, or None when unknown."""
    if value is None:
        return None
    if not is_int(value) or value < 1:
        raise ValueError(f"{where} is {value!r}, not a number of rounds (an integer >= 1)")
    return int(value)


def check_timed(ok: bool, times: list[float | None]) -> None:
    """A result of status ok times at least one of its candidates (``times``: each candidate's
    time as ``stored_time_ms`` read it): Inductor handed no time for any choice fails the compile."""
    if ok and all(t is None for t in times):
        raise ValueError("its status is ok, yet no candidate has a time (each is null or infinite)")


def check_kernel_config(key: Any, value: Any) -> None:
    """A kernel config's key and value: a key is a path under Inductor's cache dir or a verdict's
    name, so a NUL in it could never name a file; a value is a JSON object."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"key is {key!r:.60}, not a non-empty string")
    if "\0" in key:
        raise ValueError(f"key {key!r:.60} holds a NUL byte")
    if not isinstance(value, dict):
        raise ValueError(f"value is {json_type(value)}, not a JSON object")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    for t, name in _TYPE_NAMES.items():
        if isinstance(value, t):
            return name
    return type(value).__name__
