"""What an end-to-end pass is asked to do, as plain data: it travels in argv to the pass's process.

Beneath the pass (end_to_end.py) and its marks (pass_marks.py), which both name it, so that
neither imports the other for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class EndToEndSpec:
    """Everything the process needs, as plain data (it travels in argv)."""

    model_path: str
    entry: str
    batch_sizes: list[int | None]
    mode: str
    inductor_config: dict[str, Any]
    train: bool
    cache: str | None
    device: str = "cuda"
    signing_key: str | None = None
    shard: list[int] = field(default_factory=lambda: [0, 1])  # [rank, count]: tune only this share
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES of the process (None: as the sweep's)
    # Time the served GEMMs in the graph and store the verdicts (None: on a GPU, unsharded,
    # unless AUTOTUNE_TIME_IN_GRAPH=0).
    time_in_graph: bool | None = None
    dynamic: bool = False  # the sweep's --dynamic: compile the graphs capture compiled
    # The sweep's --ddp/--fsdp (DistributedSpec.to_json()): compile as one rank of that job does.
    distributed: dict[str, Any] | None = None
    # The CUDA device the pass compiles on (torch.cuda.set_device): a job's rank r compiles on
    # cuda:r, and Inductor keys graphs and kernels by that index (``rank_copies``).
    device_index: int = 0

    def to_json(self) -> str:
        return json.dumps(self.__dict__)
