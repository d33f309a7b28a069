"""benchmarks.conformance: the zoo registry, the plan, resuming and the budget (with a
stand-in for the child processes), the table and goals, and the CPU subset end to end."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from factories import help_without_torch

from benchmarks import conformance, harness

REPO = Path(__file__).resolve().parents[1]
MODULE = [sys.executable, "-m", "benchmarks.conformance"]


@pytest.fixture(scope="module")
def conf() -> ModuleType:
    return conformance


def _saved(path: Path) -> dict[str, Any]:
    """The one run of a results file."""
    (run,) = harness.load(path)["runs"]
    return run


def test_help_and_bad_input_without_torch() -> None:
    out = help_without_torch("benchmarks.conformance", REPO)
    assert "--baselines" in out and "mlp_mixer" in out
    bad = subprocess.run([*MODULE, "--models", "resnet50,nope"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()] and "unknown nope" in bad.stderr


def test_zoo_registry_and_stubs(conf: ModuleType, tmp_path: Path) -> None:
    zoo = conf.zoo
    assert len([e for e in zoo.ZOO.values() if e.library != "torch"]) >= 12
    assert {"resnet50", "vit_b_16", "swin_t", "bert", "t5", "llama", "whisper_encoder", "gpt2", "unet"} <= set(zoo.ZOO)
    assert zoo.CPU_SUBSET and all(zoo.ZOO[name].library == "torch" for name in zoo.CPU_SUBSET)
    train = zoo.write_stub("mlp_mixer", "train", tmp_path)
    infer = zoo.write_stub("mlp_mixer", "infer", tmp_path)
    assert conf.ct.is_training_file(train) and not conf.ct.is_training_file(infer)


def test_stubs_name_what_dynamic_true_makes_dynamic(conf: ModuleType, tmp_path: Path) -> None:
    """`--dynamic` must capture what a dynamic=True job compiles: every input dimension the
    weights leave free (an image's batch, height and width; each token input's batch and length)."""
    zoo = conf.zoo

    def named(name: str) -> object:
        namespace: dict[str, object] = {}
        text = zoo.write_stub(name, "infer", tmp_path).read_text()
        exec(next(line for line in text.splitlines() if line.startswith("DYNAMIC_DIMS")), namespace)
        return namespace["DYNAMIC_DIMS"]

    assert named("mlp_mixer") == named("resnet50") == {0: (0, 2, 3)}
    assert named("t5") == {0: (0, 1), 1: (0, 1)} and named("gpt2") == {0: (0, 1)}
    assert named("whisper_encoder") == named("vit_b_16") == {0: (0,)}  # sizes checked in Python


def test_plan_orders_rows_and_baselines(conf: ModuleType) -> None:
    keys = [s.key for s in conf.plan(["mlp_mixer"], ["infer"], ["static", "auto"], "static")]
    assert keys == ["sweep", "warm/static", "default/static", "cold/static", "warm/auto"]
    keys = [s.key for s in conf.plan(["mlp_mixer"], ["infer", "train"], ["dynamic"], "all")]
    assert keys == ["sweep", "warm/dynamic", "default/dynamic", "cold/dynamic"] * 2
    assert [s.key for s in conf.plan(["unet"], ["train"], ["auto"], "none")] == ["sweep", "warm/auto"]


def _fake_result(step: Any) -> dict[str, Any]:
    if step.kind == "sweep":
        if step.model == "unet":
            return {"status": "error", "error": "sweep exited 2", "stderr_tail": "Error: unet.py: example() failed",
                    "process_wall_s": 5.0}
        return {"status": "ok", "found": 2, "tuned": 2, "failed": 0, "statuses": {"ok": 2}, "process_wall_s": 50.0}
    result: dict[str, Any] = {"status": "ok", "first_call_s": 10.0 if step.kind == "warm" else 20.0,
                              "median_ms": 1.0, "min_ms": 0.9, "process_wall_s": 15.0,
                              "bench": {"gemm_autotune": 0 if step.dynamic == "static" else 2}}
    if step.kind == "warm":
        result["hook"] = {"hits": 4, "misses": 0 if step.dynamic == "static" else 2, "errors": 0}
    return result


def _run(conf: ModuleType, tmp_path: Path, budget: float, report: dict[str, Any] | None = None,
         latency_processes: int = 1) -> Any:
    args = argparse.Namespace(budget=budget, timeout=600.0, runs=3, warmup=1, log_dir=None,
                              dynamics=["static", "auto"], baselines="static", retry_errors=False, keep_caches=False,
                              latency_processes=latency_processes)
    return conf.Run(args, "cpu", "cpu", tmp_path, report or {"models": {}}, time.monotonic())


def _recording_execute(conf: ModuleType, ran: list[str]) -> Any:
    """``execute`` without processes: each step's name goes into ``ran``, a sweep leaves its database."""
    def fake_execute(run: Any, step: Any, timeout: float) -> dict[str, Any]:
        ran.append(step.name)
        if step.kind == "sweep":
            run.cache_path(step.model, step.mode).write_text("db")
            return {**_fake_result(step), "batch_sizes": conf.sweep_sizes(run, step.model)}
        return _fake_result(step)

    return fake_execute


def test_resume_budget_and_failures(conf: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    monkeypatch.setattr(conf, "execute", _recording_execute(conf, ran))
    monkeypatch.setattr(conf.zoo.Entry, "available", lambda self: self.library != "timm")
    steps = conf.plan(["mlp_mixer", "unet", "timm_regnety_016"], ["infer"], ["static", "auto"], "static")
    (tmp_path / "conformance_cpu_work").mkdir()

    # A budget that fits the first step only: the rest are recorded as skipped.
    run = _run(conf, tmp_path, budget=20.0)
    conf.run_steps(run, steps)
    assert ran == ["mlp_mixer infer sweep"] and run.incomplete > 0
    saved = _saved(run.json_path)
    assert saved["models"]["mlp_mixer"]["modes"]["infer"]["steps"]["warm/static"]["status"] == "skipped"
    assert saved["models"]["timm_regnety_016"]["status"] == "unavailable"
    assert "budget" in run.md_path.read_text()

    # Resumed with time enough: only what is missing runs; a failed sweep leaves its warm
    # starts as errors (not run) but its baselines still run.
    ran.clear()
    run = _run(conf, tmp_path, budget=10_000.0, report=saved)
    conf.run_steps(run, steps)
    assert "mlp_mixer infer sweep" not in ran and "mlp_mixer infer warm/auto" in ran
    assert "unet infer warm/static" not in ran and "unet infer default/static" in ran
    unet = run.report["models"]["unet"]["modes"]["infer"]["steps"]
    assert unet["warm/static"]["status"] == "error" and "Error: unet.py" in unet["warm/static"]["error"]
    assert run.incomplete == 0
    assert not run.cache_path("mlp_mixer", "infer").exists()  # its warm starts are done: the database went

    # Nothing left to do; without the sweep's database the sweep runs again first.
    ran.clear()
    conf.run_steps(run, steps)
    assert ran == []
    run.report["models"]["mlp_mixer"]["modes"]["infer"]["steps"].pop("warm/auto")
    conf.run_steps(run, steps)
    assert ran == ["mlp_mixer infer sweep", "mlp_mixer infer warm/auto"]

    # A sweep that captured batch B only is stale for a dynamic mode's warm start (it needs 2B).
    ran.clear()
    run.report["models"]["mlp_mixer"]["modes"]["infer"]["steps"]["sweep"]["batch_sizes"] = [2]
    run.report["models"]["mlp_mixer"]["modes"]["infer"]["steps"].pop("warm/auto")
    conf.run_steps(run, steps)
    assert ran == ["mlp_mixer infer sweep", "mlp_mixer infer warm/auto"]

    # --retry-errors runs the failed sweep again, and the warm starts it left undone.
    ran.clear()
    run.args.retry_errors = True
    conf.run_steps(run, steps)
    assert ran == ["unet infer sweep"]  # it fails again: its warm starts are errors again, not run


def test_the_budget_counts_each_process_a_latency_is_timed_in(conf: ModuleType, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    monkeypatch.setattr(conf, "execute", _recording_execute(conf, ran))
    steps = conf.plan(["mlp_mixer"], ["infer"], ["static"], "static")
    (tmp_path / "conformance_cpu_work").mkdir()
    # Before any like step has run, a CPU warm start is reckoned at 30 s, a cold compile at 40 s:
    # timed in 3 processes, 90 s fits a budget of 100 s and 120 s does not.
    run = _run(conf, tmp_path, budget=100.0, latency_processes=3)
    conf.run_steps(run, steps)
    assert ran == ["mlp_mixer infer sweep", "mlp_mixer infer warm/static", "mlp_mixer infer default/static"]
    cold = run.report["models"]["mlp_mixer"]["modes"]["infer"]["steps"]["cold/static"]
    assert cold["status"] == "skipped" and "~120 s needed" in cold["reason"]


def test_dynamic_true_rows_get_a_dynamic_sweep(conf: ModuleType, tmp_path: Path) -> None:
    """dynamic=True compiles graphs only `--dynamic` captures; static and auto need the plain sweep."""
    run = _run(conf, tmp_path, budget=1.0)
    b = conf.zoo.ZOO["mlp_mixer"].batch("cpu")
    run.args.dynamics = ["static", "auto", "dynamic"]
    assert conf.sweep_passes(run, "mlp_mixer") == [["--batch-sizes", f"{b},{2 * b}"],
                                                   ["--dynamic", "--batch-sizes", str(b)]]
    run.args.dynamics = ["dynamic"]
    assert conf.sweep_passes(run, "mlp_mixer") == [["--dynamic", "--batch-sizes", str(b)]]
    run.args.dynamics = ["static"]
    assert conf.sweep_passes(run, "mlp_mixer") == [["--batch-sizes", str(b)]]
    merged = conf.merge_sweeps([
        {"status": "ok", "command": "sweep a", "found": 4, "tuned": 4, "failed": 0, "wall_s": 10.0,
         "statuses": {"ok": 4}},
        {"status": "ok", "command": "sweep a --dynamic", "found": 3, "tuned": 2, "failed": 1, "wall_s": 5.0,
         "statuses": {"ok": 2, "key_mismatch": 1}}])
    assert (merged["found"], merged["tuned"], merged["failed"], merged["wall_s"]) == (7, 6, 1, 15.0)
    assert merged["statuses"] == {"ok": 6, "key_mismatch": 1} and merged["command"].endswith("--dynamic")


def test_a_sweep_with_failed_requests_is_data(conf: ModuleType) -> None:
    failed = conf._sweep_result({"status": "error", "error": "sweep exited 1", "rc": 1, "found": 3, "failed": 1})
    assert failed["status"] == "ok" and "1 requests failed" in failed["note"]
    broken = conf._sweep_result({"status": "error", "error": "sweep exited 2", "rc": 2})
    assert broken["status"] == "error"


def test_rows_and_goals(conf: ModuleType) -> None:
    zero = {"gemm_autotune": 0, "pointwise_autotune": 0, "coordinate_descent": 0, "benchmarker_calls": 0}
    steps = {
        "sweep": {"status": "error", "error": "sweep exited 1", "found": 6, "tuned": 5, "failed": 1,
                  "statuses": {"ok": 5, "key_mismatch": 1}},
        "warm/static": {"status": "ok", "first_call_s": 8.0, "kernel_us_per_call": 1010.0, "bench": zero,
                        "hook": {"hits": 3, "misses": 0, "errors": 0}, "deviation": {"relative": 0.25}},
        "default/static": {"status": "ok", "first_call_s": 10.0, "deviation": {"relative": 0.008}},
        "cold/static": {"status": "ok", "first_call_s": 50.0, "kernel_us_per_call": 1000.0,
                        "deviation": {"relative": 0.008}},
        "warm/auto": {"status": "ok", "first_call_s": 9.0, "kernel_us_per_call": 1500.0, "bench": zero,
                      "hook": {"hits": 3, "misses": 2, "errors": 0},
                      "recompile": {"seconds": 4.0, "graphs": 1, "bench": {**zero, "gemm_autotune": 2},
                                    "hook": {"hits": 0, "misses": 2}}},
    }
    report = {"device": "cuda", "machine": {"gpu": "H100"}, "models": {
        "resnet50": {"library": "torchvision", "status": "available",
                     "modes": {"infer": {"batch": 16, "steps": steps}}},
        "timm_maxvit_tiny": {"library": "timm", "status": "unavailable", "reason": "timm is not installed"}}}
    table = {(r["model"], r["dynamic"]): r for r in conf.rows(report)}
    static, auto = table[("resnet50", "static")], table[("resnet50", "auto")]
    assert static["status"] == "error" and static["key_mismatch"] == 1 and static["first_ratio"] == 0.8
    assert static["latency_ratio"] == pytest.approx(1.01)
    assert static["deviation"] == {"default": 0.008, "cold": 0.008, "warm": 0.25}  # each compile's, from eager
    assert conf.ct.benchmark_total(auto["benchmarks"]) == 2 and auto["cold_basis"] == "static"
    assert table[("timm_maxvit_tiny", "-")]["status"] == "unavailable"
    by_goal = {(g["goal"], g["scope"]): g for g in conf.goals(conf.rows(report))}
    assert by_goal[("0 key_mismatch", "every sweep")]["met"] is False
    assert by_goal[("100% of requests hit at warm start", "auto")]["failing"] == []  # an error row is not judged
    text = "\n".join(conf.render(report))
    assert "| resnet50 | torchvision | infer | auto |" in text and "(vs static)" in text
    assert "| 0.80% | 0.80% | 25.00% |" in text
    assert "| timm_maxvit_tiny | timm | - | - | unavailable |" in text and "timm is not installed" in text
    assert "NOT met" in text


def test_a_baseline_that_timed_out_leaves_the_warm_start_judged(conf: ModuleType) -> None:
    """Swin-T's cold max-autotune outlasted its device call (an H200, 2026-11-26): its row is
    an error, but the sweep and the warm start ran, so its hits and benchmarks are judged."""
    zero = {"gemm_autotune": 0, "pointwise_autotune": 0, "coordinate_descent": 0, "benchmarker_calls": 0}
    steps = {"sweep": {"status": "ok", "found": 29, "tuned": 29, "failed": 0, "statuses": {"ok": 29}},
             "warm/static": {"status": "ok", "first_call_s": 33.7, "kernel_us_per_call": 876.0, "bench": zero,
                             "hook": {"hits": 73, "misses": 0, "errors": 0}},
             "cold/static": {"status": "timeout", "error": "timed out after 370 s"}}
    report = {"device": "cuda", "machine": {"gpu": "H200"}, "models": {"swin_t": {
        "library": "torchvision", "status": "available", "modes": {"infer": {"batch": 8, "steps": steps}}}}}
    (row,) = conf.rows(report)
    assert row["status"] == "error" and "370 s" in row["error"]
    by_goal = {(g["goal"], g["scope"]): g for g in conf.goals([row])}
    assert by_goal[("100% of requests hit at warm start", "static")]["met"] is True
    assert by_goal[("0 benchmarks at warm start", "static")]["met"] is True
    assert by_goal[("latency within 3% of cold max-autotune", "static")]["met"] is None  # no cold latency


@pytest.mark.slow
def test_cpu_subset_end_to_end(tmp_path: Path) -> None:
    """A real sweep and a real warm-start process on the CPU subset's tiny model(s), static
    shapes (the dynamic modes are served end to end in tests/test_dynamic.py; here they
    would double a CPU sweep's minutes)."""
    out = tmp_path / "out"
    cmd = [*MODULE, "--subset", "cpu", "--modes", "infer", "--dynamics", "static",
           "--baselines", "none", "--runs", "3", "--warmup", "1", "--budget", "1800", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    report = _saved(out / "conformance.json")
    conf = conformance
    table = {(r["model"], r["mode"], r["dynamic"]): r for r in conf.rows(report)}
    assert set(table) == {(m, "infer", "static") for m in conf.zoo.CPU_SUBSET}
    for model in conf.zoo.CPU_SUBSET:
        static = table[(model, "infer", "static")]
        assert static["status"] == "ok", static
        assert static["found"] > 0 and static["key_mismatch"] == 0 and static["failed"] == 0
        assert static["hits"] > 0 and static["misses"] == 0, static  # every request hit...
        assert conf.ct.benchmark_total(static["benchmarks"]) == 0, static  # ...and nothing was benchmarked
        assert static["deviation"]["warm"] is not None and static["deviation"]["warm"] < 1e-3, static
    text = (out / "conformance.md").read_text()
    assert "| goal |" in text and f"| {conf.zoo.CPU_SUBSET[0]} | torch | infer | static |" in text


def test_a_sweep_killed_in_its_second_pass_resumes_there(conf: ModuleType, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The device tool ends a command at 10 minutes: the passes already done are kept (with
    the database they filled) and a re-run starts at the pass that did not finish."""
    calls: list[list[str]] = []
    kill_dynamic = [True]

    def fake_sweep(model_run: Any, options: argparse.Namespace, log_path: Any) -> dict[str, Any]:
        calls.append(list(options.sweep_arg))
        if "--dynamic" in options.sweep_arg and kill_dynamic[0]:
            raise KeyboardInterrupt  # the command is killed: nothing after this line runs
        Path(model_run.cache_url.removeprefix("sqlite:///")).write_text("db")
        found = 3 if "--dynamic" in options.sweep_arg else 4
        return {"status": "ok", "found": found, "tuned": found, "failed": 0, "statuses": {"ok": found},
                "command": "sweep " + " ".join(options.sweep_arg)}

    monkeypatch.setattr(conf.ct, "run_sweep", fake_sweep)
    steps = [s for s in conf.plan(["mlp_mixer"], ["infer"], ["static", "dynamic"], "none") if s.kind == "sweep"]
    run = _run(conf, tmp_path, budget=10_000.0)
    run.args.dynamics = ["static", "dynamic"]
    with pytest.raises(KeyboardInterrupt):
        conf.run_steps(run, steps)
    saved = _saved(run.json_path)
    assert list(saved["models"]["mlp_mixer"]["modes"]["infer"]["sweep_passes"]) == [" ".join(calls[0])]

    kill_dynamic[0] = False
    calls.clear()
    run = _run(conf, tmp_path, budget=10_000.0, report=saved)
    run.args.dynamics = ["static", "dynamic"]
    conf.run_steps(run, steps)
    assert calls == [["--dynamic", "--batch-sizes", str(conf.zoo.ZOO["mlp_mixer"].batch("cpu"))]]
    group = run.report["models"]["mlp_mixer"]["modes"]["infer"]
    assert (group["steps"]["sweep"]["found"], group["steps"]["sweep"]["dynamic"]) == (7, True)
    assert "sweep_passes" not in group


def test_each_pass_of_a_sweep_keeps_its_own_log(conf: ModuleType, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """One log for both passes kept only the second's output; a sweep resumed over two device
    calls lost the first pass's (an H100 zoo run, 114-116)."""
    logs: list[str] = []

    def fake_sweep(model_run: Any, options: argparse.Namespace, log_path: Any) -> dict[str, Any]:
        logs.append(Path(log_path).name)
        Path(model_run.cache_url.removeprefix("sqlite:///")).write_text("db")
        return {"status": "ok", "found": 1, "tuned": 1, "failed": 0, "statuses": {"ok": 1}, "command": "sweep"}

    monkeypatch.setattr(conf.ct, "run_sweep", fake_sweep)
    steps = [s for s in conf.plan(["mlp_mixer"], ["infer"], ["static", "dynamic"], "none") if s.kind == "sweep"]
    run = _run(conf, tmp_path, budget=10_000.0)
    run.args.dynamics, run.args.log_dir = ["static", "dynamic"], str(tmp_path / "logs")
    conf.run_steps(run, steps)
    assert logs == ["cpu-mlp_mixer-infer-sweep-1.log", "cpu-mlp_mixer-infer-sweep-2.log"]


def test_a_sweep_cut_in_its_teardown_after_its_report_is_done(conf: ModuleType, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep prints its report once everything is stored; one killed after that, in Ray's
    teardown, did its work (a T5 sweep, 448 s, was counted a timeout so, run 114). One killed
    before its report timed out. Real child processes, with a stand-in for the CLI."""
    report = json.dumps({"totals": {"found": 2, "cached": 0, "tuned": 2, "failed": 0}, "requests": []})
    model_run = conf.ct.ModelRun("m", "m.py", ["sweep"], tmp_path, f"sqlite:///{tmp_path / 'c.db'}", train=False)
    options = argparse.Namespace(timeout=3.0, batch_size=None, sweep_arg=None)
    for before, status in ((f"print({report!r}, flush=True); ", "ok"), ("", "timeout")):
        cli = [sys.executable, "-c", f"import time; {before}time.sleep(60)"]
        monkeypatch.setattr(harness, "AUTOTUNE", cli)
        result = conf.ct.run_sweep(model_run, options, None)
        assert result["status"] == status, result
    assert result["error"] == "timed out after 3 s"


def test_a_cut_sweep_is_told_to_stop_and_its_retry_goes_on_from_its_database(
        conf: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep past its deadline gets SIGTERM first (its end-to-end pass then stores the kernel
    configs it tuned: T5's --dynamic sweep was cut twice at ~520 s, runs 120-121, and kept
    nothing), and --retry-errors runs it again on the database it left, not a fresh one."""
    stored = tmp_path / "stored"
    model_run = conf.ct.ModelRun("m", "m.py", ["sweep"], tmp_path, f"sqlite:///{tmp_path / 'c.db'}", train=False)
    options = argparse.Namespace(timeout=3.0, batch_size=None, sweep_arg=None)
    stand_in = (f"import signal, sys, time, pathlib; signal.signal(signal.SIGTERM, lambda *a: "
                f"(pathlib.Path({str(stored)!r}).write_text('kept'), sys.exit(0))); time.sleep(60)")
    monkeypatch.setattr(harness, "AUTOTUNE", [sys.executable, "-c", stand_in])
    assert conf.ct.run_sweep(model_run, options, None)["status"] == "timeout"
    assert stored.read_text() == "kept"  # stopped, not killed

    seen: list[str] = []

    def fake_sweep(model_run: Any, options: argparse.Namespace, log_path: Any) -> dict[str, Any]:
        db = Path(model_run.cache_url.removeprefix("sqlite:///"))
        seen.append(db.read_text() if db.exists() else "fresh")
        db.write_text("tuned before the cut")
        return {"status": "timeout", "error": "timed out after 3 s"} if len(seen) == 1 else \
            {**conf.ct._sweep_totals({"totals": {"found": 1, "cached": 1, "tuned": 0, "failed": 0},
                                      # its cut pass began again beside capture
                                      "timeline": {"resumed_pass_go": 3.5, "capture_done": 40.0}}),
             "status": "ok", "statuses": {"cached": 1}, "command": "sweep"}

    monkeypatch.setattr(conf.ct, "run_sweep", fake_sweep)
    steps = [s for s in conf.plan(["mlp_mixer"], ["infer"], ["dynamic"], "none") if s.kind == "sweep"]
    run = _run(conf, tmp_path, budget=10_000.0)
    run.args.dynamics, run.args.retry_errors = ["dynamic"], True
    conf.run_steps(run, steps)
    conf.run_steps(run, steps)
    assert seen == ["fresh", "tuned before the cut"]
    assert "resumed" in run.report["models"]["mlp_mixer"]["modes"]["infer"]["steps"]["sweep"]
    entry = run.report["models"]["mlp_mixer"]
    row = conf._row(entry, "mlp_mixer", "infer", "dynamic", entry["modes"]["infer"])
    assert row["tuned"] == 0 and "resumed from a cut sweep (1 of 1 requests stored by then)" in conf._notes(row)
    assert "its cut end-to-end pass went on beside capture" in conf._notes(row)


def test_a_sweeps_passes_share_the_steps_time(conf: ModuleType, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The second pass (--dynamic) gets what the first left of the step's timeout, not all of
    it again: given it all, it ran past the budget and the device call (an H100, 2026-11-26)."""
    timeouts: list[float] = []

    def fake_sweep(model_run: Any, options: argparse.Namespace, log_path: Any) -> dict[str, Any]:
        timeouts.append(options.timeout)
        time.sleep(0.5)  # the first pass's time, taken from the second's
        Path(model_run.cache_url.removeprefix("sqlite:///")).write_text("db")
        return {"status": "ok", "found": 1, "tuned": 1, "failed": 0, "statuses": {"ok": 1}, "command": "sweep"}

    monkeypatch.setattr(conf.ct, "run_sweep", fake_sweep)
    steps = [s for s in conf.plan(["mlp_mixer"], ["infer"], ["static", "dynamic"], "none") if s.kind == "sweep"]
    run = _run(conf, tmp_path, budget=10_000.0)
    run.args.dynamics = ["static", "dynamic"]
    conf.run_steps(run, steps)
    assert len(timeouts) == 2 and timeouts[0] == pytest.approx(run.args.timeout, abs=0.1), timeouts
    assert timeouts[1] <= timeouts[0] - 0.5, timeouts


def test_device_queues_share_the_invocations_no_gpu_was_given(tmp_path: Path) -> None:
    """benchmarks/device_conformance_queues.sh: each GPU runs its own invocations, then takes
    shared ones (any:ARGS) until none is left; each shared one runs once, into a folder named
    after its arguments, so the next call resumes it on whichever GPU takes it. A stand-in
    for python records what ran where."""
    bin_dir, ran = tmp_path / "bin", tmp_path / "ran.txt"
    bin_dir.mkdir()
    fake = bin_dir / "python"
    fake.write_text("#!/usr/bin/env bash\n"
                    f"echo \"$CUDA_VISIBLE_DEVICES|$*\" >> {ran}\n"
                    "while [ $# -gt 0 ]; do [ \"$1\" = --out ] && mkdir -p \"$2\"; shift; done\n"
                    "sleep 0.3\n")
    fake.chmod(0o755)
    shared = [f"any:--models m{i}" for i in range(4)]
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path / "out"),
           "ZOO": str(tmp_path / "zoo"), "GPUS": "2", "BUDGET": "600"}
    (tmp_path / "out").mkdir()
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "device_conformance_queues.sh"), "0:--models own0",
                           "1:--models own1", "1:--models own1b", *shared],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [(gpu, args.removeprefix("-m benchmarks.conformance "))
             for gpu, args in (line.split("|") for line in ran.read_text().splitlines())]
    where = {args.split(" --budget")[0]: gpu for gpu, args in lines}
    assert len(lines) == 7 and len(where) == 7  # every invocation once
    assert (where["--models own0"], where["--models own1"], where["--models own1b"]) == ("0", "1", "1")
    assert {where[f"--models m{i}"] for i in range(4)} <= {"0", "1"}
    outs = {args.split(" --budget")[0]: args.split("--out ")[1].split()[0] for _, args in lines}
    assert outs["--models own1"].endswith("/g1") and Path(outs["--models m0"]).name.startswith("s")
    assert len({outs[f"--models m{i}"] for i in range(4)}) == 4
    assert (tmp_path / "out" / "zoo.tgz").exists()


def test_merge_joins_one_queue_per_gpu_and_keeps_each_machine_apart(conf: ModuleType, tmp_path: Path) -> None:
    machine = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130"}

    def results(name: str, models: dict[str, Any], date: str, **extra: Any) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps({"machine": {**machine, **extra}, "invocations": [{"date": date, "argv": name}],
                                    "models": models}))
        return path

    def row(*steps: str) -> dict[str, Any]:
        return {"library": "torch", "modes": {"infer": {"batch": 8, "steps": {s: {"status": "ok"} for s in steps}}}}

    first = results("g0.json", {"gpt2": row("sweep", "warm/static"), "bert": row("sweep")}, "2026-11-26T09:30")
    second = results("g1.json", {"bert": row("warm/static", "cold/static"), "t5": row("sweep")}, "2026-11-26T09:20")
    out = tmp_path / "out"
    assert conf.main(["--merge", str(first), str(second), "--out", str(out)]) == 0
    merged = _saved(out / "conformance.json")
    assert set(merged["models"]) == {"gpt2", "bert", "t5"}
    assert set(merged["models"]["bert"]["modes"]["infer"]["steps"]) == {"sweep", "warm/static", "cold/static"}
    assert [i["argv"] for i in merged["invocations"]] == ["g1.json", "g0.json"]  # in time order
    # A queue folder seeded with the table carries the table's invocations: listed once
    seeded = json.loads(second.read_text())
    seeded["invocations"] = merged["invocations"] + [{"date": "2026-11-26T10:00", "argv": "g2"}]
    second.write_text(json.dumps(seeded))
    (again,) = conf.merge_files([out / "conformance.json", second])
    assert [i["argv"] for i in again["invocations"]] == ["g1.json", "g0.json", "g2"]
    assert (out / "conformance.md").read_text().startswith("# ")
    other = results("h100.json", {}, "2026-11-26T09:40", gpu="NVIDIA H100 80GB HBM3")
    assert conf.main(["--merge", str(first), str(other), "--out", str(out)]) == 0
    assert [r["label"] for r in harness.load(out / "conformance.json")["runs"]] == ["nvidia-h200", "nvidia-h100-80gb-hbm3"]
    newer = results("newer.json", {}, "2026-11-26T09:50", torch="2.12.0")
    assert conf.main(["--merge", str(first), str(newer), "--out", str(out)]) == 2


def test_merge_keeps_the_tables_host_and_lists_another_host_its_rows_ran_on(conf: ModuleType, tmp_path: Path) -> None:
    """2026-11-29: two rows run on a 2x H200 host (32 cores) merged into a table of 1x H200 hosts
    (16 cores) made the whole table's header name the 32-core host."""
    def results(name: str, cores: int, model: str) -> Path:
        path = tmp_path / name
        machine = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "cpu_count": cores}
        path.write_text(json.dumps({"machine": machine, "invocations": [{"date": name, "argv": name}],
                                    "models": {model: {"modes": {"infer": {"steps": {"sweep": {"status": "ok"}}}}}}}))
        return path

    table, wider, again = results("t.json", 16, "bert"), results("w.json", 32, "t5"), results("a.json", 32, "gpt2")
    out = tmp_path / "out"
    assert conf.main(["--merge", str(table), str(wider), str(again), "--out", str(out)]) == 0
    (run,) = harness.load(out / "conformance.json")["runs"]
    assert run["machine"]["cpu_count"] == 16 and set(run["models"]) == {"bert", "t5", "gpt2"}
    assert len(run["other_hosts"]) == 1 and "(32 cores)" in run["other_hosts"][0]
    markdown = (out / "conformance.md").read_text()
    assert "- machine: NVIDIA H200 x1; - (16 cores)" in markdown and "- also on: NVIDIA H200 x1; - (32 cores)" in markdown
    (alone,) = conf.merge_files([table])
    assert "other_hosts" not in alone


def test_merge_keeps_what_a_cut_call_did_not_redo_and_files_a_narrower_sweep_by_its_dynamic_mode(
        conf: ModuleType, tmp_path: Path) -> None:
    """Runs 117-119: a device call that ran out of time left its warm starts "skipped", and a
    re-run of MLP-Mixer with `--dynamics dynamic` alone swept only the dynamic=True graphs. Neither
    may blank or replace what an earlier call measured for the other rows."""
    machine = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130"}

    def results(name: str, steps: dict[str, Any], date: str) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps({"machine": machine, "invocations": [{"date": date, "argv": name}],
                                    "models": {"mlp_mixer": {"library": "torch",
                                                             "modes": {"infer": {"batch": 64, "steps": steps}}}}}))
        return path

    def warm(hits: int, misses: int) -> dict[str, Any]:
        return {"status": "ok", "hook": {"hits": hits, "misses": misses, "errors": 0}}

    sweep = "autotune sweep mlp_mixer_infer.py --cache sqlite:///m.db --json"
    full = {"status": "ok", "found": 27, "tuned": 27, "failed": 0, "statuses": {"ok": 27}, "batch_sizes": [64, 128],
            "dynamic": True, "command": f"{sweep} --batch-sizes 64,128 && {sweep} --dynamic --batch-sizes 64"}
    # batch_sizes as the run recorded it before the fix: the commands say what was captured
    narrow = {"status": "ok", "found": 9, "tuned": 9, "failed": 0, "statuses": {"ok": 9}, "batch_sizes": [64, 128],
              "dynamic": True, "command": f"{sweep} --dynamic --batch-sizes 64"}
    earlier = results("old.json", {"sweep": full, "warm/static": warm(20, 0), "warm/auto": warm(68, 0),
                                   "warm/dynamic": warm(33, 1)}, "2026-11-26T01:00")
    cut = results("cut.json", {"sweep": {"status": "timeout"}, "warm/static": {"status": "skipped", "reason": "budget"}},
                  "2026-11-27T01:00")
    later = results("new.json", {"sweep": narrow, "warm/dynamic": warm(34, 0)}, "2026-11-27T02:00")
    (merged,) = conf.merge_files([earlier, cut, later])
    steps = merged["models"]["mlp_mixer"]["modes"]["infer"]["steps"]
    assert steps["sweep"] == full and steps["warm/static"] == warm(20, 0)  # the cut call blanked nothing
    assert steps["sweep/dynamic"] == narrow and steps["warm/dynamic"] == warm(34, 0)
    table = {r["dynamic"]: r for r in conf.rows(merged)}
    assert set(table) == {"static", "auto", "dynamic"}  # sweep/dynamic is no row of its own
    assert (table["static"]["found"], table["auto"]["found"], table["dynamic"]["found"]) == (27, 27, 9)
    assert (table["dynamic"]["hits"], table["dynamic"]["misses"]) == (34, 0)
    mismatch = conf.goals(conf.rows(merged))[0]
    assert "0 of 36 requests in 2 sweeps" in json.dumps(mismatch)
    # A model split over two GPUs of one call: B and 2B on one, --dynamic at B on the other.
    auto = {**full, "found": 18, "dynamic": False, "command": f"{sweep} --batch-sizes 64,128"}
    first = results("auto.json", {"sweep": auto, "warm/auto": warm(68, 0)}, "2026-11-28T01:00")
    second = results("dyn.json", {"sweep": narrow, "warm/dynamic": warm(34, 0)}, "2026-11-28T01:00")
    split = conf.merge_files([first, second])[0]["models"]["mlp_mixer"]["modes"]["infer"]["steps"]
    assert (split["sweep"], split["sweep/dynamic"]) == (auto, narrow)


def test_a_retried_warm_start_cut_by_the_budget_keeps_its_finished_sweeps_database(
        conf: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs 126-128 (H100): T5's --dynamic sweep was cut in one call, so its warm start read
    'not run: the sweep failed'. The next call (--retry-errors) finished the sweep, and the
    warm start ran out of budget: it kept that stale error, the database was dropped as if the
    group were done, and the call after swept from nothing. Now the cut warm start reads
    'skipped', the database stays, and the retry runs the warm start alone."""
    ran: list[str] = []
    cut_warm = {"on": False}

    def fake_execute(run: Any, step: Any, timeout: float) -> dict[str, Any]:
        ran.append(step.name)
        if step.kind == "sweep":
            run.cache_path(step.model, step.mode).write_text("db")
            return {**_fake_result(step), "batch_sizes": [conf.zoo.ZOO[step.model].batch(run.device)], "dynamic": True}
        if cut_warm["on"]:
            return {"status": "timeout", "error": f"timed out after {timeout:.0f} s"}
        return _fake_result(step)

    monkeypatch.setattr(conf, "execute", fake_execute)
    steps = conf.plan(["mlp_mixer"], ["infer"], ["dynamic"], "none")
    (tmp_path / "conformance_cpu_work").mkdir()
    run = _run(conf, tmp_path, budget=10_000.0)
    run.args.dynamics, run.args.retry_errors, run.args.timeout = ["dynamic"], True, 600.0
    group = run.group("mlp_mixer", "infer")
    group["steps"]["sweep"] = {"status": "timeout", "error": "timed out after 500 s"}  # the first call's cut
    group["steps"]["warm/dynamic"] = {"status": "error", "error": "not run: the sweep failed (timed out after 500 s)"}
    run.cache_path("mlp_mixer", "infer").write_text("db")

    cut_warm["on"] = True
    run.steps_run, run.args.timeout = 0, 600.0
    monkeypatch.setattr(conf, "estimate_s", lambda *a: 1.0)
    monkeypatch.setattr(run, "left_s", lambda: 100.0)  # the warm start gets less than its timeout: the budget cuts it
    conf.run_steps(run, steps)
    assert ran == ["mlp_mixer infer sweep", "mlp_mixer infer warm/dynamic"]
    assert group["steps"]["warm/dynamic"]["status"] == "skipped"  # not the stale error
    assert run.cache_path("mlp_mixer", "infer").exists()  # the finished sweep's database stays

    ran.clear()
    cut_warm["on"] = False
    conf.run_steps(run, steps)
    assert ran == ["mlp_mixer infer warm/dynamic"]  # the sweep is not run again
    assert not run.cache_path("mlp_mixer", "infer").exists()  # the group is done now


def test_a_row_with_misses_names_them(conf: ModuleType) -> None:
    """A warm start that missed lists what it asked for (hook_stats.missed_entry): the row says which."""
    warm = {"status": "ok", "first_call_s": 79.4, "bench": {"gemm_autotune": 2},
            "hook": {"hits": 40, "misses": 2, "errors": 0,
                     "missed": [{"request": "conv 16x96x56x56 * 96x1x7x7 bf16", "exprs": [["s77"]]},
                                {"request": "addmm 50176x96 @ 96x384 + 50176x384 bf16", "exprs": []}]}}
    group = {"batch": 16, "steps": {"sweep": {"status": "ok", "found": 33, "tuned": 33, "failed": 0,
                                              "statuses": {"ok": 33}}, "warm/dynamic": warm}}
    row = conf._row({"library": "torchvision"}, "convnext_tiny", "infer", "dynamic", group)
    assert row["missed"] == ["conv 16x96x56x56 * 96x1x7x7 bf16", "addmm 50176x96 @ 96x384 + 50176x384 bf16"]
    assert "missed: addmm 50176x96 @ 96x384 + 50176x384 bf16, conv 16x96x56x56 * 96x1x7x7 bf16" in conf._notes(row)


def test_a_warm_start_from_before_fusion_verdicts_says_so(conf: ModuleType) -> None:
    """Runs 136-138 (H100): ConvNeXt-T's and ViT-B/16's static warm starts, taken on 11-25 and
    11-23 with isolated winners only, were judged against cold compiles of 11-27. A hook that
    served no fusion verdicts (0) is current; one without the stat predates them."""
    def row(hook: dict[str, Any]) -> dict[str, Any]:
        warm = {"status": "ok", "first_call_s": 23.3, "kernel_us_per_call": 1431.0, "bench": {"gemm_autotune": 0},
                "hook": {"hits": 41, "misses": 0, "errors": 0, **hook}}
        group = {"batch": 16, "steps": {"sweep": {"status": "ok", "found": 17, "tuned": 17, "failed": 0,
                                                  "statuses": {"ok": 17}}, "warm/static": warm,
                                        "cold/static": {"status": "ok", "kernel_us_per_call": 1336.0}}}
        return conf._row({"library": "torchvision"}, "convnext_tiny", "infer", "static", group)

    old, current = row({}), row({"fusion_verdicts_served": 0})
    assert old["predates_verdicts"] and "before fusion verdicts were served" in conf._notes(old)
    assert not current["predates_verdicts"] and "fusion verdicts" not in conf._notes(current)


def test_a_fresh_folder_starts_from_the_seed_table(conf: ModuleType, tmp_path: Path) -> None:
    """Runs 136-138: each queue's folder started from the committed table (--seed), so only the
    cold baselines it lacked ran. A folder's own results win over the seed; a seed of another
    GPU, or none at the path, is refused with a line naming it."""
    info = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130"}
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"machine": info, "models": {"bert": {"modes": {"infer": {"steps": {}}}}}}))
    fresh = tmp_path / "g0" / "conformance_nvidia-h100-80gb-hbm3.json"
    assert set(conf._load_report(fresh, False, info, table)["models"]) == {"bert"}
    assert conf._load_report(fresh, True, info, table) == {"models": {}}  # --no-resume wins
    fresh.parent.mkdir()
    fresh.write_text(json.dumps({"machine": info, "models": {"t5": {}}}))
    assert set(conf._load_report(fresh, False, info, table)["models"]) == {"t5"}
    with pytest.raises(conf.BadInput, match="--seed .*no such results file"):
        conf._load_report(tmp_path / "none.json", False, info, tmp_path / "missing.json")
    with pytest.raises(conf.BadInput, match="taken with gpu .*pass --seed the table of this machine"):
        conf._load_report(tmp_path / "none.json", False, {**info, "gpu": "NVIDIA H200"}, table)


def test_deviation_from_eager_is_the_largest_difference_over_the_largest_value() -> None:
    """benchmarks/deviation.py: what a zoo row's deviation columns show."""
    import torch

    from benchmarks import deviation

    eager = [torch.tensor([[1.0, -4.0], [2.0, 0.5]])]
    compiled = [torch.tensor([[1.0, -3.0], [2.0, 0.5]], dtype=torch.bfloat16)]
    assert deviation.compare(compiled, eager) == {"max_abs_diff": 1.0, "eager_max_abs": 4.0, "relative": 0.25}
    assert "differ in shape" in deviation.compare([torch.zeros(3)], [torch.zeros(2)])["error"]
    assert deviation.draws_random(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)))
    assert not deviation.draws_random(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.0)))
    model = torch.nn.Linear(2, 2)
    result = deviation.against_eager(deviation.snapshot(model(torch.ones(1, 2)).detach()),
                                     lambda: (model, (torch.ones(1, 2),)), train=False)
    assert result["relative"] == 0.0 and result["of"] == "output" and result["random"] is False
