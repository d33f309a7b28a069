"""The first-call picture shows each model once, from one run of committed code."""

from __future__ import annotations

from benchmarks import harness, plots


def test_each_model_is_drawn_once_from_one_run_of_committed_code() -> None:
    runs = [r for r in harness.load(harness.RESULTS / "compile_time.json")["runs"] if r["machine"].get("gpu")]
    groups = plots.one_run_per_model(runs)
    models = [model for _, model, _ in groups]
    assert models and len(models) == len(set(models))
    assert all("+" not in str(run["commit"]) and "runs" not in str(run["label"]) for run, _, _ in groups)


def test_the_newest_run_of_a_model_wins() -> None:
    old = {"date": "2026-01-01", "commit": "a" * 40, "label": "x", "models": {"gpt": {"scenarios": {"v": 1}}}}
    new = {"date": "2026-02-01", "commit": "b" * 40, "label": "y", "models": {"gpt": {"scenarios": {"v": 2}}}}
    merged = {"date": "2026-03-01", "commit": "c" * 40, "label": "gpt (runs 1, 2)",
              "models": {"gpt": {"scenarios": {"v": 3}}}}
    assert plots.one_run_per_model([new, old, merged]) == [(new, "gpt", {"v": 2})]
