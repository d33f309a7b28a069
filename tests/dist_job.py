"""A torchrun training job for the distributed tests: DDP and FSDP2 on gloo, one step each.

usage: torchrun --nproc_per_node N tests/dist_job.py OUT_DIR KIND[,KIND...] [--no-hook]

Each rank trains tests/models/tiny_bmm.py for one step per KIND (``ddp``: DistributedDataParallel
with bucket_cap_mb=1, so Dynamo's DDPOptimizer splits the graph; ``fsdp``: FSDP2's fully_shard
on each Linear, then the root), compiled with mode="max-autotune", each in fresh Dynamo and
Inductor caches. With the hook (AUTOTUNE_CACHE names the cache), warm_start() goes in first.
Each rank writes OUT_DIR/rank-R.json: per KIND, the hook's stats over that step, Inductor's
benchmarks, and whether the output matched the same step run eagerly (no compile, no hook).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="dist-job-")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch._inductor.utils import fresh_cache  # noqa: E402

import autotune  # noqa: E402
from autotune.inductor_glue.inductor import benchmark_count  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "models"))
import tiny_bmm  # noqa: E402


def wrapped(kind: str, model: torch.nn.Module) -> torch.nn.Module:
    if kind == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    from torch.distributed.fsdp import fully_shard

    fully_shard(model.proj)
    fully_shard(model.out)
    return fully_shard(model)


def step(kind: str) -> bool:
    """One compiled training step; whether its output matches the eager step's."""
    model, (x,) = tiny_bmm.example()
    eager = copy.deepcopy(model)
    compiled = torch.compile(wrapped(kind, model), mode="max-autotune")
    out = compiled(x)
    out.float().sum().backward()
    expected = eager(x)
    return bool(torch.allclose(out.detach(), expected.detach(), rtol=1e-4, atol=1e-4))


def main() -> None:
    out_dir, kinds, hook = Path(sys.argv[1]), sys.argv[2].split(","), "--no-hook" not in sys.argv
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    handle = autotune.warm_start() if hook else None
    report: dict[str, object] = {"rank": rank}
    for kind in kinds:
        before = handle.stats.as_dict() if handle else {}
        benchmarks_before = benchmark_count()
        torch._dynamo.reset()
        with fresh_cache():
            matches = step(kind)
        after = handle.stats.as_dict() if handle else {}
        report[kind] = {
            "matches_eager": matches,
            "inductor_benchmarks": benchmark_count() - benchmarks_before,
            **{name: after[name] - before[name] for name in ("hits", "misses", "benchmarks", "database_calls")
               if name in after},
        }
    dist.barrier()  # every rank done before local rank 0, which serves the others, leaves
    if handle:  # the whole job's, the prefetch's included (it may end inside warm_start())
        report["database_calls"] = handle.stats.database_calls
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank-{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
