"""A sweep whose last end-to-end pass was cut starts that pass again before its capture.

The pass (``autotune.sweep.end_to_end``) begins only once the sweep's GEMMs are stored, and leaves a
mark when it begins and another when it finishes (``pass_marks``). A sweep cut at a deadline
in its pass (a job's time limit) left the first mark and not the second. The next sweep of
the same model file, options and GPU captures again, finds every GEMM cached and only then
ran the pass: on GPUs the resumed ``dynamic=True`` captures of models such as T5 took half
of each call, and their passes got the rest. Such a pass now starts at once, in its own
processes, beside the capture.

What the capture finds does not wait for it: a request that is not cached (the cache was
pruned, say) is tuned as before, and the model's pass runs again after it, once this one
has ended, so that its kernels follow the new winners.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from . import pass_marks

if TYPE_CHECKING:
    from .end_to_end import EndToEndReport
    from .pass_spec import EndToEndSpec

log = logging.getLogger(__name__)


class ResumedPass:
    """The cut passes of ``specs``, run in a thread beside the sweep's capture."""

    def __init__(self, specs: list[EndToEndSpec], gpus: int, timeout: float) -> None:
        from .end_to_end import EndToEndPass

        self.digests = {pass_marks.digest(spec) for spec in specs}
        self._pass = EndToEndPass(specs, gpus)
        self._report: EndToEndReport | None = None
        self._thread = threading.Thread(target=self._run, args=(timeout,), name="resumed-pass", daemon=True)
        self._thread.start()

    def _run(self, timeout: float) -> None:
        self._report = self._pass.run(timeout)  # never raises

    def covers(self, spec: EndToEndSpec) -> bool:
        return pass_marks.digest(spec) in self.digests

    def join(self) -> EndToEndReport:
        from .end_to_end import EndToEndReport

        self._thread.join()
        return self._report or EndToEndReport(error="the resumed pass ended without a report")

    def close(self) -> None:
        """Stop it (the sweep failed): its processes are killed, what they stored stays."""
        self._pass.close()


def start_if_cut(store: object, env: object, specs: list[EndToEndSpec], gpus: int,
                 timeout: float) -> ResumedPass | None:
    """Start the passes among ``specs`` that began and never finished under ``env``; None if there are none."""
    cut = pass_marks.resumable(pass_marks.read(store, env), specs)
    if not cut:
        return None
    log.info("%d end-to-end pass(es) were cut before they finished: starting them beside capture", len(cut))
    return ResumedPass(cut, gpus, timeout)
