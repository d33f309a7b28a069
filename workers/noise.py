"""The noise rule: which candidate a sweep stores, given timings that carry their noise.

A candidate is timed in several rounds (``TIMING_ROUNDS`` calls of Inductor's own
benchmark, interleaved with the other candidates' so a change of load hits them alike).
Its time is the median of the rounds and its spread how far they disagree, relative to
that median. On a busy host the rounds disagree widely, and the fastest-looking candidate
is often only the luckiest one: stored, it would serve every job of the team a kernel that
may well be slower than ATen.

So a candidate other than ATen wins only when its median beats ATen's by more than the
noise of the two timings compared (the larger spread, and never less than ``NOISE_FLOOR``),
and that noise is below ``MAX_SPREAD``. Otherwise ATen is stored, with the reason
``within_noise``: do no harm. Where the runner-up is within the noise of the fastest, which
of the two equals timed luckier is chance: of the equals that beat ATen as clearly, the one
with the smallest choice hash is stored, so repeated sweeps store the same kernel and keep
the win over ATen (storing ATen there would throw away a clear win, and an exhaustive search
finds many such equals).

A busy CPU host (other processes' threads ready to run on every core while the candidates are
timed) stalls the timing threads for whole scheduler slices: every candidate then measures
alike, milliseconds for a microsecond kernel, and the rounds can agree by chance. There the
noise is at least ``BUSY_FLOOR``, and ATen stored only for it says ``busy_host``. Pure: no
database, device or Ray.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from autotune.cache.records import FALLBACK_BUSY_HOST, FALLBACK_WITHIN_NOISE, CandidateResult

T = TypeVar("T")  # a choice: Inductor's object in the tuning compile, its hash in tests

# Rounds of Inductor's benchmark per candidate: enough for a median and a spread.
TIMING_ROUNDS = 3
# The least noise a comparison assumes, whatever the rounds say: a few rounds can agree
# by chance, and a difference this small is not worth a kernel other than ATen.
NOISE_FLOOR = 0.03
# Rounds that disagree by more than the time itself measured nothing: however far ahead a
# candidate looks then, ATen is stored.
MAX_SPREAD = 1.0
# Other processes' ready threads per core, while timing, from which a CPU host is busy.
BUSY_LOAD = 1.0
# The least noise a comparison assumes on a busy CPU host.
BUSY_FLOOR = 0.5


@dataclass(frozen=True)
class Timed:
    """One candidate's timing: the median of its rounds and their relative spread
    (None where unknown, read as ``NOISE_FLOOR``)."""

    choice: str  # choice hash
    aten: bool
    median_ms: float
    spread: float | None = None


@dataclass(frozen=True)
class Decision:
    """The candidate to store, why ATen was stored instead of a faster-looking one (or
    None), and the noise the decision was made under."""

    winner: str
    fallback_reason: str | None
    noise: float


def summarize(rounds: Iterable[float]) -> tuple[float, float | None, int]:
    """The median, spread ((max - min) / median) and count of a candidate's timed rounds.

    A round that failed (infinite or NaN) is left out; with none left the median is +inf
    (failed). One round has no spread (None)."""
    finite = [t for t in rounds if math.isfinite(t) and t >= 0]
    if not finite:
        return math.inf, None, 0
    median = statistics.median(finite)
    if len(finite) < 2:
        return median, None, 1
    spread = (max(finite) - min(finite)) / median if median > 0 else 0.0
    return median, spread, len(finite)


def choose(rows: Sequence[Timed], floor: float = NOISE_FLOOR) -> Decision | None:
    """The noise rule over every candidate's timing; None when none has a finite time."""
    timed = sorted((r for r in rows if math.isfinite(r.median_ms)), key=lambda r: (r.median_ms, r.choice))
    if not timed:
        return None
    fastest = timed[0]
    aten = next((r for r in timed if r.aten), None)
    if aten is None or fastest.aten:  # nothing to fall back to, or ATen won outright
        rival = timed[1] if len(timed) > 1 else None
        return Decision(fastest.choice, None, _noise(fastest, rival, floor))
    noise = max(_noise(fastest, r, floor) for r in (aten, timed[1]))
    if not _clearly_faster(fastest, aten, floor):
        return Decision(aten.choice, FALLBACK_WITHIN_NOISE, noise)
    # The fastest's equals (within the noise of it) that beat ATen as clearly: which of them
    # timed luckiest is chance, so the same one of them is stored every time (the smallest
    # choice hash), and a clear win over ATen is kept.
    equals = [r for r in timed if not r.aten and not _clearly_faster(fastest, r, floor)
              and _clearly_faster(r, aten, floor)]
    return Decision(min(equals, key=lambda r: r.choice).choice, None, noise)


def runs_first(timings: dict[T, float], chosen: T | None) -> dict[T, float]:
    """``timings`` with ``chosen`` fastest: Inductor runs the fastest time it is handed, so the
    tuning compile's graph, and the numerical check of its output, get the choice the rule stores."""
    return {**timings, chosen: 0.0} if chosen is not None else timings


def choose_busy(rows: Sequence[Timed], busy: bool) -> Decision | None:
    """``choose`` with ``BUSY_FLOOR`` where the host was busy; ATen stored only for the busy
    floor (the quiet one would have stored another) says ``busy_host``."""
    quiet = choose(rows)
    if not busy or quiet is None:
        return quiet
    decision = choose(rows, BUSY_FLOOR)
    if decision is not None and decision.fallback_reason is not None and quiet.fallback_reason is None \
            and quiet.winner != decision.winner:
        return Decision(decision.winner, FALLBACK_BUSY_HOST, decision.noise)
    return decision


def choose_candidate(candidates: Iterable[CandidateResult], busy: bool = False) -> Decision | None:
    """``choose_busy`` over a result's candidates (those without a time are left out)."""
    return choose_busy([Timed(c.choice_hash, c.kind == "aten", c.time_ms, c.spread)
                        for c in candidates if c.time_ms is not None], busy)


def is_busy(device: str, others_per_core: float | None) -> bool:
    """A CPU host with other processes ready to run on every core while it timed. GPU timings
    are kernel-bound (inductor_glue/timing.py): a busy CPU beside them does not count."""
    return device == "cpu" and others_per_core is not None and others_per_core >= BUSY_LOAD


def _noise(a: Timed, b: Timed | None, floor: float) -> float:
    spreads = [s for s in (a.spread, b.spread if b is not None else None) if s is not None]
    return max([floor, *spreads])


def _clearly_faster(fast: Timed, slow: Timed, floor: float) -> bool:
    noise = _noise(fast, slow, floor)
    return noise < MAX_SPREAD and slow.median_ms > fast.median_ms * (1.0 + noise)
