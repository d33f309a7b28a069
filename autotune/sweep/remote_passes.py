"""End-to-end passes on the other nodes of a Ray cluster (a sweep with --address).

The passes are most of a team's sweep (benchmarks/results/team_queue.md), and they ran on the
sweep's own host alone: a cluster of two 2-GPU nodes passed its models on two GPUs. Once
tuning is over and the tuning actors are gone, each GPU of every other live node becomes
``passes_per_gpu`` more lanes of the sweep's pass (``EndToEndPass.add_lanes``): a lane
starts each pass it takes as a Ray task pinned to its node, holding its share of a GPU,
which runs the same process a local pass runs (workers/remote_run.py), the model file sent
as text. On a CPU cluster each other node is one lane. A pass whose node is lost, whose
process is SIGKILLed, or that fails there (a model file that imports a module beside it
finds none), runs again on this host; the lane of a lost node ends.

The pass writes to the cache itself, so the cache must be one every node reaches
(PostgreSQL for a team), as the tuning actors' results already need.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .end_to_end import STOP_GRACE_S, EndToEndReport, report_from
from .pass_spec import EndToEndSpec

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RemoteLane:
    """Where an added lane runs its passes: a node, and what each pass holds there."""

    node: str
    resources: tuple[tuple[str, float], ...]  # ("num_gpus", 0.5) or ("num_cpus", 1.0)


def remote_lanes(device: str, per_gpu: int) -> list[RemoteLane]:
    """The lanes the other live nodes give: ``per_gpu`` per GPU (each holding that share of
    it), or one per node on a CPU cluster. None outside a cluster, or when Ray cannot say."""
    import ray

    try:
        here = ray.get_runtime_context().get_node_id()
        nodes = ray.nodes()
    except Exception as exc:  # the passes still run here
        log.warning("could not list the Ray cluster's nodes (%s): the end-to-end passes run on this host only", exc)
        return []
    lanes = []
    for node in nodes:
        if not node.get("Alive") or node.get("NodeID") == here:
            continue
        if device == "cuda":
            share = 1.0 / max(1, per_gpu)
            lanes += [RemoteLane(node["NodeID"], (("num_gpus", share),))] * (int(node["Resources"].get("GPU", 0)) * per_gpu)
        elif node["Resources"].get("CPU", 0) >= 1:
            lanes.append(RemoteLane(node["NodeID"], (("num_cpus", 1.0),)))
    return lanes


def makers(lanes: list[RemoteLane]) -> list[Callable[[EndToEndSpec], RemotePassProcess]]:
    """A process maker per lane, for ``EndToEndPass.add_lanes``."""
    return [functools.partial(RemotePassProcess, lane=lane) for lane in lanes]


class RemotePassProcess:
    """One pass as a Ray task on ``lane``'s node; started by ``run``. ``lost``: its node (or
    its Ray worker) went away before it reported. ``rerun_here``: it did not pass there for a
    reason other than its time limit (lost, or failed: a model file that imports a module
    beside it finds none there), so the sweep runs it again on its own host."""

    def __init__(self, spec: EndToEndSpec, lane: RemoteLane) -> None:
        self.spec, self.lane = spec, lane
        self.spawned_at = time.time()
        self.lost = False
        self._failed = False  # SIGKILLed, or it reported an error (or none) within its time
        self._ref: Any = None

    @property
    def rerun_here(self) -> bool:
        return self.lost or self._failed

    def run(self, timeout: float, grace: float = STOP_GRACE_S) -> EndToEndReport:
        """Run the pass there and wait for its report (``timeout`` s, then ``grace`` s for what it
        stored). Never raises."""
        import ray

        started = time.perf_counter()
        try:
            self._ref = self._submit(timeout, grace)
            reply = ray.get(self._ref, timeout=timeout + grace + 60)
        except ray.exceptions.GetTimeoutError:
            self.close()
            return EndToEndReport(error=f"no answer from node {self.lane.node[:8]} in {timeout + grace:.0f} s",
                                   seconds=time.perf_counter() - started)
        except Exception as exc:  # the node or its worker died, or the task could not be placed
            self.lost = True
            return EndToEndReport(error=f"its Ray node {self.lane.node[:8]} was lost: {type(exc).__name__}",
                                   seconds=time.perf_counter() - started)
        sigkilled = reply["rc"] == -signal.SIGKILL
        report = report_from(reply["stdout"], self.spawned_at) or EndToEndReport(
            error=f"the process on node {self.lane.node[:8]} exited {reply['rc']} without a report")
        if reply["timed_out"]:
            report.error = f"timed out after {timeout:.0f} s" + (f" ({report.error})" if report.error else "")
        else:
            self._failed = sigkilled or report.error is not None
        for entry in report.passes:  # named as here, not by the folder it had there
            entry.update(model=self.spec.model_path, node=reply["node"])
        return report

    def _submit(self, timeout: float, grace: float) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from autotune.workers.remote_run import run_module

        files = {Path(self.spec.model_path).name: Path(self.spec.model_path).read_text()}
        there = dataclasses.replace(self.spec, model_path="{dir}/" + Path(self.spec.model_path).name, gpu=None)
        if self.spec.signing_key:
            files["signing_key.pem"] = Path(self.spec.signing_key).read_text()
            there = dataclasses.replace(there, signing_key="{dir}/signing_key.pem")
        task = ray.remote(run_module).options(
            max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(self.lane.node, soft=False),
            **dict(self.lane.resources))
        return task.remote("autotune.sweep.end_to_end", [there.to_json()], "go\n", files, timeout, grace)

    def close(self) -> None:
        if self._ref is not None:
            import ray

            try:
                ray.cancel(self._ref, force=True)
            except Exception:  # already done, or Ray is gone
                log.debug("could not cancel a remote pass", exc_info=True)
