"""The README's torchrun block, run as written: `autotune sweep examples/mixer.py --train --ddp`,
then examples/ddp_train.py under torchrun, 2 ranks on gloo over the CPU, one thread each.

One sweep and one launch (module-scoped) serve every test here. The README states what the
sweep finds and what each rank prints; the tests hold it to that.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import block, commands, run_shell

pytestmark = pytest.mark.xdist_group("torchrun-example")

REPO = Path(__file__).resolve().parents[1]
_STATS = re.compile(r"^rank (?P<rank>\d+): autotune: (?P<stats>.*)$", re.M)


def scratch_env(root: Path) -> dict[str, str]:
    """The user's shell, its caches (the database, XDG's and Inductor's) in ``root``."""
    env = dict(os.environ)
    env.update(AUTOTUNE_CACHE=str(root / "cache.db"), XDG_CACHE_HOME=str(root / "xdg"),
               TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    for name in ("AUTOTUNE_TRUSTED_KEYS", "AUTOTUNE_SIGNING_KEY", "AUTOTUNE_READ_ONLY", "AUTOTUNE_ON_MISS",
                 "OMP_NUM_THREADS"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], ...]:
    """(the sweep, the torchrun job), each as the README writes it."""
    env = scratch_env(tmp_path_factory.mktemp("torchrun-example"))
    sweep, job = commands(block("torchrun"))
    assert "examples/mixer.py" in sweep and "torchrun" in job and "examples/ddp_train.py" in job
    return run_shell(sweep, env), run_shell(job, env)


def rank_stats(job: subprocess.CompletedProcess[str]) -> dict[int, dict[str, int]]:
    """Each rank's stats line, as numbers: rank -> {name: value}."""
    found = {int(m["rank"]): {name: int(value) for name, value in re.findall(r"(\w+)=(\d+)", m["stats"])}
             for m in _STATS.finditer(job.stdout)}
    assert sorted(found) == [0, 1], f"not one stats line per rank:\n{job.stdout[-2000:]}\n{job.stderr[-2000:]}"
    return found


def test_the_sweep_finds_the_batched_matmuls_the_readme_names(ran: tuple[subprocess.CompletedProcess[str], ...]) -> None:
    sweep, _ = ran
    totals = re.search(r"requests: (\d+) found, (\d+) cached, (\d+) tuned, (\d+) failed", sweep.stdout)
    assert totals, sweep.stdout[-2000:]
    assert totals[1] == "2" and totals[4] == "0", f"the README says the sweep finds 2 requests: {totals[0]}"


def test_every_rank_hits_what_the_readme_says_and_benchmarks_nothing(
        ran: tuple[subprocess.CompletedProcess[str], ...]) -> None:
    _, job = ran
    for rank, stats in rank_stats(job).items():
        assert (stats["hits"], stats["misses"], stats["benchmarks"], stats["errors"]) == (4, 0, 0, 0), (rank, stats)
    assert "rank 0: autotune: hits=4 misses=0 benchmarks=0" in job.stdout  # the README's words


def test_only_local_rank_0_reads_the_database(ran: tuple[subprocess.CompletedProcess[str], ...]) -> None:
    _, job = ran
    stats = rank_stats(job)
    assert stats[0]["database_calls"] > 0 and stats[1]["database_calls"] == 0, stats


def test_every_rank_trained_its_steps(ran: tuple[subprocess.CompletedProcess[str], ...]) -> None:
    _, job = ran
    for rank in (0, 1):
        losses = re.findall(rf"^rank {rank}: step \d+ loss (\S+)$", job.stdout, re.M)
        assert len(losses) == 3 and all(float(loss) > 0 for loss in losses), (rank, job.stdout[-2000:])
