"""One sweep's shared state: what the runner's parts (capture, planning, tuning, the passes) read
and add to. Plain data and one method, so that each part depends on it and on none of the others.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.settings import Settings

from .pass_readiness import ModelReadiness
from .report import Progress, SweepOptions, SweepReport
from .strategy import SweepStrategy

if TYPE_CHECKING:
    from .queue import SweepQueue


@dataclass
class SweepContext:
    """What one sweep was asked (options, settings), where it runs, what it decided and found."""

    options: SweepOptions
    settings: Settings
    progress: Progress
    store: Any
    device: str
    strategy: SweepStrategy  # what to tune and which passes are owed; the runner runs what it decides
    report: SweepReport
    started: float  # the sweep's start, which the report's milestones count from
    readiness: ModelReadiness = field(default_factory=ModelReadiness)  # which models' passes may start
    queue: SweepQueue | None = None  # None: a dry run, which plans and queues nothing
    found_in: dict[str, str] = field(default_factory=dict)  # request key -> the first model whose capture found it
    queued_keys: set[str] = field(default_factory=set)  # request keys this sweep queued

    def mark(self, milestone: str) -> None:
        self.report.mark(milestone, time.perf_counter() - self.started)
