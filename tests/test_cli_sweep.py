"""`autotune sweep` and `autotune run` from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli import main

MODELS = Path(__file__).parent / "models"


@pytest.mark.parametrize(
    ("model", "needle"),
    [("missing.py", "no such file"), ("broken_import.py", "failed to import"),
     ("no_entry.py", "defines no function example()"), ("wrong_return.py", "must return (module")],
)
def test_bad_model_file_is_one_line_and_exit_2(model: str, needle: str, sqlite_url: str) -> None:
    import ray

    ray_was_up = ray.is_initialized()
    result = CliRunner().invoke(main, ["sweep", str(MODELS / model), "--cache", sqlite_url, "--device", "cpu"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and needle in lines[0]
    assert "Traceback" not in result.output
    # A sweep starts a local Ray before it loads the model files; one that stops on them shuts it down.
    assert ray.is_initialized() == ray_was_up


def test_sweep_without_model_or_misses_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["sweep"])
    assert result.exit_code == 2 and "give a MODEL.py" in result.output


def test_bad_batch_sizes_are_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["sweep", str(MODELS / "tiny_mlp.py"), "--batch-sizes", "8,x"])
    assert result.exit_code == 2 and "comma-separated" in result.output


def test_dry_run_json_lists_the_plan_alone_on_stdout(sqlite_url: str) -> None:
    # The entry prints as it builds; that goes to the sweep's log, as Inductor's and Ray's output
    # do, and -v streams the log to stderr as it is written.
    result = CliRunner().invoke(main, ["sweep", str(MODELS / "tiny_mlp.py"), "--entry", "chatty", "--dry-run", "-v",
                                       "--json", "--cache", sqlite_url, "--device", "cpu", "--batch-sizes", "4,8"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # the whole of stdout is the report
    assert "building the tiny MLP at batch 4" in result.stderr
    log = Path(report["log"])  # beside the SQLite cache, one file per sweep
    assert log.parent == Path(sqlite_url.removeprefix("sqlite:///")).parent / "logs"
    assert "building the tiny MLP at batch 4" in log.read_text()
    # Each batch size's static graph, and the graph a job recompiles when its batch goes
    # from 4 to 8 (a dynamic batch with size hint 8; CPU freezing then uses mkldnn's linear).
    assert report["dry_run"] is True and report["totals"]["found"] == 6
    assert {r["status"] for r in report["requests"]} == {"planned"}
    assert {r["shapes"].split(" @ ")[0].split(",")[0] for r in report["requests"]} == {
        "packed_linear 4x32", "packed_linear 4x64", "packed_linear 8x32", "packed_linear 8x64",
        "linear_unary 8x32", "linear_unary 8x64"}


def test_run_executes_the_script_with_the_hook(sqlite_url: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch\n"
        f"sys.path.insert(0, {str(MODELS)!r})\n"
        "import tiny_mlp\n"
        "model, inputs = tiny_mlp.example()\n"
        "with torch.no_grad():\n"
        "    torch.compile(model, mode='max-autotune')(*inputs)\n"
        "print('args', sys.argv[1:])\n"
        "sys.exit(3)\n"
    )
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "AUTOTUNE_ON_MISS": "aten"}
    proc = subprocess.run([sys.executable, "-c", "from autotune.cli import main; main()", "run", "--cache", sqlite_url,
                           str(script), "--epochs", "3"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 3, proc.stderr[-2000:]  # the script's own exit status
    assert "args ['--epochs', '3']" in proc.stdout
    assert "autotune: hits=0 misses=2 written=0 errors=0" in proc.stderr  # on_miss came from the environment


def test_a_wrong_address_fails_in_seconds_with_one_line(sqlite_url: str) -> None:
    import time

    began = time.monotonic()
    result = CliRunner().invoke(main, ["sweep", str(MODELS / "tiny_mlp.py"), "--address", "127.0.0.1:1",
                                       "--cache", sqlite_url, "--device", "cpu"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "no Ray cluster at 127.0.0.1:1" in lines[0] and "ray start --head" in lines[0]
    assert time.monotonic() - began < 30
