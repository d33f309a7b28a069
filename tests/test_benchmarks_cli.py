"""benchmarks.compile_time and the shared harness without running a compile: the CLI, the plan,
the goals, the results file and its Markdown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from factories import help_without_torch

from benchmarks import compile_time, harness

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ct() -> ModuleType:
    return compile_time


def test_help_works_without_importing_torch() -> None:
    out = help_without_torch("benchmarks.compile_time", REPO)
    assert "warm-start-artifacts" in out and "--optimizer-step" in out


def test_scenario_list_adds_what_each_scenario_loads(ct: ModuleType) -> None:
    assert ct.scenario_list("floor", cache_given=False) == ["default-precompile", "floor"]
    assert ct.scenario_list("max-autotune-megacache,default", cache_given=False) == [
        "default", "max-autotune-cold", "max-autotune-megacache"]
    assert ct.scenario_list("warm-start-artifacts", cache_given=False) == ["sweep", "warm-start-artifacts"]
    assert ct.scenario_list("warm-start-artifacts", cache_given=True) == ["warm-start-artifacts"]
    with pytest.raises(SystemExit):
        ct.scenario_list("nope", cache_given=False)


def test_training_files_are_recognised_without_importing_them(ct: ModuleType) -> None:
    assert ct.is_training_file(REPO / "examples" / "lm_train.py")
    assert not ct.is_training_file(REPO / "examples" / "mlp.py")


def test_saving_scenarios_and_child_flags(ct: ModuleType, tmp_path: Path) -> None:
    run = ct.ModelRun("m", "examples/mlp.py", ct.scenario_list("default,max-autotune-megacache,floor", False),
                      tmp_path, "sqlite:///x.db", train=False)
    assert run.saves("max-autotune-cold") == (True, False)  # Mega-cache alone: no caching_precompile
    assert run.saves("default") == (False, False)  # the goals' denominator runs as a plain default compile
    assert run.saves("default-precompile") == (True, True)
    flags, _ = ct._scenario_flags("default-precompile", run)
    assert "--save-artifacts" in flags and "--precompile" in flags
    flags, _ = ct._scenario_flags("default-precompile", run, save=False)  # a repeat keeps the first's file
    assert "--save-artifacts" not in flags and "--precompile" in flags
    with pytest.raises(ct.Skipped, match="needs a successful default-precompile"):
        ct._scenario_flags("floor", run)
    run.results["default-precompile"] = {"status": "ok", "megacache_saved": {"bytes": 10}}
    flags, _ = ct._scenario_flags("floor", run)
    assert flags[flags.index("--load-artifacts") + 1].endswith("default-precompile.megacache")
    assert "--precompile" in flags
    run.results["default-precompile"]["megacache_saved"] = {"error": "PicklingError: local class"}
    with pytest.raises(ct.Skipped, match="local class"):
        ct._scenario_flags("floor", run)


def test_artifact_scenario_trusts_the_public_key(ct: ModuleType, tmp_path: Path) -> None:
    run = ct.ModelRun("m", "examples/mlp.py", ["sweep", "warm-start-artifacts"], tmp_path, "sqlite:///x.db",
                      train=False, key_error="`autotune keys new` exited 2: No such command 'keys'")
    with pytest.raises(ct.Skipped, match="No such command"):
        ct._scenario_flags("warm-start-artifacts", run)
    run.signing_key = "/k/signing"
    flags, env = ct._scenario_flags("warm-start-artifacts", run)
    assert env == {"AUTOTUNE_TRUSTED_KEYS": "/k/signing.pub"} and flags == ["--cache", "sqlite:///x.db"]


def test_child_env_drops_the_callers_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_TRUSTED_KEYS", "/somewhere.pub")
    monkeypatch.setenv("AUTOTUNE_SIGNING_KEY", "/somewhere")
    env = harness.child_env(tmp_path, None)
    assert "AUTOTUNE_TRUSTED_KEYS" not in env and "AUTOTUNE_SIGNING_KEY" not in env
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")


def _ok(first: float, median: float, **extra: object) -> dict[str, object]:
    return {"status": "ok", "first_call_s": first, "median_ms": median, "min_ms": 0.9 * median, **extra}


def test_artifact_goals(ct: ModuleType) -> None:
    zero = dict.fromkeys(ct.BENCH_KINDS, 0)
    results = {
        "default": _ok(10.0, 1.0), "max-autotune-cold": _ok(40.0, 1.0, kernel_us_per_call=900.0),
        "warm-start-artifacts": _ok(4.0, 1.2, bench=zero, kernel_us_per_call=910.0),
        "floor": _ok(2.0, 1.1),
    }
    by_name = {g["name"]: g for g in ct.goals(results)}
    assert by_name["warm-start-artifacts first call / default first call"]["met"] is True
    assert by_name["warm-start-artifacts benchmarks of any kind at the first call"]["value"] == 0
    kernel = by_name["warm-start-artifacts latency / max-autotune-cold latency (summed kernel time)"]
    assert kernel["value"] == pytest.approx(910 / 900) and kernel["met"] is True
    assert by_name["warm-start-artifacts first call / floor first call"]["value"] == 2.0
    assert by_name["warm-start-artifacts first call / max-autotune-megacache first call"]["value"] is None
    results["warm-start-artifacts"]["bench"] = {**zero, "coordinate_descent": 3}
    results["warm-start-artifacts"].pop("kernel_us_per_call")
    by_name = {g["name"]: g for g in ct.goals(results)}
    assert by_name["warm-start-artifacts benchmarks of any kind at the first call"]["met"] is False
    assert by_name["warm-start-artifacts latency / max-autotune-cold latency (fastest wall call)"]["met"] is False


def test_a_latency_measured_in_several_processes_compares_their_median_fastest_calls(ct: ModuleType) -> None:
    cold = _ok(20.0, 1.0, latency_processes=[{"min_ms": ms} for ms in (0.50, 0.44, 0.46)])
    warm = _ok(4.0, 1.3, latency_processes=[{"min_ms": ms} for ms in (0.60, 0.45, 0.47)])
    value, basis = ct.latency_ratio(warm, cold)
    assert value == pytest.approx(0.47 / 0.46) and basis == "fastest wall call, median of 3 and 3 processes"
    warm.pop("latency_processes")  # one process against several: its own fastest call against cold's first
    assert ct.latency_ratio(warm, cold) == (pytest.approx(1.17 / 0.9), "fastest wall call")
    warm["kernel_us_per_call"], cold["kernel_us_per_call"] = 90.0, 100.0  # a kernel profile comes first
    assert ct.latency_ratio(warm, cold) == (pytest.approx(0.9), "summed kernel time")


def test_results_file_keeps_one_run_per_label_and_names_what_it_ran_on(ct: ModuleType, tmp_path: Path) -> None:
    info = {"gpu": None, "cpu": "cpu", "cpu_count": 2, "python": "3.12", "torch": "2.13.0+cpu"}
    store = ct.results(tmp_path)
    first = store.run("cpu: mlp", info, "python -m benchmarks.compile_time --models mlp")
    first["models"] = {"mlp": {"path": "examples/mlp.py", "scenarios": {
        "default": {"status": "ok", "first_call_s": 3.0, "median_ms": 0.1,
                    "bench": dict.fromkeys(ct.BENCH_KINDS, 0)},
        "sweep": {"status": "error", "error": "sweep exited 2\nsecond | line"}}}}
    store.save()
    again = ct.results(tmp_path)
    again.run("cpu: mlp", info, "python -m benchmarks.compile_time --models mlp --runs 3")["models"] = {}
    again.run("cpu: gpt", info, "python -m benchmarks.compile_time --models gpt")["models"] = {}
    again.save()
    runs = json.loads((tmp_path / "compile_time.json").read_text())["runs"]
    assert [r["label"] for r in runs] == ["cpu: mlp", "cpu: gpt"] and runs[0]["command"].endswith("--runs 3")
    assert all(r["date"] and r["machine"]["torch"] == "2.13.0+cpu" and "commit" in r for r in runs)
    text = "\n".join(ct.render(first))
    assert "| default | 3.0 | 0.100 | - | 0/0/0 (0) | - |" in text
    assert "sweep exited 2 second \\| line" in text  # one table cell: no newline, no bare pipe


def test_dynamic_option_and_sweep_statuses(ct: ModuleType) -> None:
    with pytest.raises(SystemExit, match="needs --batch-size"):
        ct.main(["--dynamic", "auto", "--models", "mlp"])
    assert ct.DYNAMIC == {"static": False, "auto": None, "true": True}
    assert ct._sweep_totals({"totals": {"found": 3}, "requests": [{"status": "ok"}, {"status": "key_mismatch"},
                                                                  {"status": "ok"}]})["statuses"] == {
        "ok": 2, "key_mismatch": 1}


def test_prefetch_benchmark_help_goals_and_table(tmp_path: Path) -> None:
    from benchmarks import prefetch

    out = help_without_torch("benchmarks.prefetch", REPO)
    assert "--quick" in out and "--build-seconds" in out

    def ok(first: float, whole: float, **extra: object) -> dict[str, object]:
        return {"status": "ok", "first_call_s": first, "whole_process_s": whole, **extra}

    scenarios = {"default": ok(10.0, 14.0), "floor +0s": ok(4.0, 8.0), "warm-start +0s": ok(3.0, 7.0),
                 "prefetch +0s": ok(2.5, 6.5), "floor +5s": ok(4.0, 13.0),
                 "warm-start +5s": ok(3.0, 12.0, scenario="warm-start"),
                 "prefetch +5s": ok(1.5, 10.0, scenario="prefetch", hook={"prefetched_rows": 3, "prefetch_waits": 0},
                                    first_call_phases={"_compile.compile_inner": 1.2, "compile_fx_inner": 0.4})}
    found = {g["goal"]: g["met"] for g in prefetch.goals(scenarios, "resnet", [0.0, 5.0])}
    assert found == {"first call at +5s <= 0.5x the floor's": True, "whole process at +5s <= 0.8x the floor's": True,
                     "whole process at +0s <= today's warm start": True,
                     "first call at +0s vs today's warm start (holds the install on a thread)": None,
                     "first call at +5s <= 0.2x default mode's": True}
    store = prefetch.results(tmp_path)
    run = store.run("cpu: mlp", {"cpu": "x", "cpu_count": 2}, "python -m benchmarks.prefetch --quick")
    run["models"] = {"mlp": {"path": "examples/mlp.py", "scenarios": scenarios, "goals": []}}
    store.save()
    table = (tmp_path / "prefetch.md").read_text()
    assert "| prefetch +5s | 1.5 | 10.0 | 0.38 | 0.77 | 0.15 |" in table
    assert ("- prefetch +5s, the first call's longest phases (nested): _compile.compile_inner 1.20 s, "
            "compile_fx_inner 0.40 s") in table


def test_prefetch_processes_give_medians_and_keep_each_processs_timings(tmp_path: Path) -> None:
    from benchmarks import prefetch

    assert "--processes" in help_without_torch("benchmarks.prefetch", REPO)
    runs = [{"status": "ok", "first_call_s": first, "whole_process_s": whole, "benchmarks": bench,
             "hook": {"prefetch_waits": n}} for n, (first, whole, bench) in enumerate([(3.0, 9.0, 0), (2.0, 7.0, 1),
                                                                                     (4.0, 8.0, 0)])]
    failed = {"status": "timeout", "error": "timed out after 5 s"}
    merged = prefetch.medians([*runs, failed])
    assert (merged["first_call_s"], merged["whole_process_s"]) == (3.0, 8.0)
    assert merged["benchmarks"] == 1  # any process that benchmarked shows
    assert merged["hook"] == {"prefetch_waits": 0}  # the first good process's details
    assert [p["status"] for p in merged["processes"]] == ["ok", "ok", "ok", "timeout"]
    assert prefetch.medians(runs[:1]) is runs[0] and prefetch.medians([failed]) is failed
    store = prefetch.results(tmp_path)
    run = store.run("cpu: mlp", {"cpu": "x", "cpu_count": 2}, "python -m benchmarks.prefetch --processes 4")
    run["models"] = {"mlp": {"path": "examples/mlp.py", "scenarios": {"prefetch +0s": merged}, "goals": []}}
    store.save()
    assert ("- medians of 4 fresh processes per timed scenario, each process's first call / whole process "
            "(fastest-slowest, s): prefetch +0s 2.0-4.0 / 7.0-9.0") in (tmp_path / "prefetch.md").read_text()
    today = [{**r, "whole_process_s": r["whole_process_s"] - 0.5} for r in runs]  # 0.5 s faster in every round
    today[1] = {**today[1], "whole_process_s": 7.5}  # but slower in the second
    scenarios = {"prefetch +0s": {"processes": [*runs, failed]}, "warm-start +0s": {"processes": today}}
    paired = prefetch.paired_rounds(scenarios, "prefetch +0s", "warm-start +0s", "whole_process_s")
    assert paired is not None and (paired["rounds"], paired["slower"]) == (3, 2)
    assert paired["mean_s"] == pytest.approx(0.5 / 3)
    assert paired["low_s"] < paired["mean_s"] < paired["high_s"]
    assert prefetch.paired_rounds(scenarios, "prefetch +0s", "floor +0s", "whole_process_s") is None
    run["models"]["mlp"]["scenarios"] = scenarios | {"prefetch +0s": merged}
    store.save()
    assert ("- whole process at +0s, the prefetch's process less today's in each round: slower in 2 of 3 rounds, "
            "a mean difference of +0.17 s (95% interval ") in (tmp_path / "prefetch.md").read_text()
    with pytest.raises(SystemExit, match="--processes must be positive"):
        prefetch.main(["--processes", "0"])


def test_team_queue_benchmark_help_workload_and_scaling_figures(tmp_path: Path) -> None:
    from benchmarks import team_queue, zoo

    out = help_without_torch("benchmarks.team_queue", REPO)
    assert "--cold-gpus" in out and "--resume" in out
    paths = team_queue.model_paths(list(team_queue.WORKLOAD), tmp_path)
    assert len(paths) >= 6 and all(Path(p).is_file() for p in paths)
    assert any(entry.endswith(":train") for entry in team_queue.WORKLOAD)
    assert all(entry.partition(":")[0] in zoo.ZOO for entry in team_queue.WORKLOAD)
    # 100 s on 1 GPU, 55 s on 2, 30 s on 4: Amdahl's serial fraction from the widest, projected.
    run = {"steps": {"queue1": {"status": "ok", "wall_s": 100.0}, "queue2": {"status": "ok", "wall_s": 55.0},
                     "queue4": {"status": "ok", "wall_s": 30.0}, "cold": {"status": "ok", "wall_s": 120.0, "gpus": 2,
                                                                          "models": [{"wall_s": w} for w in (50, 70, 40, 30)]},
                     "warm": {"status": "ok", "cache": "q4.db", "models": {"a:infer": {
                         "status": "ok", "first_call_s": 1.0, "bench": {"gemm_autotune": 0, "benchmarker_calls": 0}}}}},
           "workload": ["a:infer"]}
    team_queue.derive(run)
    assert round(run["steps"]["queue2"]["efficiency"], 3) == 0.909
    s = run["steps"]["queue4"]["serial_fraction"]
    assert round(s, 4) == round((4 * 30 / 100 - 1) / 3, 4)
    assert round(run["projected"]["8"]["wall_s"], 3) == round(100 * (s + (1 - s) / 8), 3)
    assert run["vs_cold"] == 0.25
    assert run["steps"]["cold"]["packed_wall_s"] == 100.0 and run["vs_cold_packed"] == 0.3  # 70+30 | 50+40
    lines = team_queue.render(run)
    assert "- efficiency at 4 GPUs >= 0.8: 0.83 (met)" in lines
    assert any(line.startswith("- the 4-GPU sweep <= 0.5x") and "(met)" in line for line in lines)
    assert "- every warm-started model (a:infer) ran 0 benchmarks: met" in lines
    assert "- from 2 GPUs to 4: efficiency 0.92 (2 T2 / 4 T4)" in lines
    # A step cut by its call's budget is a lower bound, and each end-to-end compile is listed.
    cut = {"steps": {"queue2": {"status": "stopped by the call budget", "wall_s": 524.0},
                     "queue4": {"status": "ok", "wall_s": 391.4, "passes": [
                         {"model": "dlrm_train", "began_s": 113.3, "seconds": 157.3, "kernels_tuned": 83,
                          "time_in_graph": True}]}},
           "workload": ["dlrm:train"], "passes_per_gpu": 2}
    team_queue.derive(cut)
    lines = team_queue.render(cut)
    assert "scaling_2_to_4" not in cut and any(line.startswith("| 2 | > 524.0 (stopped by") for line in lines)
    assert "| dlrm_train | 113.3 | 157.3 | 83 | timing |  |  |" in lines and "passes per GPU: 2" in lines[0]
    from benchmarks.sweep_bench import pass_rows

    rows = pass_rows({"passes": [{"model": "/t/a.py", "began_at": 1000.0, "seconds": 9.5, "time_in_graph": True},
                                 {"model": "/t/b.py", "began_at": 1012.5, "seconds": 3.0}],
                      "phases": [{"a": 1.0, "b": 5.0, "c": 2.0, "d": 0.5, "e": 0.1}, {}],
                      "failed": [{"model": "/t/c.py", "error": "exited 17"}]})
    assert [(r["model"], r.get("began_s")) for r in rows] == [("a", 0.0), ("b", 12.5), ("c", None)]
    assert list(rows[0]["phases"]) == ["b", "c", "a", "d", "e"]  # each compile's longest, longest first


def test_install_imports_help_works_without_importing_torch_and_its_table_takes_medians() -> None:
    assert "--rounds" in help_without_torch("benchmarks.install_imports", REPO)
    from benchmarks import install_imports

    children = [{"mode": "main", "torch_s": 1.0, "cuda_check_s": 0.1, "imports_s": s, "imports_cpu_s": s,
                 "total_s": s + 1.1} for s in (2.0, 4.0, 3.0)]
    rows = install_imports.summary(children + [{"mode": "thread", "error": "no result (rc 1)"}])
    assert rows[0] == ["main", 3, "1.00", "0.10", "3.00", "3.00", "4.10"]
    assert rows[1] == ["thread", 0, "-", "-", "-", "-", "-"]  # a child without figures is not counted


def test_prefetch_keeps_each_processs_set_up_figures() -> None:
    from benchmarks import prefetch

    results = [{"status": "ok", "first_call_s": f, "whole_process_s": f + 5, "setup_s": 1.0 + f,
                "model_build_s": 0.2, "hook": {"install_s": f}} for f in (1.0, 2.0)]
    merged = prefetch.medians(results)
    assert merged["first_call_s"] == 1.5
    assert [p["setup_s"] for p in merged["processes"]] == [2.0, 3.0]
    assert merged["processes"][1]["hook"] == {"install_s": 2.0}


def test_prefetch_baseline_runs_the_prefetch_scenario_from_another_versions_folder(tmp_path: Path) -> None:
    from benchmarks import prefetch

    with pytest.raises(SystemExit, match="make one with `bash benchmarks/baseline_code.sh COMMIT"):
        prefetch.main(["--baseline", str(tmp_path / "nowhere")])
    folder = tmp_path / "base"
    for made in ("autotune/__init__.py", "benchmarks/prefetch.py"):
        (folder / made).parent.mkdir(parents=True, exist_ok=True)
        (folder / made).write_text("")
    (folder / prefetch.BASELINE_COMMIT).write_text("abc1234\n")
    assert prefetch.baseline_folder(str(folder)) == folder.resolve()
    assert prefetch.baseline_name(folder) == "abc1234"
    assert prefetch._code_for("prefetch", folder) == (harness.REPO, "prefetch")
    assert prefetch._code_for("baseline", folder) == (folder, "prefetch")
    assert (folder / "examples" / "mlp.py").is_file()  # the model files under the same relative paths
    env = harness.child_env(tmp_path / "caches", None, folder)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(folder)

    def ok(scenario: str, whole: float, *rounds: float) -> dict[str, object]:
        return {"scenario": scenario, "status": "ok", "first_call_s": 1.0, "whole_process_s": whole,
                "processes": [{"status": "ok", "first_call_s": 1.0, "whole_process_s": r} for r in rounds]}

    scenarios = {"floor +0s": ok("floor", 8.0), "warm-start +0s": ok("warm-start", 6.0, 6.0, 6.0),
                 "prefetch +0s": ok("prefetch", 6.0, 6.1, 5.9), "baseline +0s": ok("baseline", 6.4, 6.5, 6.7)}
    found = {g["goal"]: (g["value"], g["met"]) for g in prefetch.goals(scenarios, "mlp", [0.0], "abc1234")}
    assert found["whole process at +0s vs the baseline code's (abc1234)"] == (pytest.approx(6.0 / 6.4), None)
    store = prefetch.results(tmp_path)
    run = store.run("cpu: mlp", {"cpu": "x", "cpu_count": 2}, "python -m benchmarks.prefetch --baseline base")
    run["models"] = {"mlp": {"path": "examples/mlp.py", "scenarios": scenarios, "goals": []}}
    store.save()
    table = (tmp_path / "prefetch.md").read_text()
    assert "| baseline +0s | 1.0 | 6.4 | 1.00 | 0.80 |" in table  # against the floor, as the prefetch's row
    assert ("- whole process at +0s, the prefetch's process less the baseline code's in each round: slower in 0 of "
            "2 rounds, a mean difference of -0.60 s") in table


def test_baseline_code_makes_a_folder_whose_processes_import_that_versions_code(tmp_path: Path) -> None:
    from benchmarks import prefetch

    folder = tmp_path / "head"
    made = subprocess.run(["bash", "benchmarks/baseline_code.sh", "HEAD", str(folder)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    assert prefetch.baseline_name(prefetch.baseline_folder(str(folder))) == commit.stdout.strip()
    code, _ = prefetch._code_for("baseline", folder)
    where = ("import autotune, autotune.cache.store, autotune.workers, benchmarks.prefetch\n"
             "print(autotune.__file__, autotune.cache.store.__file__, autotune.workers.__file__, "
             "benchmarks.prefetch.__file__)")
    imported = subprocess.run([sys.executable, "-c", where], cwd=code, env=harness.child_env(tmp_path / "c", None, code),
                              capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr[-2000:]
    assert all(Path(f).resolve().is_relative_to(folder.resolve()) for f in imported.stdout.split())
