"""`autotune sweep` and `autotune run` from the command line."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import env_without
from rich.console import Console

from autotune.cli import main

MODELS = Path(__file__).parent / "models"


@pytest.mark.parametrize(
    ("model", "needle"),
    [("missing.py", "no such file"), ("broken_import.py", "defines no function example()"),
     ("raises_at_import.py", "failed to import"), ("no_entry.py", "defines no function example()"),
     ("wrong_return.py", "must return (module")],
)
def test_bad_model_file_is_one_line_and_exit_2(model: str, needle: str, sqlite_url: str, tmp_path: Path) -> None:
    import ray

    path = MODELS / model
    if model == "raises_at_import.py":  # defines example(), so that only importing it can tell
        path = tmp_path / model
        path.write_text((MODELS / "broken_import.py").read_text() + "\ndef example():\n    pass\n")
    ray_was_up = ray.is_initialized()
    result = CliRunner().invoke(main, ["sweep", str(path), "--cache", sqlite_url, "--device", "cpu"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and needle in lines[0]
    assert "Traceback" not in result.output
    # A sweep starts a local Ray before it loads the model files; one that stops on them shuts it down.
    assert ray.is_initialized() == ray_was_up


def test_a_model_that_fails_to_build_in_its_capture_process_is_one_line_and_exit_2(sqlite_url: str) -> None:
    # Captured side by side, a model is built in its own process: its error is still one line.
    result = CliRunner().invoke(main, ["sweep", str(MODELS / "tiny_mlp.py"), str(MODELS / "wrong_return.py"),
                                       "--cache", sqlite_url, "--device", "cpu", "--capture-processes", "2",
                                       "--dry-run"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "must return (module" in lines[0] and "Traceback" not in result.output


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


def test_json_is_stdout_whole_even_with_output_after_it(tmp_path: Path, sqlite_url: str) -> None:
    # A model file (or a library: Ray, telling of a node it lost) that prints once the sweep is
    # over, at exit here, prints to stderr: stdout stays one JSON document.
    model = tmp_path / "late.py"
    model.write_text(f"import atexit, sys\nsys.path.insert(0, {str(MODELS)!r})\n"
                     "from tiny_mlp import example\n"
                     "atexit.register(print, 'printed at exit')\n")
    done = subprocess.run([sys.executable, "-m", "autotune.cli", "sweep", str(model), "--dry-run", "--json",
                           "--cache", sqlite_url, "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["dry_run"] is True
    assert "printed at exit" in done.stderr


def _autotune_run(tmp_path: Path, *args: str, then: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    """`autotune run ARGS train.py --epochs 3`, where train.py compiles the tiny MLP with
    max-autotune, then runs ``then``."""
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch\n"
        f"sys.path.insert(0, {str(MODELS)!r})\n"
        "import tiny_mlp\n"
        "model, inputs = tiny_mlp.example()\n"
        "with torch.no_grad():\n"
        "    torch.compile(model, mode='max-autotune')(*inputs)\n" + then
    )
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), **env}
    return subprocess.run([sys.executable, "-c", "from autotune.cli import main; main()", "run", *args, str(script),
                           "--epochs", "3"], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_run_executes_the_script_with_the_hook(sqlite_url: str, tmp_path: Path) -> None:
    proc = _autotune_run(tmp_path, "--cache", sqlite_url, then="print('args', sys.argv[1:])\nsys.exit(3)\n",
                         AUTOTUNE_ON_MISS="aten")
    assert proc.returncode == 3, proc.stderr[-2000:]  # the script's own exit status
    assert "args ['--epochs', '3']" in proc.stdout
    # on_miss came from the environment; ATen was taken, nothing benchmarked; every figure named.
    assert "autotune: hits=0 misses=2 benchmarks=0 written=0 errors=0" in proc.stderr
    assert "artifacts_loaded=0 artifacts_rejected=0 artifacts_published=0" in proc.stderr


def test_a_wrong_address_fails_in_seconds_with_one_line(sqlite_url: str) -> None:

    began = time.monotonic()
    result = CliRunner().invoke(main, ["sweep", str(MODELS / "tiny_mlp.py"), "--address", "127.0.0.1:1",
                                       "--cache", sqlite_url, "--device", "cpu"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "no Ray cluster at 127.0.0.1:1" in lines[0] and "ray start --head" in lines[0]
    assert time.monotonic() - began < 30


def test_the_sweep_shows_its_summary_and_leaves_inductor_and_torch_to_its_log(_signed_tiny_cache: Path) -> None:
    """The terminal of the session's signed CPU sweep (tests/conftest.py), without -v: the
    summary, and none of Inductor's tables or torch's warnings, which are in its log."""
    out = (_signed_tiny_cache.parent / "sweep.stdout").read_text()
    err = (_signed_tiny_cache.parent / "sweep.stderr").read_text()
    assert "tiny_mlp.py" in out and "2 found, 0 cached, 2 tuned, 0 failed" in out
    for noise in ("AUTOTUNE", "Autotune Choices Stats", "Warning", "guard", "SingleProcess"):
        assert noise not in out and noise not in err, noise
    assert len((out + err).splitlines()) <= 25
    log = Path(re.findall(r"^log: (.+)$", out, re.M)[-1])
    assert log.parent == _signed_tiny_cache.parent / "logs"
    text = log.read_text()
    assert "AUTOTUNE packed_linear" in text and "Autotune Choices Stats" in text  # the tuning processes'
    assert "packed_linear 8x32 @ 32x64 fp32" in text  # every request's row


def test_an_unreachable_cache_fails_before_capture_in_seconds() -> None:
    import ray

    began = time.monotonic()
    result = CliRunner().invoke(main, ["sweep", str(MODELS / "tiny_mlp.py"), "--device", "cpu",
                                       "--cache", "postgresql://postgres@127.0.0.1:1/kernels"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: cannot use cache database") and "127.0.0.1:1" in lines[0]
    assert time.monotonic() - began < 15 and not ray.is_initialized()  # before Ray's start, let alone capture


def test_a_cache_that_refuses_writes_fails_before_capture(readonly_postgres_url: tuple[str, str]) -> None:
    _, reader = readonly_postgres_url
    result = CliRunner().invoke(main, ["sweep", str(MODELS / "tiny_mlp.py"), "--device", "cpu", "--cache", reader])
    assert result.exit_code == 3, result.output  # a refused write, as anywhere (cli.REFUSED_WRITE)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "may not write" in lines[0], result.output


def test_without_ray_a_sweep_says_to_install_the_sweep_extra(tmp_path: Path, sqlite_url: str) -> None:
    proc = subprocess.run([sys.executable, "-c", "from autotune.cli import main; main()", "sweep",
                           str(MODELS / "tiny_mlp.py"), "--device", "cpu", "--cache", sqlite_url],
                          capture_output=True, text=True, env=env_without("ray", tmp_path), timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'inductor-autotune[sweep]'" in lines[0], proc.stderr


def test_on_miss_error_stops_the_job_with_one_line_naming_the_request(sqlite_url: str, tmp_path: Path) -> None:
    proc = _autotune_run(tmp_path, "--cache", sqlite_url, "--on-miss", "error")
    assert proc.returncode == 2, proc.stderr[-3000:]
    # torch's CUDA build (PyPI's wheel: CI's torch 2.11 and 2.15) on a host without CUDA logs a line of
    # its own when the compile imports cpp_extension ("No CUDA runtime is found"); it is not the job's.
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "No CUDA runtime is found" not in line]
    assert len(lines) == 1 and lines[0].startswith("Error: the cache has no result for packed_linear 8x32"), proc.stderr
    assert "autotune sweep" in lines[0]


HOSTILE_OP = "mm\x1b[2J\x1b[31m\x1b]0;pwned\x07\u009b31m\u202e"  # clear screen, colour, window title, CSI, RTL


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_a_hostile_misses_row_is_printed_escaped_by_the_sweep(sqlite_url: str, as_json: bool) -> None:
    """`sweep --misses --dry-run` plans a logged miss of this machine whose op someone with write
    access filled with terminal escapes: every table and line shows them escaped, as `cache ls` does."""
    from factories import make_request

    from autotune.cache import Store
    from autotune.inductor_glue.env import current_environment

    with Store(sqlite_url) as store:
        store.record_miss(current_environment("cpu"), make_request(op=HOSTILE_OP, m=3, n=5, k=7), host="h\x1b[5m")
    args = ["sweep", "--misses", "--dry-run", "--device", "cpu", "--cache", sqlite_url] + (["--json"] if as_json else [])
    result = CliRunner().invoke(main, args, env={"COLUMNS": "400"})  # the table's rows whole, on one line each
    assert result.exit_code == 0, result.output
    for ch in ("\x1b", "\x07", "\u009b", "\u202e"):
        assert ch not in result.output, repr(result.output)
    if as_json:  # JSON escapes them itself
        assert json.loads(result.stdout)["requests"][0]["op"] == HOSTILE_OP
    else:
        assert "mm\\x1b[2J\\x1b[31m\\x1b]0;pwned\\x07\\x9b31m\\u202e" in result.stdout
        assert "1 planned" in result.stdout
    log = Path(re.findall(r'"log": "(.+)"', result.stdout)[0] if as_json else re.findall(r"^log: (.+)$", result.stdout,
                                                                                          re.M)[-1])
    assert "\x1b" not in log.read_text() and "\u009b" not in log.read_text()  # its requests' table too


def test_a_sweep_that_finds_no_request_says_why() -> None:
    """A CPU training step (--train) has nothing Inductor autotunes: the sweep says so and what to change.
    The report is what a capture that saw no lookup returns (`autotune sweep examples/mlp.py --train --ddp`)."""
    from autotune.sweep.report import ModelCapture, SweepReport
    from autotune.sweep.view import no_request_notes, print_summary

    report = SweepReport(sweep_id="s", env=None, device="cpu", dry_run=True, models=[ModelCapture("mlp.py")])
    trained = no_request_notes(report, train=True, mode="max-autotune")
    assert len(trained) == 1 and "training step" in trained[0] and "freezing = True" in trained[0]
    assert "--device cuda" in trained[0]
    inference = no_request_notes(report, train=False, mode="max-autotune")
    assert "freezing=True" in inference[0] and "training step" not in inference[0]
    assert "--mode default does not autotune" in no_request_notes(report, train=False, mode="default")[0]
    assert "nothing to tune" in no_request_notes(SweepReport("s", None, "cpu"), train=False, mode="max-autotune")[0]
    console = Console(file=io.StringIO(), width=200)
    print_summary(report, console, None, trained)
    assert "requests: 0 found" in console.file.getvalue() and "never frozen" in console.file.getvalue()
