"""A distributed job's compile, made in one process: DDP or FSDP2 over a fake process group.

A rank of a ``torchrun`` job compiles other graphs than the bare module does:

- under DDP, Dynamo's DDPOptimizer splits the graph where DDP's gradient buckets end
  (``bucket_cap_mb``), so a model compiles as several graphs, each with its own GEMMs,
  kernels and artifacts;
- under FSDP2 (``fully_shard``), parameters are sharded, gathered in FSDP's hooks ahead
  of each module, and the compiled graphs see them whole, between graph breaks at the
  sharded modules' edges.

The sweep reproduces this in its own processes: the model is wrapped as the job wraps it,
inside a single-process fake process group of the job's world size (torch's ``fake``
backend, whose collectives do nothing), and compiled. Dynamo then splits and breaks the
graphs exactly as in each rank of the job, with no other process and no network.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from . import seams

log = logging.getLogger(__name__)

DDP, FSDP = "ddp", "fsdp"


@dataclass(frozen=True)
class DistributedSpec:
    """How the job wraps its model: ``kind`` ``ddp`` or ``fsdp``, over ``world_size`` ranks;
    DDP's ``bucket_cap_mb`` (None: DDP's default)."""

    kind: str
    world_size: int = 2
    bucket_cap_mb: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "world_size": self.world_size, "bucket_cap_mb": self.bucket_cap_mb}

    @classmethod
    def from_json(cls, value: dict[str, Any] | None) -> DistributedSpec | None:
        return None if value is None else cls(value["kind"], int(value["world_size"]), value.get("bucket_cap_mb"))


@contextlib.contextmanager
def job_process_group(spec: DistributedSpec | None) -> Iterator[None]:
    """A fake process group of the job's world size, this process its rank 0, for the
    duration; nothing where one is initialized already (a real job) or without ``spec``."""
    import torch.distributed as dist

    if spec is None or (dist.is_available() and dist.is_initialized()):
        yield
        return
    fake_store = seams.FAKE_STORE.resolve()  # importing its module registers the "fake" backend
    dist.init_process_group("fake", store=fake_store(), rank=0, world_size=spec.world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def wrap(module: Any, spec: DistributedSpec | None, device: str) -> Any:
    """``module`` (already on ``device``) wrapped as the job wraps it, inside ``job_process_group``."""
    import torch

    if spec is None or not isinstance(module, torch.nn.Module):
        return module
    if spec.kind == DDP:
        from torch.nn.parallel import DistributedDataParallel

        wrapped = (DistributedDataParallel(module) if spec.bucket_cap_mb is None
                   else DistributedDataParallel(module, bucket_cap_mb=spec.bucket_cap_mb))
        if not _real_process_group():
            # The fake group's all-reduce returns no tensor, which DDP's reducer refuses: each
            # bucket is "reduced" to itself instead. Outside the compiled graphs, so no graph changes.
            # (A lambda: DDP checks a hook's annotations, and this module's are strings.)
            wrapped.register_comm_hook(None, lambda state, bucket: _completed(bucket.buffer()))
        return wrapped
    return shard(module, device, spec.world_size)


def _real_process_group() -> bool:
    import torch.distributed as dist

    return dist.get_backend() != "fake"


def _completed(tensor: Any) -> Any:
    import torch

    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(tensor)
    return done


def shard(module: Any, device: str, world_size: int) -> Any:
    """FSDP2 as most training scripts apply it: ``fully_shard`` on each of the model's
    repeated blocks (each child of a ModuleList, else each direct child that holds
    parameters), then on the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device, (world_size,))
    for block in sharded_blocks(module):
        fully_shard(block, mesh=mesh)
    fully_shard(module, mesh=mesh)
    return module


def sharded_blocks(module: Any) -> list[Any]:
    """The submodules ``shard`` gives their own FSDP unit."""
    import torch

    lists = [m for m in module.modules() if isinstance(m, torch.nn.ModuleList)]
    if lists:
        return [block for found in lists for block in found]
    return [child for child in module.children() if any(True for _ in child.parameters())]
