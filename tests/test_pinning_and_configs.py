"""Pinning stored winners and serving pointwise/reduction configs (no GPU needed)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from factories import make_result
from torch._inductor import select_algorithm as sa
from torch._inductor.runtime.autotune_cache import AutotuneCache

from autotune.cache import Store
from autotune.cache.records import CandidateResult, TuningResult
from autotune.inductor_glue import pinning
from autotune.job import kernel_configs
from autotune.job.serve_policy import ServePolicy
from autotune.settings import Settings


def _with_pins(result: TuningResult, family: str) -> TuningResult:
    """The result with pin digests on its Triton candidates, as a worker stores them."""
    candidates = tuple(
        CandidateResult(**{**c.__dict__, "params": {**c.params, pinning.PIN_FAMILY: family,
                                                     pinning.PIN_KEY: f"key-{i}"}})
        if c.kind == "triton" else c
        for i, c in enumerate(result.candidates)
    )
    return TuningResult(**{**result.__dict__, "candidates": candidates})


def test_pin_index_generates_only_stored_winners_and_leaves_unknown_families_alone() -> None:
    triton_wins = _with_pins(make_result(times=[1.0, 0.5, 0.3, 0.9]), "fam-a")  # candidate 2 wins
    aten_wins = _with_pins(make_result(times=[0.1, 0.5, 0.3, 0.9]), "fam-b")
    index = pinning.PinIndex([triton_wins, aten_wins])
    assert index.allows(pinning.Pin("cuda", "fam-a", "key-2"))
    assert not index.allows(pinning.Pin("cuda", "fam-a", "key-1"))
    assert not index.allows(pinning.Pin("cuda", "fam-b", "key-2"))  # ATen won: no Triton config at all
    assert index.allows(pinning.Pin("cuda", "fam-unknown", "key-1"))  # a miss: Inductor tunes as usual


def test_a_pass_timing_in_the_graph_also_generates_the_fastest_template_of_an_aten_win() -> None:
    # ATen won alone (0.1 ms); candidate 2 (0.3 ms) is the fastest Triton config. A compile
    # that times its choices in the graph weighs that template against ATen, as cold
    # max-autotune would; a job generates only the winner.
    aten_wins = _with_pins(make_result(times=[0.1, 0.5, 0.3, 0.9]), "fam-b")
    failed = dataclasses.replace(aten_wins, candidates=tuple(
        dataclasses.replace(c, time_ms=None, failure_kind="wrong_numerics") if c.params.get(pinning.PIN_KEY) == "key-2" else c
        for c in aten_wins.candidates))
    timing = pinning.PinIndex([aten_wins], fastest_template_too=True)
    assert timing.allows(pinning.Pin("cuda", "fam-b", "key-2"))
    assert not timing.allows(pinning.Pin("cuda", "fam-b", "key-1"))
    assert not pinning.PinIndex([aten_wins]).allows(pinning.Pin("cuda", "fam-b", "key-2"))
    # one that failed its numerical check is never generated: the next fastest is
    unchecked = pinning.PinIndex([failed], fastest_template_too=True)
    assert not unchecked.allows(pinning.Pin("cuda", "fam-b", "key-2"))
    assert unchecked.allows(pinning.Pin("cuda", "fam-b", "key-1"))


def test_pinning_patch_is_removed_with_the_last_selector() -> None:
    original = sa.TritonTemplate.__dict__["generate"]
    pinning.push(None)
    pinning.push(lambda pin: False)
    assert sa.TritonTemplate.__dict__["generate"] is not original
    pinning.pop()
    assert sa.TritonTemplate.__dict__["generate"] is not original
    pinning.pop()
    assert sa.TritonTemplate.__dict__["generate"] is original


def test_served_policy_counts_skipped_configs(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    result = _with_pins(make_result(times=[1.0, 0.5, 0.3, 0.9]), "fam-a")
    store.put_result(result)
    policy = ServePolicy(Settings(cache=sqlite_url))
    policy._pins["cuda"] = pinning.PinIndex(store.results_for_env(result.env))
    assert policy.allow_template(pinning.Pin("cuda", "fam-a", "key-2"))
    assert not policy.allow_template(pinning.Pin("cuda", "fam-a", "key-3"))
    assert policy.stats.configs_skipped == 1
    unpinned = ServePolicy(Settings(cache=sqlite_url, pin=False))
    unpinned._pins["cuda"] = policy._pins["cuda"]
    assert unpinned.allow_template(pinning.Pin("cuda", "fam-a", "key-3"))
    policy.close()
    unpinned.close()


def _tuned_config() -> SimpleNamespace:
    # Inductor saves a triton.Config; Triton is not installed on CPU machines, and
    # save() reads only these attributes.
    return SimpleNamespace(kwargs={"XBLOCK": 64, "R0_BLOCK": 8}, num_warps=4, num_stages=1)


@pytest.mark.parametrize("kernel", ["ab/cabcdef0123.py", "cabcdef0123.py"])
def test_a_config_saved_on_one_node_is_read_by_inductor_on_another(
    tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch, kernel: str
) -> None:
    node_a, node_b = tmp_path / "a", tmp_path / "b"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(node_a))  # node A's Inductor cache
    saved: dict[str, dict] = {}
    kernel_configs.push(lambda key, value: saved.__setitem__(key, value))
    try:
        # Inductor names kernel files by a hash of their source, usually one level down.
        tuned = AutotuneCache.create({"autotune_local_cache": True}, str(node_a / kernel), "configs-hash")
        tuned.save(_tuned_config(), 5_000_000, found_by_coordesc=True)
        outside = AutotuneCache.create({"autotune_local_cache": True}, str(tmp_path / "x" / kernel), "h")
        outside.save(_tuned_config(), 5_000_000)  # not under the cache dir: nobody would find it
    finally:
        kernel_configs.pop()
    assert len(saved) == 1 and next(iter(saved)).startswith(kernel_configs.PREFIX), saved

    store = Store(sqlite_url)
    env = make_result().env
    store.put_kernel_configs(env, saved)
    assert kernel_configs.materialize(store.kernel_configs(env, kernel_configs.PREFIX), root=str(node_b)) == 1
    fresh = AutotuneCache.create({"autotune_local_cache": True}, str(node_b / kernel), "configs-hash")
    best = fresh.read_best({}, [_tuned_config()])
    assert best is not None and best.kwargs["XBLOCK"] == 64 and best.num_warps == 4


def test_materialize_keeps_existing_files_and_refuses_paths_outside_the_cache(tmp_path: Path) -> None:
    good = f"{kernel_configs.PREFIX}ab/123.best_config"
    bad = [f"{kernel_configs.PREFIX}../123.best_config", f"{kernel_configs.PREFIX}ab/../../x.best_config",
           f"{kernel_configs.PREFIX}/etc/passwd", f"{kernel_configs.PREFIX}ab/123.py", "other:ab/1.best_config"]
    configs = {good: {"XBLOCK": 1}, **{key: {"XBLOCK": 2} for key in bad}}
    assert kernel_configs.materialize(configs, root=str(tmp_path)) == 1
    assert kernel_configs.materialize({good: {"XBLOCK": 3}}, root=str(tmp_path)) == 0
    assert json.loads((tmp_path / "ab" / "123.best_config").read_text()) == {"XBLOCK": 1}
    assert sorted(os.listdir(tmp_path)) == ["ab"]


def test_policy_copies_configs_into_the_store_and_back(tmp_path: Path, sqlite_url: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    writer = ServePolicy(Settings(cache=sqlite_url))
    key = f"{kernel_configs.PREFIX}cd/456.best_config"
    writer.save_kernel_config("cpu", key, {"XBLOCK": 32, "num_warps": 2})
    writer.close()
    writer.store._writer.shutdown(wait=True)
    assert writer.stats.kernel_configs_saved == 1

    reader = ServePolicy(Settings(cache=sqlite_url))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # a fresh node's Inductor cache
    reader.load_kernel_configs("cpu")
    reader.close()
    assert reader.stats.kernel_configs_loaded == 1
    assert json.loads((tmp_path / "cd" / "456.best_config").read_text()) == {"XBLOCK": 32, "num_warps": 2}


def test_served_configs_are_not_tuned_again_while_the_hook_is_in() -> None:
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    original = CachingAutotuner.__dict__["coordinate_descent_tuning"]
    launcher = SimpleNamespace(config=SimpleNamespace())
    # Only the attribute the wrapper reads; Triton itself cannot run on CPU machines.
    served = SimpleNamespace(autotune_cache_info={"autotune_cache_state": "hit"})
    kernel_configs.push(lambda key, value: None)
    try:
        assert CachingAutotuner.coordinate_descent_tuning(served, launcher) is launcher
        assert launcher.config.found_by_coordesc is True
    finally:
        kernel_configs.pop()
    assert CachingAutotuner.__dict__["coordinate_descent_tuning"] is original


def test_compiles_wait_once_for_the_config_loader_and_the_patch_comes_off() -> None:
    from torch._inductor.async_compile import AsyncCompile

    original = AsyncCompile.__dict__["triton"]
    calls: list[int] = []
    kernel_configs.hold_compiles_until(lambda: calls.append(1))
    assert AsyncCompile.__dict__["triton"] is not original
    kernel_configs.release_compiles()  # no compile happened: release waits for it instead
    kernel_configs.release_compiles()
    assert calls == [1]
    assert AsyncCompile.__dict__["triton"] is original


def _recorded_descents(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Inductor's coordinate descent replaced by a recorder (Triton cannot run on CPU machines):
    the launchers it was asked to tune, in order, beneath the hook's wrapper."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    ran: list[object] = []
    monkeypatch.setattr(CachingAutotuner, "coordinate_descent_tuning",
                        lambda self, launcher, *a, **k: ran.append(launcher) or launcher)
    return ran


def test_a_kernel_loaded_from_a_compiled_graph_keeps_its_stored_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An FX-graph hit re-reads the autotune cache with a one-config list: a "miss" for
    Inductor; the stored config is trusted all the same when it is the running one."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "here"))
    meta = {"autotune_local_cache": True}
    stored_here = AutotuneCache.create(meta, str(tmp_path / "here" / "ab" / "kernel.py"), "hash-of-the-heuristic-list")
    stored_here.save(_tuned_config(), 5_000_000)
    # The loaded kernel still names the path it had on the node that compiled it.
    compiled_there = str(tmp_path / "there" / "ab" / "kernel.py")
    loaded = SimpleNamespace(filename=compiled_there, inductor_meta=meta,
                             autotune_cache_info={"autotune_cache_state": "miss"})
    same = SimpleNamespace(config=SimpleNamespace(kwargs={"XBLOCK": 64}, num_warps=4, num_stages=1))
    other = SimpleNamespace(config=SimpleNamespace(kwargs={"XBLOCK": 128}, num_warps=4, num_stages=1))
    ran = _recorded_descents(monkeypatch)
    kernel_configs.push(lambda key, value: None)
    try:
        assert CachingAutotuner.coordinate_descent_tuning(loaded, same) is same
        assert CachingAutotuner.coordinate_descent_tuning(loaded, other) is other
    finally:
        kernel_configs.pop()
    assert ran == [other] and same.config.found_by_coordesc is True


def test_a_config_this_process_just_tuned_still_gets_coordinate_descent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inductor saves the pointwise-autotune winner before descending from it; that file is
    not a stored config to trust (the sweep's pass stored slower GELU configs that way)."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    meta = {"autotune_local_cache": True}
    kernel = str(tmp_path / "ab" / "kernel.py")
    tuning = SimpleNamespace(filename=kernel, inductor_meta=meta, autotune_cache_info={"autotune_cache_state": "miss"})
    launcher = SimpleNamespace(config=SimpleNamespace(kwargs={"XBLOCK": 64}, num_warps=4, num_stages=1))
    ran = _recorded_descents(monkeypatch)
    kernel_configs.push(lambda key, value: None)
    try:
        # What autotune_to_one_config does right before coordinate descent.
        AutotuneCache.create(meta, kernel, "configs-hash").save(_tuned_config(), 5_000_000, found_by_coordesc=True)
        CachingAutotuner.coordinate_descent_tuning(tuning, launcher)
    finally:
        kernel_configs.pop()
    assert ran == [launcher]


def test_a_reduction_served_from_the_cache_gets_no_halved_rblock_candidates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Torch 2.11 adds halved-RBLOCK candidates to a register-heavy reduction even when its
    config came from the cache; two launchers, so it was tuned again at its first run (one
    kernel of Whisper's encoder, every warm start on an H100). Served, it keeps its one
    config; a kernel still to tune, or one tuned by this process, gets the candidates."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    meta = {"autotune_local_cache": True}
    AutotuneCache.create(meta, str(tmp_path / "ab" / "stored.py"), "configs-hash").save(_tuned_config(), 5_000_000)
    running = SimpleNamespace(config=SimpleNamespace(kwargs={"XBLOCK": 64}, num_warps=4, num_stages=1))
    hit = SimpleNamespace(autotune_cache_info={"autotune_cache_state": "hit"})
    from_a_graph = SimpleNamespace(filename=str(tmp_path / "elsewhere" / "ab" / "stored.py"), inductor_meta=meta,
                                   autotune_cache_info={"autotune_cache_state": "miss"}, compile_results=[running])
    untuned = SimpleNamespace(filename=str(tmp_path / "ab" / "new.py"), inductor_meta=meta,
                              autotune_cache_info={"autotune_cache_state": "miss"}, compile_results=[running])
    scaled: list[object] = []
    # Inductor's scaling replaced by a recorder (Triton cannot run on CPU machines).
    monkeypatch.setattr(CachingAutotuner, "_dynamic_scale_rblock", lambda self: scaled.append(self))
    kernel_configs.push(lambda key, value: None)
    try:
        for autotuner in (hit, from_a_graph, untuned):
            CachingAutotuner._dynamic_scale_rblock(autotuner)
    finally:
        kernel_configs.pop()
    assert scaled == [untuned]
    CachingAutotuner._dynamic_scale_rblock(hit)  # the patch is off with the hook
    assert scaled == [untuned, hit]


def test_the_hook_builds_inductors_selector_only_when_inductor_first_uses_it(sqlite_url: str) -> None:
    """Building it hashes Triton's install (1.1 s on an H100): a compile served from a
    compiled artifact never lowers a GEMM, so the hook puts a stand-in in place."""
    from autotune.inductor_glue.inductor import LazySelector, Selector, install, uninstall

    before = sa._ALGORITHM_SELECTOR_CACHE
    policy = ServePolicy(Settings(cache=sqlite_url))
    handle = install(policy, lazy=True)
    try:
        assert isinstance(sa._ALGORITHM_SELECTOR_CACHE, LazySelector) and handle._selector is None
        built = sa.get_algorithm_selector_cache().selector()  # what a lowering reaches first
        assert isinstance(built, Selector) and built.policy is policy
        sa.add_feedback_saver(lambda *args: None)  # Inductor's own API reaches the real one
        assert sa._ALGORITHM_SELECTOR_CACHE is built and len(built.feedback_saver_fns) >= 1
    finally:
        uninstall(handle)
        policy.close()
    assert sa._ALGORITHM_SELECTOR_CACHE is before


def test_the_sweeps_pass_holds_its_writes_until_flush_and_loses_none(sqlite_url: str) -> None:
    # The pass times kernels in its own process: a writer thread busy in SQLAlchemy then
    # would hold the GIL between their launches. Its writes wait for flush (or close).
    from autotune.inductor_glue.env import kernel_config_environment

    env = kernel_config_environment("cpu")
    store = Store(sqlite_url)
    policy = ServePolicy(Settings(cache=sqlite_url), defer_writes=True)
    policy.save_kernel_config("cpu", "best_config:ab/c1.best_config", {"XBLOCK": 64})
    policy.save_kernel_config("cpu", "best_config:ab/c1.best_config", {"XBLOCK": 128})  # the later one wins
    time.sleep(0.2)
    assert store.kernel_configs(env) == {}
    policy.store.flush(30)
    assert store.kernel_configs(env) == {"best_config:ab/c1.best_config": {"XBLOCK": 128}}
    assert policy.stats.kernel_configs_saved == 1  # one kernel's config (Inductor saves it twice: coordinate descent)
    policy.save_kernel_config("cpu", "best_config:ab/c2.best_config", {"XBLOCK": 32})
    policy.close()  # not flushed: close still hands it to the writer
    policy.store._writer.shutdown(wait=True)
    assert "best_config:ab/c2.best_config" in store.kernel_configs(env)
