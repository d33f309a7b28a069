"""In-graph verdicts: the end-to-end pass times each GEMM's served choices in the graph's process.

On GPUs Inductor settles a template's epilogue and prologue fusions in the scheduler: it
benchmarks the fused template now and compares it with the choices' timings plus the
neighbouring kernel alone. Cold max-autotune measures all three in one process. A job
served from the cache compares stored timings, taken by a sweep worker in a one-op graph in
another process, with fresh ones. And the one-op timing is not always the graph's: on GPUs
(torch 2.11) a training step's backward GEMMs each won as a Triton template alone, while in the
graph's process cuBLAS beat most of them.

So the sweep's end-to-end pass times, in its own process and as cold max-autotune does, the
choices a job weighs for each stored request (ATen and the pinned winner), and stores that
verdict: those candidates' times, and the winner between them. The publishing compile and
every job served from the data tier then weigh the same figures, and decide alike.

Where ATen won alone, the pass times the fastest Triton config beside it (the worker has
checked its numbers alone: workers/tune.py). With ATen's calls alone, the graph's process
once chose between two of them: on a GPU it timed cuBLAS's bias epilogue much slower than
alone, and took plain ``addmm``, whose bias copy cost more in the graph than either, so the
transformer ran slower than cold; cold max-autotune took a template there.

Both the worker and the pass time kernel-bound (inductor_glue/timing.py): Inductor's own
figures for a call that is slow to launch, such as cuBLAS's bias epilogue, counted the launch
while a compile ran beside them, and came out far slower than alone; with the launch left out,
worker and pass agree on the transformer.

Pure: no database, no Inductor. ``ServePolicy`` (autotune/job/serve_policy.py) feeds it and stores the result.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from autotune.cache.records import TuningResult
from autotune.shapes import shape_summary

SOURCE = "in_graph"  # Provenance.source of a result rewritten with its in-graph verdict


@dataclass(frozen=True)
class Verdict:
    """One request timed in the graph's process: what the job will weigh from now on."""

    result: TuningResult  # the stored result with the in-graph times and winner
    isolated: dict[str, float]  # choice name -> ms as the sweep's worker timed it
    in_graph: dict[str, float]  # choice name -> ms as the end-to-end pass timed it
    winner_before: str | None
    winner_after: str

    @property
    def changed(self) -> bool:
        return self.winner_before != self.winner_after

    def to_json(self) -> dict[str, Any]:
        return {
            "request": shape_summary(self.result.request),
            "request_key": self.result.request.key,
            "isolated_ms": self.isolated,
            "in_graph_ms": self.in_graph,
            "winner_before": self.winner_before,
            "winner_after": self.winner_after,
            "changed": self.changed,
        }


def verdict(stored: TuningResult, timed: dict[str, float]) -> Verdict | None:
    """``stored`` with the candidates in ``timed`` (choice hash -> ms, measured in the
    graph's process) given those times, and the fastest of them as the winner.

    None when fewer than two known candidates were timed: there was nothing to weigh.
    Only the timed candidates compete, since the others' stored times come from another
    process and are not comparable with these.
    """
    names = {c.choice_hash: c.name for c in stored.candidates}
    finite = {h: ms for h, ms in timed.items() if h in names and math.isfinite(ms)}
    if len(finite) < 2:
        return None
    winner = min(finite, key=lambda h: (finite[h], h))
    candidates = tuple(dataclasses.replace(c, time_ms=finite[c.choice_hash]) if c.choice_hash in finite else c
                       for c in stored.candidates)
    result = dataclasses.replace(stored, candidates=candidates, winner_hash=winner,
                                 provenance=dataclasses.replace(stored.provenance, source=SOURCE))
    isolated = {c.name: c.time_ms for c in stored.candidates if c.choice_hash in finite and c.time_ms is not None}
    before = stored.winner.name if stored.winner is not None else None
    return Verdict(result, isolated, {names[h]: ms for h, ms in finite.items()}, before, names[winner])
