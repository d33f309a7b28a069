"""When a model's end-to-end pass may start: once every GEMM request its capture found is answered.

A pass compiles its model with the stored GEMM winners, so it waits for those, and for no
other model's: the passes of models whose requests are answered run on the GPUs while the
rest of the queue is still being tuned (autotune/sweep/end_to_end.py ``EndToEndPass``). The sweep
tells this what capture found and what tuning answered; the pass's lanes ask it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence


class ModelReadiness:
    """Each model's unanswered requests. Thread-safe: capture and tuning report on the sweep's
    thread, the pass's lanes wait on theirs."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._pending: dict[str, set[str]] = {}  # model -> request keys queued and not yet answered
        self._captured: set[str] = set()
        self._skipped: set[str] = set()  # nothing for their pass to do
        self._everything = False  # tuning ended: every pass may go

    def needs(self, model: str, key: str, pending: bool = True) -> None:
        """``model``'s capture found ``key``, which this sweep queued (by it or by an earlier
        model): its pass waits for it while ``pending``, and has new winners to compile with."""
        with self._changed:
            keys = self._pending.setdefault(model, set())
            if pending:
                keys.add(key)

    def waits_on(self, key: str) -> bool:
        """Whether some model still waits for ``key`` (queued and not answered)."""
        with self._changed:
            return any(key in keys for keys in self._pending.values())

    def captured(self, model: str) -> None:
        """Capture of ``model`` is complete: no request of it is left to be found."""
        with self._changed:
            self._captured.add(model)
            self._changed.notify_all()

    def skip(self, model: str) -> None:
        """Capture of ``model`` is complete and its pass has nothing to do (every GEMM was
        cached, and its last pass finished): its lane drops it."""
        with self._changed:
            self._captured.add(model)
            self._skipped.add(model)
            self._changed.notify_all()

    def skipped(self, model: str) -> bool:
        with self._changed:
            return model in self._skipped

    def found_new(self, model: str) -> bool:
        """Whether ``model``'s capture queued anything, or found a request another model queued."""
        with self._changed:
            return model in self._pending

    def answered(self, key: str) -> None:
        """Tuning ended for ``key`` (stored, failed, or left to another sweep)."""
        with self._changed:
            for keys in self._pending.values():
                keys.discard(key)
            self._changed.notify_all()

    def release(self) -> None:
        """Tuning is over, however it ended: no pass waits any longer."""
        with self._changed:
            self._everything = True
            self._changed.notify_all()

    def ready(self, model: str) -> bool:
        with self._changed:
            return self._ready(model)

    def first_ready(self, models: Sequence[str], timeout: float) -> int | None:
        """The index of the first model of ``models`` that is ready, waiting up to ``timeout``
        seconds for one to be; None if none is by then."""
        with self._changed:
            self._changed.wait_for(lambda: any(self._ready(m) for m in models), timeout=timeout)
            return next((i for i, model in enumerate(models) if self._ready(model)), None)

    def _ready(self, model: str) -> bool:
        """Ready to be taken: to run, or (skipped) to be dropped."""
        return self._everything or (model in self._captured and not self._pending.get(model))
