"""What the cache commands list, as plain text and plain data: each row's JSON summary, the
cells of a listing, and the widths that fit its columns to a terminal.

Pure: no console, no click; the CLI (cli.py) prints what these return. Cells hold stored text
as it is: the CLI escapes each one's control characters (``cache.text.escape_control``) before
it fits the columns and prints them, as it does every value it prints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from autotune.cache import ArtifactInfo, MissRecord, TuningResult
from autotune.shapes import shape_summary


def winner_label(result: TuningResult) -> str:
    winner = result.winner
    return "-" if winner is None else f"{winner.name} {winner.description}".strip()


def status_label(result: TuningResult) -> str:
    """The status, with the noise the winner was chosen under (``TuningResult.winner_spread``,
    the spread of the timed rounds) as ±percent, and marked where ATen was stored though
    another candidate looked faster (``ok ±40%, aten: within noise``)."""
    spread = result.winner_spread
    label = result.status if spread is None else f"{result.status} ±{spread * 100:.0f}%"
    return label if result.fallback_reason is None else f"{label}, aten: {result.fallback_reason.replace('_', ' ')}"


def result_summary(row_id: int, result: TuningResult) -> dict[str, Any]:
    winner = result.winner
    return {
        "id": row_id,
        "op": result.request.op,
        "shapes": shape_summary(result.request),
        "device": result.env.device_name,
        "torch_version": result.env.torch_version,
        "status": result.status,
        "winner": None if winner is None else winner.name,
        "winner_description": None if winner is None else winner.description,
        "winner_time_ms": None if winner is None else winner.time_ms,
        "aten_time_ms": result.aten_time_ms,
        "speedup_over_aten": result.speedup_over_aten,
        "winner_spread": result.winner_spread,
        "fallback_reason": result.fallback_reason,
        "search": result.provenance.search,
        "key": result.request.key,
    }


def fmt_bytes(value: int | None) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def fmt_age(created_at: datetime) -> str:
    seconds = max(0.0, (datetime.now(timezone.utc) - created_at).total_seconds())
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds // length:.0f}{unit}"
    return f"{seconds:.0f}s"


def short_key(key: str, width: int = 40) -> str:
    # Both ends: Inductor's keys differ in their hash, which may sit at either end.
    if len(key) <= width:
        return key
    head = (width - 1) // 2
    return f"{key[:head]}…{key[-(width - 1 - head):]}"


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def short_device(name: str, width: int) -> str:
    """A device name cut to ``width``: its vendor's name goes first ("NVIDIA <model>")."""
    if len(name) > width:
        name = name.split(" ", 1)[-1] if name.split(" ", 1)[0] in ("NVIDIA", "AMD", "Intel(R)") else name
    return clip(name, width)


@dataclass(frozen=True)
class Column:
    """A column of a listing: ``least``, the width it may be cut to (``cut``) so that a row
    fits the terminal; None: never cut."""

    header: str
    right: bool = False
    least: int | None = None
    cut: Callable[[str, int], str] = clip


def fit_widths(columns: list[Column], rows: list[list[str]], width: int) -> list[int]:
    """Each column's width: its widest cell, less what the rows must lose to fit ``width``,
    taken one character at a time from the column that has the most to spare."""
    widths = [max([len(c.header)] + [len(row[i]) for row in rows]) for i, c in enumerate(columns)]
    excess = sum(widths) + 2 * (len(columns) - 1) - width
    while excess > 0:
        spare = [(widths[i] - c.least, i) for i, c in enumerate(columns) if c.least is not None]
        most, widest = max(spare, default=(0, -1))
        if most <= 0:
            break  # cut as far as they go: a narrower terminal wraps
        widths[widest] -= 1
        excess -= 1
    return widths


def artifact_summary(info: ArtifactInfo) -> dict[str, Any]:
    return {
        "id": info.id,
        "kind": info.kind,
        "key": info.key,
        "size": info.size,
        "digest": info.digest,
        "signer": info.signer,
        "torch_version": info.torch_version,
        "device": info.device,
        "host": info.host,
        "created_at": info.created_at.isoformat(),
    }


def miss_summary(miss: MissRecord) -> dict[str, Any]:
    return {
        "op": miss.request.op,
        "shapes": shape_summary(miss.request),
        "device": miss.env.device_name,
        "count": miss.count,
        "first_seen": miss.first_seen.isoformat(),
        "last_seen": miss.last_seen.isoformat(),
        "host": miss.host,
        "key": miss.request.key,
    }
