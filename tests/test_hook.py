"""The warm-start hook, each job in a fresh process with a fresh Inductor cache dir."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.cache import Store
from autotune.settings import Settings
from autotune.sweep import run_sweep
from autotune.sweep.report import SweepOptions

# One pytest-xdist worker runs every module that copies the session's signed sweep
# (tests/conftest.py), so that sweep runs once, not once per worker.
pytestmark = pytest.mark.xdist_group("signed_hook")  # its own sweep copy; the signed sweep is one per run (conftest)

TESTS = Path(__file__).parent
TINY = str(TESTS / "models" / "tiny_mlp.py")


def job(tmp_path: Path, *args: str, name: str = "job", check: bool = True) -> dict[str, Any]:
    """Run tests/hook_job.py in a fresh process; return its JSON report (plus stderr)."""
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, str(TESTS / "hook_job.py"), str(out), *args],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text()) if out.exists() else {}
    return {**report, "stderr": proc.stderr + proc.stdout, "returncode": proc.returncode}


@pytest.fixture(scope="module")
def swept(signed_tiny_sweep: str) -> str:
    """A SQLite cache holding a sweep of the tiny model (signed; these jobs trust no key)."""
    return signed_tiny_sweep


def _core(stats: dict[str, int]) -> dict[str, int]:
    """The GEMM lookup counters (pinning and kernel configs are GPU-only and stay 0 here)."""
    return {key: stats[key] for key in ("hits", "misses", "written", "errors")}


def _winners(url: str) -> dict[str, str]:
    with Store(url) as store:
        return {f"{r.request.op}|{r.request.inputs_key}": r.winner_hash or "" for _, r in store.list_results()}


def test_warm_start_serves_every_request_without_benchmarking(swept: str, tmp_path: Path) -> None:
    warm = job(tmp_path, "--cache", swept, name="warm")
    cold = job(tmp_path, "--no-hook", name="cold")
    # The counters first: a failure names the lookup that missed or erred, with the job's output.
    assert _core(warm["stats"]) == {"hits": 2, "misses": 0, "written": 0, "errors": 0}, warm["stderr"][-3000:]
    assert "AUTOTUNE" not in warm["stderr"]  # Inductor prints an AUTOTUNE block per benchmark
    assert warm["benchmarks"] == 0
    stored = _winners(swept)
    assert warm["chosen"] == stored  # Inductor picked the stored winner for every request
    # A cold max-autotune compile weighs exactly the candidates the sweep timed. (Not its
    # winner: tiny CPU GEMMs on a shared 2-core machine swap places with the load, even
    # at a 2.5x lead, MKL's threads against the single-threaded C++ micro-GEMM.)
    assert cold["benchmarks"] == 2
    with Store(swept) as store:
        swept_candidates = {f"{r.request.op}|{r.request.inputs_key}": sorted(c.choice_hash for c in r.candidates)
                            for _, r in store.list_results()}
    assert cold["candidates"] == swept_candidates
    torch.testing.assert_close(torch.load(warm["output"]), torch.load(cold["output"]), rtol=1e-4, atol=1e-4)


def test_on_miss_aten_takes_aten_without_benchmarking_and_logs_misses(sqlite_url: str, tmp_path: Path) -> None:
    report = job(tmp_path, "--cache", sqlite_url, "--on-miss", "aten")
    assert report["benchmarks"] == 0
    assert report["stats"]["misses"] == 2 and report["stats"]["hits"] == 0
    assert all(h.startswith("_mkl_linear") for h in report["chosen"].values())
    with Store(sqlite_url) as store:
        misses = store.misses()
    assert sorted(m.request.op for m in misses) == ["packed_linear", "packed_linear"]
    assert all(m.request.inputs and m.request.choice_hashes for m in misses)  # enough to reproduce
    # The job's own report names each miss, with its key and sizes, to compare with a sweep's capture.
    assert sorted(m["key"] for m in report["stats"]["missed"]) == sorted(m.request.key for m in misses)
    assert all(m["request"].startswith("packed_linear ") and m["strides"] for m in report["stats"]["missed"])


@pytest.mark.slow
def test_on_miss_error_names_the_request(sqlite_url: str, tmp_path: Path) -> None:
    report = job(tmp_path, "--cache", sqlite_url, "--on-miss", "error", check=False)
    assert report["returncode"] != 0
    assert "the cache has no result for packed_linear 8x32 @ 32x64 fp32" in report["stderr"]


def test_a_job_imports_the_hooks_error_and_stats_from_autotune_hook() -> None:
    """``on_miss="error"`` raises ``CacheMissError`` (docs/guide.md): a job catches it from
    ``autotune.job.hook``, where the hook's stats are too, though both live in hook_stats.py."""
    from autotune.job import hook, hook_stats

    assert hook.CacheMissError is hook_stats.CacheMissError and hook.HookStats is hook_stats.HookStats
    assert all(hasattr(hook, name) for name in hook.__all__)


@pytest.mark.torch_subset
def test_tune_writes_back_and_another_process_hits_without_ray(sqlite_url: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs where Ray cannot be imported (a training node installs autotune without the
    [sweep] extra): the hook needs none of it."""
    monkeypatch.setenv("AUTOTUNE_TEST_NO_RAY", "1")
    first = job(tmp_path, "--cache", sqlite_url, name="first")
    assert first["benchmarks"] == 2 and first["stats"]["written"] == 2 and first["stats"]["misses"] == 2
    second = job(tmp_path, "--cache", sqlite_url, name="second")
    assert second["benchmarks"] == 0
    assert _core(second["stats"]) == {"hits": 2, "misses": 0, "written": 0, "errors": 0}
    assert second["chosen"] == first["chosen"]
    assert not first["ray_importable"] and not second["ray_importable"]


def test_environment_mismatch_is_a_miss(swept: str, tmp_path: Path) -> None:
    # epilogue_fusion is part of the config fingerprint: a job with it off is another environment.
    report = job(tmp_path, "--cache", swept, "--on-miss", "aten", "--config", "epilogue_fusion=false")
    assert report["stats"]["hits"] == 0 and report["stats"]["misses"] == 2


class _Proxy:
    """A TCP forwarder to PostgreSQL that the test can cut, like a server going down."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def stop(self) -> None:
        # shutdown() wakes the thread blocked in accept(); close() alone would not.
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


def test_database_stopped_mid_job_warns_and_compiles(postgres_url: str, tmp_path: Path) -> None:
    import sqlalchemy as sa

    url = sa.make_url(postgres_url.split("?")[0])
    proxy = _Proxy((url.host or "127.0.0.1", url.port or 5432))
    proxied = postgres_url.replace(f"{url.host}:{url.port or 5432}", f"127.0.0.1:{proxy.port}")
    Store(postgres_url).close()  # create the schema while the server is up
    pause, resume = tmp_path / "paused", tmp_path / "resume"
    out = tmp_path / "mid.json"
    proc = subprocess.Popen([sys.executable, str(TESTS / "hook_job.py"), str(out), "--cache", proxied,
                             "--on-miss", "aten", "--pause-file", str(pause), "--resume-file", str(resume)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not pause.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proxy.stop()  # the database goes away between the job's two compiles
    resume.write_text("go")
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["stats"]["errors"] >= 1, (report, stderr[-3000:])
    assert stderr.count("kernel cache unavailable") == 1  # warned once, then plain max-autotune
    assert report["stats"]["misses"] == 3  # two before the cut, one after (served by ATen)


@pytest.mark.slow
def test_sweep_misses_tunes_what_jobs_logged(sqlite_url: str, tmp_path: Path) -> None:
    import ray

    job(tmp_path, "--cache", sqlite_url, "--on-miss", "aten", name="logger")
    with Store(sqlite_url) as store:
        assert len(store.misses()) == 2
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        report = run_sweep(SweepOptions(None, misses=True), Settings.from_env(cache=sqlite_url, device="cpu"))
    finally:
        ray.shutdown()
    assert (report.found, report.tuned, report.failed) == (2, 2, 0), [o.result.error for o in report.outcomes]
    with Store(sqlite_url) as store:
        assert store.misses() == []  # a stored result clears its miss
    served = job(tmp_path, "--cache", sqlite_url, name="served")
    assert served["stats"]["hits"] == 2 and served["benchmarks"] == 0


@pytest.mark.slow
def test_the_pointwise_process_compiles_the_model_with_every_gemm_served_and_marks_its_pass_finished(
        swept: str, tmp_path: Path) -> None:
    import dataclasses

    from conftest import copy_sqlite

    from autotune.inductor_glue.env import kernel_config_environment
    from autotune.sweep import pass_marks
    from autotune.sweep.end_to_end import EndToEndProcess
    from autotune.sweep.pass_spec import EndToEndSpec

    # On CPU there are no pointwise configs to tune; this runs the sweep's last step
    # end to end: a fresh process that loads the model, waits for the word, compiles
    # with the hook, reports, and leaves the mark a later sweep looks for. (The fixture's
    # signed sweep ran its pass already, in max-autotune, and left its own mark.)
    url = copy_sqlite(Path(swept.removeprefix("sqlite:///")), tmp_path / "marked.db")
    swept_spec = EndToEndSpec(TINY, "example", [None], "max-autotune", {}, False, url, device="cpu")
    spec = dataclasses.replace(swept_spec, mode="max-autotune-no-cudagraphs")  # the same GEMMs on a CPU
    env = kernel_config_environment("cpu")
    with Store(url) as store:
        assert pass_marks.unfinished(store, env, [swept_spec, spec]) == [spec]
    report = EndToEndProcess(spec).run(timeout=300)
    assert report.error is None, report
    assert (report.gemm_hits, report.gemm_misses) == (2, 0)
    with Store(url) as store:
        assert pass_marks.unfinished(store, env, [swept_spec, spec]) == []
        assert pass_marks.started_key(spec) in pass_marks.read(store, env)  # it left both marks
        assert pass_marks.resumable(pass_marks.read(store, env), [spec]) == []


@pytest.mark.slow
def test_a_cancelled_pointwise_process_exits_quietly(swept: str) -> None:
    from autotune.sweep.end_to_end import EndToEndProcess
    from autotune.sweep.pass_spec import EndToEndSpec

    process = EndToEndProcess(EndToEndSpec(TINY, "example", [None], "max-autotune", {}, False, swept, device="cpu"))
    assert process.proc.stdin is not None
    process.proc.stdin.close()  # the sweep failed before any winner was stored
    assert process.proc.wait(timeout=120) == 0


@pytest.mark.slow
def test_a_pass_told_to_stop_stores_what_it_timed_and_leaves_only_its_started_mark(
        swept: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep cut at its deadline sends its end-to-end pass SIGTERM. The pass holds its
    writes until a compile ends (serve_policy.py), and a stop used to lose them all: now its compile
    stores them, it reports, and a later sweep's pass (unmarked) goes on from them."""
    from conftest import copy_sqlite

    from autotune.inductor_glue.env import kernel_config_environment
    from autotune.job.in_graph import SOURCE
    from autotune.sweep import pass_marks
    from autotune.sweep.end_to_end import EndToEndProcess
    from autotune.sweep.pass_spec import EndToEndSpec

    url = copy_sqlite(Path(swept.removeprefix("sqlite:///")), tmp_path / "stopped.db")
    spec = EndToEndSpec(TINY, "stops_its_pass", [None], "max-autotune", {}, False, url, device="cpu",
                         time_in_graph=True)
    monkeypatch.setenv("TINY_STOP_PASS", "1")  # the model stops its own pass after its GEMMs
    report = EndToEndProcess(spec).run(timeout=300)
    assert report.error is not None and report.error.startswith("stopped after"), report
    assert report.gemm_hits == 2 and len(report.verdicts) == 2
    with Store(url) as store:
        sources = {r.request.key: r.provenance.source for _, r in store.list_results()}
        assert pass_marks.unfinished(store, kernel_config_environment("cpu"), [spec]) == [spec]
        # It began: the next sweep of this model starts it again beside capture (resumed_pass.py).
        assert pass_marks.resumable(pass_marks.read(store, kernel_config_environment("cpu")), [spec]) == [spec]
    assert all(sources[v["request_key"]] == SOURCE for v in report.verdicts)  # stored before it stopped


@pytest.mark.slow
def test_a_pass_past_its_timeout_is_stopped_and_still_reports(
        swept: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.sweep.end_to_end import EndToEndProcess
    from autotune.sweep.pass_spec import EndToEndSpec

    hanging = tmp_path / "hanging"
    monkeypatch.setenv("TINY_HANG_PASS", str(hanging))  # building the model for the pass hangs
    process = EndToEndProcess(EndToEndSpec(TINY, "hangs_in_its_pass", [None], "max-autotune", {}, False,
                                             swept, device="cpu"))
    assert process.proc.stdin is not None
    process.proc.stdin.write("go\n")  # the word run() gives, early: the timeout below is the pass's own
    process.proc.stdin.flush()
    deadline = time.monotonic() + 300
    while not hanging.exists() and time.monotonic() < deadline and process.proc.poll() is None:
        time.sleep(0.2)
    assert hanging.exists(), "the pass never began"
    report = process.run(timeout=1, grace=60)
    assert report.error is not None and report.error.startswith("timed out after 1 s (stopped after"), report
    assert process.proc.returncode == 0  # it reported and exited; it was not killed


@pytest.mark.slow
def test_the_pass_times_served_gemms_in_the_graph_and_jobs_weigh_its_verdict(swept: str, tmp_path: Path) -> None:
    """The end-to-end pass (on GPUs by default; asked for here on CPU) times each served
    request's choices in its own process and stores that verdict; a job then weighs those
    figures, benchmarking nothing (autotune/job/in_graph.py)."""
    from conftest import copy_sqlite

    from autotune.job.in_graph import SOURCE
    from autotune.sweep.end_to_end import EndToEndProcess
    from autotune.sweep.pass_spec import EndToEndSpec

    url = copy_sqlite(Path(swept.removeprefix("sqlite:///")), tmp_path / "verdict.db")
    spec = EndToEndSpec(TINY, "example", [None], "max-autotune", {}, False, url, device="cpu", time_in_graph=True)
    report = EndToEndProcess(spec).run(timeout=300)
    assert report.error is None, report
    assert report.gemm_misses == 0
    assert len(report.verdicts) == 2 and all(len(v["in_graph_ms"]) >= 2 for v in report.verdicts)
    with Store(url) as store:
        stored = {r.request.key: r for _, r in store.list_results()}
    for v in report.verdicts:
        result = stored[v["request_key"]]
        assert result.provenance.source == SOURCE
        times = {c.name: c.time_ms for c in result.candidates}
        assert {name: times[name] for name in v["in_graph_ms"]} == v["in_graph_ms"]
        assert result.winner is not None and result.winner.name == v["winner_after"]
        assert v["winner_after"] == min(v["in_graph_ms"], key=lambda name: v["in_graph_ms"][name])
    served = job(tmp_path, "--cache", url, name="after-verdict")
    assert served["benchmarks"] == 0 and _core(served["stats"])["hits"] == 2
    assert served["chosen"] == _winners(url)
