"""Spare tuning processes: started before Ray, claimed once, adopted over named pipes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from autotune.settings import Settings
from autotune.sweep import spare_count
from autotune.workers import spares
from autotune.workers.child import ChildTuner

pytestmark = pytest.mark.skipif(not spares.supported(), reason="spares need Linux (named pipes, PR_SET_PDEATHSIG)")


def test_one_spare_per_lane_of_the_sweep() -> None:
    settings = Settings.from_env(jobs_per_gpu=3, workers=2)
    assert spare_count(settings, gpus_here=2) == 6  # every GPU's lanes
    assert spare_count(settings.replace(gpus=1), gpus_here=2) == 3  # --gpus 1
    assert spare_count(settings, gpus_here=0) == 2  # CPU actors: one job each
    assert spare_count(settings.replace(device="cpu"), gpus_here=2) == 2


def _adopt_one(pool: spares.Spares, timeout: float) -> tuple[Path, ChildTuner]:
    home = spares.claim(pool.directory)
    assert home is not None
    tuner = ChildTuner(timeout)
    assert tuner.adopt(home)
    return home, tuner


def test_an_adopted_spare_answers_like_a_child_and_the_sweep_kills_the_rest() -> None:
    pool = spares.Spares(2)
    try:
        home, tuner = _adopt_one(pool, 120.0)
        answer = tuner.warm("cpu")
        assert answer["pinned"] is True and answer["warm_seconds"] > 0
        other = spares.claim(pool.directory)
        assert other is not None and other != home
        assert spares.claim(pool.directory) is None  # both taken
        tuner.close()
        pid = spares.spare_pid(home)
        assert pid is not None and not spares.running(pid)  # killed by its adopter, not by the sweep
    finally:
        pool.close()
    assert not Path(pool.directory).exists()
    assert all(proc.poll() is not None for proc in pool.procs)  # the one claimed but never adopted too


def test_a_spare_that_died_is_not_adopted(tmp_path: Path) -> None:
    pool = spares.Spares(1)
    try:
        pool.procs[0].kill()
        pool.procs[0].wait()
        home = Path(pool.directory) / "0"
        tuner = ChildTuner(5.0)
        started = time.monotonic()
        assert not tuner.adopt(home)
        assert time.monotonic() - started < 5.0
        assert tuner.proc is None  # the caller starts a child of its own
    finally:
        pool.close()


def test_no_spares_elsewhere(tmp_path: Path) -> None:
    assert spares.claim(None) is None
    assert spares.claim(str(tmp_path / "another-host")) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: a spare is moved to its actor's GPU")
def test_a_spare_moves_to_the_actors_gpu() -> None:
    pool = spares.Spares(1)
    try:
        _, tuner = _adopt_one(pool, 300.0)
        assert tuner.warm("cuda", "0")["pinned"] is True
        tuner.close()
    finally:
        pool.close()
