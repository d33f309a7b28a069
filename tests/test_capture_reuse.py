"""A sweep whose model file, options and environment match a finished capture replays it
(autotune/sweep/capture_reuse.py): real Inductor compiles on CPU, a real SQLite and PostgreSQL."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.cache import Store
from autotune.cache.records import TuningRequest
from autotune.inductor_glue.env import kernel_config_environment
from autotune.inductor_glue.modelfile import load_model_file
from autotune.settings import Settings
from autotune.sweep import capture_reuse, run_sweep
from autotune.sweep.report import SweepOptions, SweepReport
from autotune.sweep.view import summary_lines

REPO = Path(__file__).resolve().parent.parent
TINY = Path(__file__).parent / "models" / "tiny_mlp.py"
# Nothing listens there: a sweep that needed Ray would fail at its address check.
NO_RAY = "127.0.0.1:9"


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray for the sweep that tunes, shut down after this module: a sweep leaves the Ray
    it started up, and a later module's own ray.init in this process would fail."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _sweep(url: str, model: Path, address: str | None = None, **options: object) -> SweepReport:
    settings = Settings.from_env(cache=url, device="cpu", workers=1, address=address)
    return run_sweep(SweepOptions(str(model), **options), settings)  # type: ignore[arg-type]


def _records(url: str) -> dict[str, dict[str, object]]:
    with Store(url) as store:
        keys = store.kernel_config_keys(capture_reuse.PREFIX)
        return {key: store.find_kernel_config(key) or {} for key in keys}


def _requests(report: SweepReport) -> list[str]:
    return [outcome.request.key for outcome in report.outcomes]


def test_a_second_sweep_replays_the_capture_tunes_nothing_and_needs_no_ray(
    sqlite_url: str, tmp_path: Path, local_ray: None
) -> None:
    model = tmp_path / "tiny_mlp.py"
    shutil.copy(TINY, model)
    first = _sweep(sqlite_url, model)
    assert (first.found, first.tuned, first.failed) == (2, 2, 0)
    assert first.models[0].reused_from is None and first.capture_seconds > 0
    (key, record), = _records(sqlite_url).items()
    assert [row["request"]["op"] for row in record["requests"]] == ["packed_linear"] * 2  # type: ignore[index]

    again = _sweep(sqlite_url, model, address=NO_RAY)  # Ray is never asked for
    assert (again.found, again.cached, again.tuned) == (2, 2, 0)
    assert _requests(again) == _requests(first)  # the same requests, in the same order: the same plan
    assert again.models[0].reused_from == record["at"] and again.capture_seconds == 0.0
    assert again.models[0].lookups == first.models[0].lookups
    assert f"capture reused from {record['at']} (--force captures anew)" in summary_lines(again)
    assert again.env is not None and first.env is not None and again.env.key == first.env.key

    # Another batch size shapes capture: captured anew (dry runs: nothing is tuned or stored).
    other_size = _sweep(sqlite_url, model, dry_run=True, batch_sizes=(4,))
    assert other_size.models[0].reused_from is None and other_size.capture_seconds > 0
    # --force captures anew.
    forced = _sweep(sqlite_url, model, dry_run=True, force=True)
    assert forced.models[0].reused_from is None and forced.capture_seconds > 0
    # The model file's bytes changed (a comment): captured anew.
    model.write_text(model.read_text() + "\n# edited\n")
    edited = _sweep(sqlite_url, model, dry_run=True)
    assert edited.models[0].reused_from is None and edited.capture_seconds > 0
    assert list(_records(sqlite_url)) == [key]  # a dry run stores no record


def test_a_capture_from_another_torch_is_not_reused(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record filed under the key torch 2.99 computes for this model is not found by this
    torch: the sweep captures anew."""
    import torch

    options = SweepOptions(str(TINY))
    model = load_model_file(TINY, "example")
    kwargs = dict(mode="max-autotune", device="cpu", inductor_config={}, train=False)
    here = capture_reuse.record_key(capture_reuse.source_digest(str(TINY), options),
                                    capture_reuse.setup_digest(model, kwargs))
    with monkeypatch.context() as patched:
        patched.setattr(torch, "__version__", "2.99.0")
        there = capture_reuse.record_key(capture_reuse.source_digest(str(TINY), options),
                                         capture_reuse.setup_digest(model, kwargs))
    assert here != there and here.split("/")[0] == there.split("/")[0]  # the source part does not move

    # A record under torch 2.99's key: a sweep here does not replay it, but captures (a dry run: plans).
    request = TuningRequest("mm", "8x32@32x16", "fp32", (), {}, ("h1",))
    with Store(sqlite_url) as store:
        capture_reuse.save(store, kernel_config_environment("cpu"), there, str(TINY),
                           capture_reuse.Record.now([(request, None)], 1, 1.0))
        assert capture_reuse.find(store, there) is not None and capture_reuse.find(store, here) is None
    report = _sweep(sqlite_url, TINY, dry_run=True)
    assert report.models[0].reused_from is None and report.capture_seconds > 0 and report.found == 2
    assert request.key not in _requests(report)


def test_the_key_covers_local_modules_and_inductor_env_vars_but_not_cache_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "layers").mkdir()
    (tmp_path / "layers" / "__init__.py").write_text("")
    (tmp_path / "layers" / "sizes.py").write_text("WIDTH = 32\n")
    helper = tmp_path / "tiny_helper.py"
    helper.write_text("from layers.sizes import WIDTH\n")
    (tmp_path / "unrelated.py").write_text("X = 1\n")
    model_path = tmp_path / "uses_helper.py"
    model_path.write_text("import torch\nfrom tiny_helper import WIDTH\n\n\ndef example(batch_size=None):\n"
                          "    return torch.nn.Linear(WIDTH, 8), (torch.randn(4, WIDTH),)\n")
    assert list(capture_reuse.local_modules(model_path)) == ["layers/__init__.py", "layers/sizes.py", "tiny_helper.py"]
    options = SweepOptions(str(model_path))
    source = capture_reuse.source_digest(str(model_path), options)
    (tmp_path / "unrelated.py").write_text("X = 2\n")
    assert capture_reuse.source_digest(str(model_path), options) == source
    (tmp_path / "layers" / "sizes.py").write_text("WIDTH = 64\n")  # imported through tiny_helper
    assert capture_reuse.source_digest(str(model_path), options) != source
    assert capture_reuse.source_digest(str(model_path), SweepOptions(str(model_path), train=True)) != \
        capture_reuse.source_digest(str(model_path), options)

    monkeypatch.syspath_prepend(str(tmp_path))
    kwargs = dict(mode="max-autotune", device="cpu", inductor_config={}, train=False)
    model = load_model_file(model_path, "example")
    before = capture_reuse.setup_digest(model, kwargs)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert capture_reuse.setup_digest(model, kwargs) == before  # moves caches, not kernels
    monkeypatch.setenv("TORCHINDUCTOR_FREEZING", "1")
    assert capture_reuse.setup_digest(model, kwargs) != before
    monkeypatch.delenv("TORCHINDUCTOR_FREEZING")
    assert capture_reuse.setup_digest(model, {**kwargs, "mode": "default"}) != before
    assert capture_reuse.setup_digest(model, {**kwargs, "inductor_config": {"freezing": True}}) != before


def test_records_are_found_by_key_in_any_environment_and_a_hostile_one_is_captured_anew(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    request = TuningRequest("mm", "8x32@32x16", "fp32", (), {}, ("h1",))
    env = kernel_config_environment("cpu")
    key = capture_reuse.record_key("a" * 32, "b" * 32)
    with Store(store_url) as store:
        assert not capture_reuse.may_exist(store, ["a" * 32])
        capture_reuse.save(store, env, key, "m.py", capture_reuse.Record.now([(request, env)], 2, 3.5))
        assert capture_reuse.may_exist(store, ["a" * 32]) and not capture_reuse.may_exist(store, ["a" * 32, "c" * 32])
        record = capture_reuse.find(store, key)
        assert record is not None and record.found == [(request, env)] and record.lookups == 2
        store.put_kernel_configs(env, {key: {"requests": [{"request": {"op": 3}, "env": 7}], "envs": []}})
    with Store(store_url) as store, caplog.at_level("WARNING"):
        assert capture_reuse.find(store, key) is None
    assert "is not one" in caplog.text and "capturing anew" in caplog.text


def test_a_signed_second_sweep_replays_its_capture_and_skips_the_finished_publishing_pass(
    signed_tiny_sweep: str, signing_keys: dict[str, Path]
) -> None:
    """On a CPU the pass runs only to publish: a second signed sweep of the unchanged model,
    every GEMM cached and its last pass finished, has nothing to publish and starts no pass."""
    with Store(signed_tiny_sweep) as store:
        artifacts = len(store.artifacts(limit=1000))
    assert artifacts >= 1
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", "sweep", str(TINY), "--device", "cpu",
                           "--cache", signed_tiny_sweep, "--signing-key", str(signing_keys["writer"])],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 cached, 0 tuned" in proc.stdout and "capture reused from" in proc.stdout, proc.stdout
    assert "end-to-end pass" not in proc.stdout and "published" not in proc.stdout, proc.stdout
    with Store(signed_tiny_sweep) as store:
        assert len(store.artifacts(limit=1000)) == artifacts
