"""The Ray actor: one per GPU (or ``--workers N`` on CPU), tuning ``lanes`` requests at once.

The actor hands each job to a long-lived child process (see ``child.py``), so a
request costs a compile, not an interpreter start; each request still runs in
fresh Inductor state and cache dirs (see ``tune_request``). A job that crashes
or hangs the child becomes a failed result and the next job gets a new child.
With several lanes (a threaded actor, one call per lane at a time) each lane has
a child of its own: while one child compiles its request's candidates on the
CPU, another times its own on the GPU; the GPU timings take turns
(``inductor_glue/gpu_lock.py``), so no candidate is timed beside another's kernels.
The actor stores every result the moment it has it, so an interrupted sweep
resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.cache.protocols import Store
    from autotune.cache.records import Environment, TuningResult


log = logging.getLogger(__name__)


class TuningWorker:
    """Tunes jobs (plain JSON) and stores each result at once."""

    def __init__(self, store: Store | None, device: str, timeout: float = 600.0, lanes: int = 1,
                 spares: str | None = None, fault: str = "", log_path: str | None = None) -> None:
        from .child import ChildTuner

        _log_to(log_path)  # first: the children started below inherit it
        self.store = store
        self.device = device
        self.timeout = timeout
        self.spares = spares  # a local sweep's spare children (spares.py), adopted by the lanes
        self.fault = fault  # tests of the failure path (faults.py), handed to the child with each job
        # Each call takes a child that no other call holds, and gives it back.
        self.children: queue.SimpleQueue[ChildTuner] = queue.SimpleQueue()
        for _ in range(max(1, lanes)):
            self.children.put(ChildTuner(timeout))
        logging.basicConfig(level=logging.WARNING)

    @contextlib.contextmanager
    def _child(self) -> Iterator[Any]:
        child = self.children.get()
        try:
            yield child
        finally:
            self.children.put(child)

    def warm(self) -> dict[str, Any]:
        """Start and warm one child before any job arrives (the pool calls this once per
        lane at creation, so the lanes' children start side by side).

        Never raises: a child that dies here is replaced by the first job, as before.
        """
        from .child import ChildDied

        self._open_store()
        node = _node_id()
        with self._child() as child:
            try:
                adopted = self._adopt_spare(child)
                seconds = adopted if adopted is not None else child.warm(self.device)["warm_seconds"]
                return {"ok": True, "seconds": seconds, "node": node, "adopted": adopted is not None}
            except ChildDied as died:
                log.warning("warming the tuning process failed: %s", died)
                return {"ok": False, "error": str(died), "node": node}

    def _adopt_spare(self, child: Any) -> float | None:
        """Warm a spare that the sweep started before Ray, pinned to this actor's GPU; its
        warm-up seconds, or None when there is none (or it could not be pinned)."""
        import os

        from .spares import claim

        if child.proc is not None or (home := claim(self.spares)) is None or not child.adopt(home):
            return None
        visible = os.environ.get("CUDA_VISIBLE_DEVICES") if self.device == "cuda" else None
        answer = child.warm(self.device, visible)
        if answer["pinned"]:
            return float(answer["warm_seconds"])
        log.warning("a spare tuning process could not be moved to GPU %s; starting one here", visible)
        child.close()
        return None

    def _open_store(self) -> None:
        """Connect and check the schema now, while the sweep captures, not at the first write."""
        if self.store is None:
            return
        try:
            self.store.connect()
        except Exception:  # the first job's write will report a real problem
            log.debug("could not open the cache while warming up", exc_info=True)

    def tune(self, job_json: dict[str, Any]) -> dict[str, Any]:
        from autotune.cache.records import TuningResult

        from .child import ChildDied
        from .faults import FAULT_KEY
        from .jobs import TuneJob, failed_result

        job = TuneJob.from_json(job_json)
        message = {**job_json, FAULT_KEY: self.fault} if self.fault else job_json
        with self._child() as child:
            try:
                result = TuningResult.from_json(child.tune(message))
            except ChildDied as died:
                result = failed_result(job, str(died), died.kind, self.timeout)
        reply = result.to_json()
        if self.store is not None:
            error = store_result(self.store, result)
            if error is not None:
                reply[STORE_ERROR_KEY] = error
        return reply


def _log_to(path: str | None) -> None:
    """Send this actor's output, and its tuning children's (Inductor's tables, torch's
    warnings), to the sweep's log file rather than Ray's worker logs. Only where that file's
    directory exists: a node of a cluster without it keeps Ray's logs."""
    import os

    if not path or not os.path.isdir(os.path.dirname(path) or "."):
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        log.debug("cannot open the sweep's log %s; keeping Ray's", path, exc_info=True)
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


# A reply carries this key when its result could not be stored; the pool stops then.
STORE_ERROR_KEY = "_store_error"


def store_result(store: Store, result: TuningResult) -> str | None:
    """Store one result; the store's one-line message if it could not (after its own
    retries), else None. Never raises for cache errors: the sweep decides what to do."""
    from autotune.cache.errors import CacheError

    try:
        store.put_result(result)
    except CacheError as error:
        log.warning("could not store the result of %s: %s", result.request.op, error)
        return str(error)
    return None


def _node_id() -> str | None:
    """The Ray node this actor runs on (None outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:
        return None


def remote_capture(model_source: str, model_name: str, kwargs: dict[str, Any],
                   store: Store | None = None) -> dict[str, Any]:
    """Capture on a Ray worker that has the target device (the sweep host may not).

    Padding verdicts are filed under the GPU's own environment, which only this node can
    name: capture pads as the verdicts stored in ``store`` say (as a local capture does),
    and the new ones come back with that environment, for the sweep to store."""
    import tempfile
    from pathlib import Path

    from autotune.inductor_glue import padding
    from autotune.inductor_glue.capture import capture_file

    pad_env = padding.filed_under(kwargs.get("device", "cuda"))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / model_name
        path.write_text(model_source)
        result = capture_file(str(path), pad_decisions=_stored_pad_decisions(store, pad_env), **kwargs)
    return {
        "env": result.env.to_json() if result.env else None,
        "requests": [r.to_json() for r in result.requests],
        "config_overrides": result.config_overrides,
        "mode": result.mode,
        "device": result.device,
        "seconds": result.seconds,
        "total_lookups": result.total_lookups,
        "pad_decisions": result.pad_decisions,
        "pad_env": pad_env.to_json() if pad_env is not None else None,
    }


def _stored_pad_decisions(store: Store | None, env: Environment | None) -> dict[str, dict[str, Any]]:
    """The padding verdicts stored for ``env``; none when the cache cannot be read from here
    (capture then times its own, as on a fresh cache)."""
    if store is None:
        return {}
    from autotune.inductor_glue import padding

    try:
        return padding.stored_decisions(store, env)
    except Exception as exc:
        log.warning("remote capture could not read the stored padding verdicts (%s); timing its own", exc)
        return {}
