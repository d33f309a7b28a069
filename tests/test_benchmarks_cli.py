"""benchmarks/compile_time.py without running a compile: its CLI, plan, phases, goals and report."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "compile_time.py"


@pytest.fixture(scope="module")
def ct() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compile_time_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_help_works_without_importing_torch() -> None:
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['compile_time.py', '--help']\n"
        "try:\n"
        f"    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "assert 'torch' not in sys.modules, 'the parent imported torch'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "warm-start-artifacts" in done.stdout and "--optimizer-step" in done.stdout


def test_scenario_list_adds_what_each_scenario_loads(ct: ModuleType) -> None:
    assert ct.scenario_list("floor", cache_given=False) == ["default-precompile", "floor"]
    assert ct.scenario_list("max-autotune-megacache-precompile,default", cache_given=False) == [
        "default", "max-autotune-cold", "max-autotune-megacache-precompile"]
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
    assert run.saves("max-autotune-cold") == (True, False)  # only the plain anchor: no caching_precompile
    assert run.saves("default") == (False, False)  # the goals' denominator runs as a plain default compile
    assert run.saves("default-precompile") == (True, True)
    flags, _ = ct._scenario_flags("default-precompile", run)
    assert "--save-artifacts" in flags and "--precompile" in flags
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


def test_child_env_drops_the_callers_keys(ct: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_TRUSTED_KEYS", "/somewhere.pub")
    monkeypatch.setenv("AUTOTUNE_SIGNING_KEY", "/somewhere")
    env = ct._child_env(tmp_path, None)
    assert "AUTOTUNE_TRUSTED_KEYS" not in env and "AUTOTUNE_SIGNING_KEY" not in env


def test_phases_add_up_to_the_first_call(ct: ModuleType) -> None:
    seconds = {
        "_compile.compile_inner": 10.0, "OutputGraph.call_user_compiler": 8.0, "create_aot_dispatcher_function": 7.5,
        "compile_fx_inner": 7.0, "fx_codegen_and_compile": 6.5, "_recursive_post_grad_passes": 0.5,
        "GraphLowering.run": 3.0, "GraphLowering.compile_to_module": 3.0, "GraphLowering.codegen": 1.0,
        "mm_template_autotuning": 2.0, "mm_template_precompiling": 0.5, "CachingAutotuner.benchmark_all_configs": 0.4,
    }
    phases = ct.derive_phases(seconds, first_call_s=12.0, setup_s=0.5)
    assert tuple(phases) == ct.PHASES
    assert phases["dynamo"] == 2.0 and phases["aot"] == 1.0 and phases["tune"] == pytest.approx(2.4)
    assert phases["lowering"] == pytest.approx(1.0) and phases["kernels"] == pytest.approx(3.0)
    assert sum(phases.values()) == pytest.approx(12.0)
    # An FX-graph-cache hit: no lowering or codegen, the load is kernel compile and load.
    hit = ct.derive_phases({"_compile.compile_inner": 5.0, "OutputGraph.call_user_compiler": 4.0,
                            "compile_fx_inner": 3.5, "fx_codegen_and_compile": 3.4}, first_call_s=6.0, setup_s=0.2)
    assert hit["lowering"] == 0 and hit["kernels"] == 3.5 and hit["aot"] == 0.5
    assert min(ct.derive_phases({}, first_call_s=1.0, setup_s=2.0).values()) >= 0  # clamped, never negative


def _ok(first: float, median: float, **extra: object) -> dict[str, object]:
    return {"status": "ok", "first_call_s": first, "median_ms": median, **extra}


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
    assert by_name["warm-start-artifacts latency / max-autotune-cold latency (wall median)"]["met"] is False


def test_markdown_renders_new_and_old_rows(ct: ModuleType) -> None:
    report = {
        "machine": {"gpu": None, "cpu": "cpu", "cpu_count": 2}, "date": "2026-01-01T00:00:00+00:00", "argv": "",
        "models": {"mlp": {"path": "examples/mlp.py", "scenarios": {
            "default": {"status": "ok", "first_call_s": 3.0, "median_ms": 0.1, "benchmarks": 0,
                        "compile_phases": "TorchDynamo compilation metrics: (a row from an older run)"},
            "floor": {"status": "ok", "first_call_s": 1.0, "median_ms": 0.1, "caching_precompile": True,
                      "launch_calls": {"cudaGraphLaunch": 1.0, "cudaLaunchKernel": 2.0},
                      "bench": dict.fromkeys(ct.BENCH_KINDS, 0), "phases": dict.fromkeys(ct.PHASES, 0.1),
                      "megacache_loaded": {"loaded": True, "bytes": 2048, "artifacts": {"precompile": 1}}},
            "sweep": {"status": "error", "error": "sweep exited 2\nsecond line",
                      "signing": {"error": "no keys | here"}},
        }}},
    }
    text = ct.render_markdown(report)
    assert "| floor | ok | 1.0 | 0.100 | 0/0/0 (0) |" in text
    assert "0.1/0.1/0.1/0.1/0.1/0.1/0.1/0.1" in text and "caching_precompile on" in text
    assert "launches/call cudaGraphLaunch 1, cudaLaunchKernel 2" in text  # CUDA graphs replayed or not
    assert "no keys \\| here" in text  # a pipe in an error cannot break the table
    assert "sweep exited 2 second line" in text  # nor can a newline


def test_dynamic_option(ct: ModuleType) -> None:
    with pytest.raises(SystemExit, match="needs --batch-size"):
        ct.main(["--dynamic", "auto", "--models", "mlp"])
    assert ct.DYNAMIC == {"static": False, "auto": None, "true": True}
    row = ct._row("warm-start", {"status": "ok", "first_call_s": 5.0, "median_ms": 1.0, "dynamic": "auto",
                                 "recompile": {"seconds": 3.0, "graphs": 1, "bench": {"gemm_autotune": 2},
                                               "hook": {"hits": 0, "misses": 2}}})
    assert "the call at 2x batch took 3.0 s, 1 graphs, 2 benchmarks, hits/misses 0/2" in row[-1]
    assert ct._sweep_totals({"totals": {"found": 3}, "requests": [{"status": "ok"}, {"status": "key_mismatch"},
                                                                  {"status": "ok"}]})["statuses"] == {
        "ok": 2, "key_mismatch": 1}
