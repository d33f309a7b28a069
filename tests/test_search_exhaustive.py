"""`autotune sweep --search exhaustive` on a CPU: its rows, a warm job served from them, its flags.

The sweep is of the tests' tiny model (two GEMMs of a few dozen columns), not examples/mlp.py:
on a CPU the exhaustive space adds nothing to the C++ templates' and ATen's choices
(inductor_glue/search_space.py), so a larger model's sweep proves no more and costs minutes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from factories import make_result

from autotune.cache import Store
from autotune.cache.records import TuningResult
from autotune.cli import main
from autotune.inductor_glue import pinning
from autotune.job.serve_policy import ServePolicy
from autotune.settings import Settings
from autotune.workers.entry import tune_request
from autotune.workers.jobs import TuneJob
from autotune.workers.search import search_overrides

pytestmark = pytest.mark.xdist_group("exhaustive_sweep")

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).parent
MODELS = TESTS / "models"
TINY = str(MODELS / "tiny_mlp.py")


@pytest.mark.parametrize(("flags", "needle"), [
    (["--search", "widest"], "'widest' is not one of 'default', 'exhaustive'"),
    (["--search", "exhaustive", "--budget-s", "0"], "must be a positive number of seconds"),
    (["--search", "exhaustive", "--budget-s", "soon"], "'soon' is not a valid float"),
    (["--budget-s", "5"], "add --search exhaustive, or drop --budget-s"),
])
def test_bad_search_flags_are_one_line_and_exit_2(flags: list[str], needle: str, sqlite_url: str) -> None:
    result = CliRunner().invoke(main, ["sweep", TINY, "--device", "cpu", "--cache", sqlite_url, *flags])
    assert result.exit_code == 2, result.output
    assert needle in result.output and len(result.output.strip().splitlines()) == 1, result.output


@pytest.fixture(scope="module")
def exhaustive_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """`autotune sweep tests/models/tiny_mlp.py --search exhaustive --budget-s 5` on a CPU into SQLite."""
    url = f"sqlite:///{tmp_path_factory.mktemp('exhaustive') / 'cache.db'}"
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", "sweep", TINY, "--device", "cpu", "--cache", url,
                           "--search", "exhaustive", "--budget-s", "5", "--json"],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return url, json.loads(proc.stdout)


def test_an_exhaustive_sweep_stores_rows_marked_exhaustive_and_its_cost(
        exhaustive_sweep: tuple[str, dict[str, Any]]) -> None:
    url, report = exhaustive_sweep
    assert report["totals"]["tuned"] == report["totals"]["found"] > 0, report["totals"]
    with Store(url) as store:
        rows = [result for _, result in store.list_results()]
    assert len(rows) == report["totals"]["tuned"]
    assert all(r.status == "ok" and r.provenance.search == "exhaustive" for r in rows)
    # Filed under the job's environment: the capture's, with the default search space.
    assert {r.env.config.get("max_autotune_gemm_search_space") for r in rows} == {"DEFAULT"}
    cost = report["cost"]
    assert cost["unit"] == "CPU-minutes" and cost["total"] > 0 and list(cost["models"]) == [TINY]


def test_a_warm_job_serves_the_exhaustive_rows_with_no_benchmark(
        exhaustive_sweep: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    url, report = exhaustive_sweep
    out = tmp_path / "warm.json"
    proc = subprocess.run([sys.executable, str(TESTS / "hook_job.py"), str(out), "--cache", url,
                           "--models-dir", str(MODELS), "--model", "tiny_mlp"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    warm = json.loads(out.read_text())
    stats = warm["stats"]
    assert (stats["hits"], stats["misses"], stats["errors"]) == (report["totals"]["found"], 0, 0), proc.stderr[-3000:]
    assert warm["benchmarks"] == 0


def test_a_spent_budget_times_aten_alone_and_says_why_the_rest_went_untimed(
        exhaustive_sweep: tuple[str, dict[str, Any]]) -> None:
    url, _report = exhaustive_sweep
    with Store(url) as store:
        stored = next(result for _, result in store.list_results())
    overrides = {k: v for k, v in stored.env.config.items() if not (isinstance(v, str) and v.startswith("<"))}
    job = TuneJob(stored.request, stored.env, "max-autotune", {**overrides, **search_overrides("exhaustive", 1e-9)},
                  "cpu")
    result = tune_request(job)
    assert result.status == "ok" and result.provenance.search == "exhaustive", result.error
    assert result.env.key == stored.env.key
    assert result.winner is not None and result.winner.kind == "aten"
    untimed = [c for c in result.candidates if c.kind != "aten"]
    assert untimed and all(c.time_ms is None and c.failure_kind == "timeout" for c in untimed)
    assert "budget" in (untimed[0].failure_message or "")


def _exhaustive_winner(result: TuningResult, arguments: dict[str, Any]) -> TuningResult:
    """``result`` as an exhaustive search stores it: pins on its Triton candidates, and the
    winner's generate() arguments, its config outside the job's default list."""
    candidates = tuple(dataclasses.replace(c, params={
        **c.params, pinning.PIN_FAMILY: "fam", pinning.PIN_KEY: f"key-{i}",
        **({pinning.PIN_ARGS: arguments} if c.choice_hash == result.winner_hash else {})})
        for i, c in enumerate(result.candidates))
    provenance = dataclasses.replace(result.provenance, search="exhaustive")
    return dataclasses.replace(result, candidates=candidates, provenance=provenance)


def test_the_hook_generates_a_stored_exhaustive_winner_in_place_of_a_lost_config(sqlite_url: str) -> None:
    arguments = {"BLOCK_M": 128, "BLOCK_N": 32, "BLOCK_K": 256, "num_stages": 1, "num_warps": 2,
                 "ALLOW_TF32": False, "ACC_TYPE": "tl.float32"}
    stored = _exhaustive_winner(make_result(times=[1.0, 0.5, 0.3, 0.9]), arguments)  # candidate 2 wins
    with Store(sqlite_url) as store:
        store.put_result(stored)
    policy = ServePolicy(Settings(cache=sqlite_url))
    try:
        with Store(sqlite_url) as store:
            policy._pins["cuda"] = pinning.PinIndex(list(store.results_for_env(stored.env)))
        # The job's own configs of that template all lost; the first is answered with the winner,
        # its arguments as the worker recorded them (a round trip through the database).
        instead = policy.allow_template(pinning.Pin("cuda", "fam", "key-default-config"))
        assert isinstance(instead, pinning.Pin)
        assert (instead.key, dict(instead.args)) == ("key-2", arguments)
        assert policy.allow_template(pinning.Pin("cuda", "fam", "key-2")) is True  # the winner itself
        assert policy.allow_template(pinning.Pin("cuda", "other", "key-9")) is True  # a miss: as Inductor does
    finally:
        policy.close()
