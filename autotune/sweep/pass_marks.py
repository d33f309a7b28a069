"""Which end-to-end passes have finished: a mark per model, filed with the kernel configs.

A sweep tunes its GEMMs, then runs the pass (``autotune.sweep.end_to_end``) that tunes the
pointwise/reduction kernels and stores the fusion and padding verdicts. A sweep cut after
its GEMMs were stored (a job's time limit, a killed process) left that pass undone, and
the next sweep found every GEMM cached, so it tuned nothing and skipped the pass: the
kernels stayed untuned, and every job tuned them at its first run (seen with the MLP-Mixer
under ``dynamic=True``). So a pass that finishes leaves a mark, and a sweep with nothing to
tune still runs the passes whose marks are missing.

A mark's key hashes what the pass compiles (the model file's bytes, its entry, batch sizes,
mode, training, Inductor options, dynamic graphs) and names its share of the kernels
(``/rank-of-count``: a pass split over GPUs finishes when every share has). It is filed under
``kernel_config_environment``, the GPU and versions, as the configs it vouches for.

A pass also leaves a mark when it begins (``/started``): the sweep that ran it had stored its
GEMMs by then. A later sweep of the same model that finds the pass begun and unfinished (cut
at a deadline) starts it again at once, beside its capture, instead of after it: a resumed
``dynamic=True`` capture can take half of a sweep's call, and a pass that waits for it may
miss the deadline again.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .pass_spec import EndToEndSpec

log = logging.getLogger(__name__)

PREFIX = "pass:"
STARTED = "started"  # the mark of a pass that began (its shares' marks read "rank-of-count")


def digest(spec: EndToEndSpec) -> str:
    """The hash of what ``spec``'s pass compiles (not where, nor which share of it)."""
    source = hashlib.sha256(Path(spec.model_path).read_bytes()).hexdigest()
    what = {"model": source, "entry": spec.entry, "batch_sizes": list(spec.batch_sizes), "mode": spec.mode,
            "inductor_config": spec.inductor_config, "train": spec.train, "dynamic": spec.dynamic}
    if spec.distributed is not None:  # a rank's graphs are not the bare model's (--ddp/--fsdp)
        what["distributed"] = spec.distributed
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:32]


def key(spec: EndToEndSpec) -> str:
    rank, count = spec.shard
    return f"{PREFIX}{digest(spec)}/{rank}-of-{count}"


def started_key(spec: EndToEndSpec) -> str:
    return f"{PREFIX}{digest(spec)}/{STARTED}"


def finished(marks: dict[str, Any], spec: EndToEndSpec) -> bool:
    """Whether some split of ``spec``'s pass has a mark for every share."""
    stem = f"{PREFIX}{digest(spec)}/"
    shares: dict[int, set[int]] = {}
    for name in marks:
        if not name.startswith(stem):
            continue
        rank, _, count = name[len(stem):].partition("-of-")
        if rank.isdigit() and count.isdigit():
            shares.setdefault(int(count), set()).add(int(rank))
    return any(ranks >= set(range(count)) for count, ranks in shares.items())


def unfinished(store: Any, env: Any, specs: list[EndToEndSpec]) -> list[EndToEndSpec]:
    """The specs whose pass has no complete mark in ``store`` under ``env``. A store that
    cannot be read counts as no marks: the pass runs, as it did before marks existed (a pass
    too many costs minutes; a skipped one costs every job)."""
    marks = read(store, env)
    return [spec for spec in specs if not finished(marks, spec)]


def resumable(marks: dict[str, Any], specs: list[EndToEndSpec]) -> list[EndToEndSpec]:
    """The specs whose pass began and never finished: their GEMMs were stored before it began."""
    return [spec for spec in specs if started_key(spec) in marks and not finished(marks, spec)]


def read(store: Any, env: Any) -> dict[str, Any]:
    """Every mark under ``env``; none when the store cannot be read (every pass is then owed, and
    none resumes before capture)."""
    try:
        return dict(store.kernel_configs(env, PREFIX))
    except Exception:
        log.warning("could not read the end-to-end passes' marks", exc_info=True)
        return {}


def mark_started(store: Any, env: Any, spec: EndToEndSpec) -> None:
    """Leave the mark of a pass that began. Never raises: without it a resumed sweep only waits longer."""
    _put(store, env, started_key(spec), spec, "began")


def mark_finished(store: Any, env: Any, spec: EndToEndSpec) -> None:
    """Leave ``spec``'s mark. Never raises: the pass's work is stored already."""
    _put(store, env, key(spec), spec, "finished")


def _put(store: Any, env: Any, name: str, spec: EndToEndSpec, what: str) -> None:
    value = {"model": Path(spec.model_path).name, "batch_sizes": list(spec.batch_sizes), "train": spec.train,
             "dynamic": spec.dynamic, "host": socket.gethostname(),
             "at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    try:
        store.put_kernel_configs(env, {name: value})
    except Exception:
        log.warning("could not mark the pass of %s %s", spec.model_path, what, exc_info=True)
