"""Padding verdicts: whether Inductor pads a matmul's sizes, decided once.

Before lowering, Inductor's ``pad_mm`` pass may pad a GEMM whose sizes are not aligned
(K = 196 to 200, say). On GPUs it decides by timing the padded GEMM against the original
(``should_pad_bench``) and keeps the answer in a file of the node's cache dir. A process
with fresh caches times it again, and close calls flip: on GPUs the MLP-Mixer's sweep
captured a GEMM unpadded while its warm start padded it, a request the sweep never saw: a
miss, a GEMM tuned, and the pointwise kernels around it tuned again. GPT-2's and the
Mixer's unexplained benchmarker calls at warm start (two timings per verdict) were these.

So the sweep's pass records each verdict Inductor reaches, and a job serves it from the
store before Inductor looks in its own file: the same graph as the pass, no timing. The
key is Inductor's own (sizes, strides, dtypes, op, TF32), which holds nothing of a node.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from autotune.cache.records import Environment, digest

from . import seams
from .fusion import DecisionBook
from .patching import StackedPatch

log = logging.getLogger(__name__)

PREFIX = "pad_mm:"


def decision_key(inductor_key: str) -> str:
    return PREFIX + digest(inductor_key)[:40]


def filed_under(device: str) -> Environment | None:
    """The environment this node's padding verdicts are filed under (its GPU and versions);
    None on a CPU, where Inductor times no padding."""
    if device != "cuda":
        return None
    from .env import kernel_config_environment

    return kernel_config_environment(device)


def stored_decisions(store: Any, env: Environment | None) -> dict[str, dict[str, Any]]:
    """The verdicts stored under ``env`` (none for None): a capture pads as they say."""
    return store.kernel_configs(env, PREFIX) if env is not None else {}


def _patched_get(original: Any, patch: StackedPatch[DecisionBook]) -> Any:
    def get_cached_should_pad(key: str) -> Any:
        book = patch.top
        try:
            stored = book.stored(decision_key(key)) if book is not None else None
        except Exception:  # the cache never breaks a compile: Inductor decides as it would have
            log.debug("could not read a padding verdict", exc_info=True)
            stored = None
        if book is not None and isinstance(stored, dict) and isinstance(stored.get("pad"), bool):
            book.served(decision_key(key))
            return stored["pad"]
        return original(key)

    return get_cached_should_pad


def _patched_set(original: Any, patch: StackedPatch[DecisionBook]) -> Any:
    def set_cached_should_pad(key: str, value: bool) -> Any:
        outcome = original(key, value)
        book = patch.top
        if book is not None:
            try:
                book.record(decision_key(key), {"pad": bool(value), "key": key})
            except Exception:  # keeping a copy must never break the compile
                log.debug("could not record a padding verdict", exc_info=True)
        return outcome

    return set_cached_should_pad


_GET: StackedPatch[DecisionBook] = StackedPatch(seams.PAD_GET, _patched_get)
_SET: StackedPatch[DecisionBook] = StackedPatch(seams.PAD_SET, _patched_set)


def push(book: DecisionBook) -> None:
    """Serve and record padding verdicts through ``book`` from now on."""
    _GET.push(book)
    _SET.push(book)


def pop() -> None:
    _GET.pop()
    _SET.pop()


class MemoryBook:
    """Verdicts kept in memory: the sweep's capture serves those stored by an earlier sweep
    and keeps the ones it times (``new``), which the sweep then stores, so that its pass and
    every job pad as the capture did and look up the requests it found."""

    def __init__(self, stored: dict[str, dict[str, Any]] | None = None) -> None:
        self.values: dict[str, dict[str, Any]] = dict(stored or {})
        self.new: dict[str, dict[str, Any]] = {}

    def stored(self, key: str) -> dict[str, Any] | None:
        return self.values.get(key)

    def record(self, key: str, value: dict[str, Any]) -> None:
        self.values[key] = self.new[key] = value

    def served(self, key: str) -> None:
        pass


class _AsRecorded:
    """No padding, ever: a worker's one-op graph is built from the sizes capture recorded,
    padded already where the model's graph was; padding it again, or padding what the graph
    did not, made a request the worker could not match (the MLP-Mixer's ``addmm`` came back
    padded from the worker: ``key_mismatch``)."""

    def stored(self, key: str) -> dict[str, Any] | None:
        return {"pad": False}

    def record(self, key: str, value: dict[str, Any]) -> None:
        pass

    def served(self, key: str) -> None:
        pass


@contextlib.contextmanager
def as_recorded() -> Iterator[None]:
    """Compile without padding any matmul (see ``_AsRecorded``)."""
    push(_AsRecorded())
    try:
        yield
    finally:
        pop()
