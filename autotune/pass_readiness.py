"""When a model's end-to-end pass may start: once every GEMM request its capture found is answered.

A pass compiles its model with the stored GEMM winners, so it waits for those, and for no
other model's: the passes of models whose requests are answered run on the GPUs while the
rest of the queue is still being tuned (autotune/pointwise.py ``PointwisePass``). The sweep
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
        self._everything = False  # tuning ended: every pass may go

    def needs(self, model: str, key: str) -> None:
        """``model``'s capture found ``key``, which is queued (by it or by an earlier model)."""
        with self._changed:
            self._pending.setdefault(model, set()).add(key)

    def waits_on(self, key: str) -> bool:
        """Whether some model still waits for ``key`` (queued and not answered)."""
        with self._changed:
            return any(key in keys for keys in self._pending.values())

    def captured(self, model: str) -> None:
        """Capture of ``model`` is complete: no request of it is left to be found."""
        with self._changed:
            self._captured.add(model)
            self._changed.notify_all()

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
        return self._everything or (model in self._captured and not self._pending.get(model))
