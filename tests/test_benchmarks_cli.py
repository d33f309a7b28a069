"""benchmarks.compile_time and the shared harness without running a compile: the CLI, the plan,
the goals, the results file and its Markdown."""

from __future__ import annotations

import json
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


def _cell(scenario: str, *wholes: float, first: float = 1.0) -> list[dict[str, object]]:
    return [{"scenario": scenario, "status": "ok", "whole_process_s": w, "first_call_s": first, "benchmarks": 0,
             "setup_s": 0.5, "busy_s": 5.0} for w in wholes]


def _startup_run() -> dict[str, object]:
    from benchmarks import startup

    scenarios = {"floor": startup.summarise(_cell("floor", 10.0, 12.0, 11.0, first=4.0)),
                 "default": startup.summarise(_cell("default", 20.0, 21.0, 19.0, first=14.0)),
                 "warm-start": startup.summarise(_cell("warm-start", 7.0, 8.0, 9.0, first=2.0))}
    return {"label": "nvidia-h100: mlp", "date": "2026-12-07T12:00:00+00:00", "commit": "abc1234",
            "command": "python -m benchmarks.startup --models mlp", "busy_seconds": 5.0, "processes": 3,
            "machine": {"gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 1, "torch": "2.11.0", "cpu_count": 16},
            "models": {"mlp": {"path": "examples/mlp.py", "title": "small MLP", "scenarios": scenarios,
                               "vs_floor": startup.vs_floor(scenarios)}}}


def test_startup_help_cells_ratios_and_table(tmp_path: Path) -> None:
    from benchmarks import startup

    out = help_without_torch("benchmarks.startup", REPO)
    assert "--busy-seconds" in out and "--processes" in out and "--quick" in out
    failed = {"status": "timeout", "error": "timed out after 5 s", "stderr_tail": "..."}
    cell = startup.summarise([*_cell("floor", 9.0, 7.0, 8.0), failed])
    assert cell["whole_process_s"] == {"median": 8.0, "min": 7.0, "max": 9.0}
    assert (cell["samples"], cell["failed"], cell["error"]) == (3, 1, "timed out after 5 s")
    assert [p["status"] for p in cell["processes"]] == ["ok", "ok", "ok", "timeout"]
    assert cell["processes"][0]["setup_s"] == 0.5  # each process's set-up figures are kept
    run = _startup_run()
    ratios = run["models"]["mlp"]["vs_floor"]  # type: ignore[index]
    assert ratios["warm-start"]["whole_process_s"] == pytest.approx(8.0 / 11.0)
    assert ratios["default"]["first_call_s"] == pytest.approx(14.0 / 4.0)
    store = startup.results(tmp_path)
    store.data["runs"].append(run)
    store.save()
    table = (tmp_path / "startup.md").read_text()
    assert "| warm-start | 3 | 8.0 (7.0-9.0) | 2.0 (2.0-2.0) | 0.73 | 0.50 | 0 |" in table
    with pytest.raises(SystemExit, match="--sweep-timeout and --processes positive"):
        startup.main(["--processes", "0"])


def test_startup_rebuilds_a_cut_commands_run_from_its_childrens_logs(tmp_path: Path) -> None:
    from benchmarks import startup

    logs = tmp_path / "logs"
    logs.mkdir()
    env = {"device_name": "NVIDIA H100 80GB HBM3", "torch_version": "2.11.0+cu130", "triton_version": "3.6.0",
           "cuda_version": "13.0"}
    (logs / "mlp-sweep.log").write_text(f"$ sweep\n--- stdout\n{json.dumps({'environment': env})}\n--- stderr\n")
    finished = {"floor": [9.0, 8.0], "default": [12.0], "warm-start": [7.0, 6.0]}  # cut during default's 2nd
    for scenario, times in finished.items():
        for repeat, whole in enumerate(times):
            line = json.dumps({"status": "ok", "whole_process_s": whole, "first_call_s": 1.0, "busy_seconds": 5.0})
            (logs / f"mlp-{scenario}-{repeat}.log").write_text(f"--- stdout\nRESULT {line}\n--- stderr\n")
    (logs / "mlp-floor-save-0.log").write_text("--- stdout\nRESULT {\"status\": \"ok\"}\n")  # not a floor process
    entry, machine = startup.from_logs("mlp", logs)
    assert machine == {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0"}
    cells = entry["scenarios"]
    assert {name: cell["samples"] for name, cell in cells.items()} == {"floor": 2, "default": 1, "warm-start": 2}
    assert cells["warm-start"]["whole_process_s"] == {"median": 6.5, "min": 6.0, "max": 7.0}
    assert entry["vs_floor"]["warm-start"]["whole_process_s"] == pytest.approx(6.5 / 8.5)
    assert entry["busy_seconds"] == 5.0 and entry["rebuilt_from_logs"] is True


def test_startup_prepared_files_round_trip_and_a_missing_one_is_named(tmp_path: Path) -> None:
    import sqlite3

    from benchmarks import startup

    made = tmp_path / "made"
    made.mkdir()
    with sqlite3.connect(made / "cache.db") as db:
        db.execute("create table t (x)")
        db.execute("insert into t values (1)")
    (made / "key.pub").write_text("public")
    (made / "floor.megacache").write_bytes(b"blob")
    entry = {"sweep": {"status": "ok", "wall_s": 300.0}, "floor_save": {"status": "ok"}, "scenarios": {}}
    startup.save_prepared(entry, made, str(made / "key"), tmp_path / "prepared" / "lm_train")

    into = tmp_path / "into"
    into.mkdir()
    kept = startup.use_prepared(tmp_path / "prepared" / "lm_train", into)
    assert kept["sweep"] == entry["sweep"] and kept["floor_save"] == entry["floor_save"]
    assert (into / "floor.megacache").read_bytes() == b"blob" and (into / "key.pub").read_text() == "public"
    with sqlite3.connect(into / "cache.db") as db:
        assert db.execute("select x from t").fetchall() == [(1,)]

    (tmp_path / "prepared" / "lm_train" / "floor.megacache").unlink()
    with pytest.raises(SystemExit, match="lacks floor.megacache; make it with --prepare-only"):
        startup.use_prepared(tmp_path / "prepared" / "lm_train", into)
    with pytest.raises(SystemExit, match="give one of them"):
        startup.main(["--prepare-only", str(tmp_path / "a"), "--prepared", str(tmp_path / "b")])


def test_moe_routing_counts_a_row_that_moved_and_not_one_that_rounded() -> None:
    import torch

    from benchmarks import moe_routing

    reference = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 23  # 6 tokens, scale 1
    output = reference.clone()
    output[0, 1] += 0.5  # a token sent to another expert: its whole row moves
    output[1, 2, 0] += 1e-3  # a GEMM's rounding
    assert moe_routing.compare(output, reference) == {"deviation": pytest.approx(0.5), "moved_tokens": 1, "tokens": 6}
    with pytest.raises(SystemExit, match="choose from default, cold, warm"):
        moe_routing.main(["--variants", "warm,hot"])


def test_moe_sensitivity_breaks_one_tie_the_other_way_and_counts_dropped_choices() -> None:
    import torch

    from benchmarks import moe_sensitivity

    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0], [3.0, 2.0, 0.5, 0.0], [0.0, 1.0, 1.0, 1.0]], dtype=torch.bfloat16)
    chosen, _ = moe_sensitivity._routing(logits, 2)
    nudged, _ = moe_sensitivity._routing(moe_sensitivity._nudge_first_tie(logits, 2), 2)
    # Token 0's second place is a tie (experts 1 and 2): it goes the other way; token 1 has no
    # tie; token 2's tie is not the first, so it stays.
    assert (nudged != chosen).any(-1).tolist() == [True, False, False]
    # The experts come first choice first, the order MoE.forward gives them their slots in.
    first_then_second, _ = moe_sensitivity._routing(torch.tensor([[0.0, 2.0, 1.0, 3.0]]), 2)
    assert first_then_second.tolist() == [[3, 1]]
    experts = torch.tensor([[0, 1], [0, 1], [0, 2]])  # three tokens, top-2, expert 0 first for all
    slots = moe_sensitivity._slots(experts, 3, capacity=2)
    # Slot-major: the first choices (experts 0, 0, 0), then the second (1, 1, 2); slot = expert * 2 + position.
    assert slots.tolist() == [0, 1, -1, 2, 3, 4]  # expert 0's third token is past its capacity: dropped


def test_startup_skips_a_model_whose_library_is_missing_and_busies_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import startup

    monkeypatch.setitem(startup.MODELS, "absent", startup.Model("examples/mlp.py", ("no_such_library_here",)))
    assert startup.missing_library("absent") == "absent: skipped, no_such_library_here is not installed"
    assert startup.missing_library("mlp") is None
    assert startup.busy(0.0) == 0 and startup.busy(0.01) >= 1
    assert set(startup.DEFAULT_MODELS) == {"resnet50", "vit", "lm_train", "mlp"}
    assert all((REPO / startup.MODELS[name].path).is_file() for name in startup.MODELS)


def test_headline_renders_one_runs_table_between_the_markers(tmp_path: Path) -> None:
    from benchmarks import headline

    other = {**_startup_run(), "label": "older", "commit": "0000000", "date": "2026-12-01T00:00:00+00:00"}
    split = {**_startup_run(), "label": "nvidia-h100: vit", "models": {"vit": {
        "path": "examples/vit_hf.py", "skipped": "vit: skipped, transformers is not installed"}}}
    results = tmp_path / "startup.json"
    results.write_text(json.dumps({"benchmark": "startup", "runs": [other, _startup_run(), split]}))
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n## Headline figures\n\nold figures\n\n## Documentation\n\nkept\n")
    assert headline.main(["--results", str(results), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "old figures" not in text and text.endswith("## Documentation\n\nkept\n")
    assert ("| small MLP (`examples/mlp.py`) | H100 80GB HBM3, torch 2.11.0, 2026-12-07 | 3/3/3 | "
            "11.0 s (10.0-12.0) | 20.0 s (19.0-21.0) | 8.0 s (7.0-9.0) | **0.73x** | 4.0 s (4.0-4.0) | "
            "14.0 s (14.0-14.0) | 2.0 s (2.0-2.0) | 0.50x |") in text
    assert "one commit (abc1234), the same machine,\n3 processes per figure" in text
    assert "Not measured in this run: vit (vit: skipped, transformers is not installed)." in text
    assert "[docs/results.md](docs/results.md)" in text and "0000000" not in text
    assert headline.main(["--results", str(results), "--readme", str(readme), "--check"]) == 0
    assert headline.rewrite(text, headline.START + "new" + headline.END).count("new") == 1
    with pytest.raises(SystemExit, match="differ in commit or machine"):
        headline.main(["--results", str(results), "--label", "older", "--label", "nvidia-h100: mlp", "--print"])


def test_headline_names_a_split_runs_calls_by_their_models_and_why_a_sweep_left_a_model_out(tmp_path: Path) -> None:
    from benchmarks import headline

    cut = {**_startup_run(), "label": "nvidia-h100: lm_train", "date": "2026-12-07T13:00:00+00:00", "models": {
        "lm_train": {"path": "examples/lm_train.py", "sweep": {"status": "timeout", "error": "timed out after 200 s"},
                     "scenarios": {}}}}
    results = tmp_path / "startup.json"
    results.write_text(json.dumps({"benchmark": "startup", "runs": [_startup_run(), cut]}))
    text = headline.section(json.loads(results.read_text()))
    assert "`python -m benchmarks.startup` in 2 device calls, `--models` `mlp`; `lm_train`" in text
    assert "Not measured in this run: lm_train (its sweep did not finish: timed out after 200 s)." in text


def test_headline_help_works_without_importing_torch() -> None:
    assert "--print" in help_without_torch("benchmarks.headline", REPO)


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


def test_startup_baseline_runs_the_warm_start_from_another_versions_folder(tmp_path: Path) -> None:
    from benchmarks import startup

    with pytest.raises(SystemExit, match="make one with `bash benchmarks/baseline_code.sh COMMIT"):
        startup.main(["--baseline", str(tmp_path / "nowhere")])
    folder = tmp_path / "base"
    for made in ("autotune/__init__.py", "benchmarks/startup.py"):
        (folder / made).parent.mkdir(parents=True, exist_ok=True)
        (folder / made).write_text("")
    (folder / startup.BASELINE_COMMIT).write_text("abc1234\n")
    assert startup.baseline_folder(str(folder)) == folder.resolve()
    assert startup.baseline_name(folder) == "abc1234"
    assert startup._code_for("warm-start", folder) == (harness.REPO, "warm-start")
    assert startup._code_for("baseline", folder) == (folder, "warm-start")
    assert (folder / "examples" / "mlp.py").is_file()  # the model files under the same relative paths


def test_baseline_code_makes_a_folder_whose_processes_import_that_versions_code(tmp_path: Path) -> None:
    from benchmarks import startup

    folder = tmp_path / "head"
    made = subprocess.run(["bash", "benchmarks/baseline_code.sh", "HEAD", str(folder)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    assert startup.baseline_name(startup.baseline_folder(str(folder))) == commit.stdout.strip()
    code, _ = startup._code_for("baseline", folder)
    where = ("import autotune, autotune.cache.store, autotune.workers, benchmarks.startup\n"
             "print(autotune.__file__, autotune.cache.store.__file__, autotune.workers.__file__, "
             "benchmarks.startup.__file__)")
    imported = subprocess.run([sys.executable, "-c", where], cwd=code, env=harness.child_env(tmp_path / "c", None, code),
                              capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr[-2000:]
    assert all(Path(f).resolve().is_relative_to(folder.resolve()) for f in imported.stdout.split())
