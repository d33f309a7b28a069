"""The warm start's synchronous install, step by step, against the floor's Mega-cache load (issue 79).

Set-up, once per run: a key pair, ``autotune sweep MODEL --signing-key`` into a fresh SQLite
cache (winners and signed artifacts), and the floor's Mega-cache blob (a default-mode compile
with caching_precompile on, saved with ``torch.compiler.save_cache_artifacts``). Then, in fresh
processes with empty Inductor caches, taking turns:

- ``warm``: ``autotune.warm_start()`` with the prefetch off (every read on the caller's thread),
  then ``torch.compile(mode="max-autotune")`` and its first call;
- ``floor``: ``torch.compiler.load_cache_artifacts(blob)``, then a default-mode compile's first call;
- with ``--baseline DIR`` (``bash benchmarks/baseline_code.sh COMMIT``), ``warm`` again on that code.

Each step is timed on the caller's thread (wall and CPU seconds): torch's import, the hook's
imports (Inductor's modules that any compile imports among them), the install or the blob's
load (its imports included), the first call, the modules each imported, and inside them the
store's imports, the SQL statements, the signature checks, the artifact fetches, the files
written from payloads, the vector-ISA probes (CPU) and Dynamo's package load.
``--profile DIR`` also writes each child's cProfile there (the floor's from its blob load on).

    python -m benchmarks.install_cost --models mlp,gpt --samples 3
    bash benchmarks/baseline_code.sh 656483c && python -m benchmarks.install_cost --baseline .baseline/656483c
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import harness

log = logging.getLogger("benchmarks.install_cost")

MODELS = {"mlp": "examples/mlp.py", "gpt": "examples/gpt.py"}
# The steps a child reports, in the order the Markdown shows them.
STEPS = ("torch_import_s", "hook_imports_s", "install_s", "install_cpu_s", "blob_load_s", "blob_load_cpu_s",
         "modules_before_call", "first_call_s", "first_call_cpu_s", "modules_in_call", "total_s")
COUNTED = ("store_imports", "sql", "verify", "fetch", "payload_writes", "isa_probe", "package_load")


# ----------------------------------------------------------------------------- child side


def _counter(acc: dict[str, list[float]], key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            entry = acc.setdefault(key, [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - began

    return counted


def _wrap(acc: dict[str, list[float]], key: str, module: str, owner: str, name: str) -> None:
    """Count and time ``module.owner.name`` (owner "" for a module function); a name this code
    lacks is skipped (another version's code)."""
    import importlib

    try:
        target: Any = importlib.import_module(module)
        for part in filter(None, owner.split(".")):
            target = getattr(target, part)
        setattr(target, name, _counter(acc, key, getattr(target, name)))
    except (ImportError, AttributeError):
        log.debug("not timed here: %s.%s.%s", module, owner, name)


def _time_sql(acc: dict[str, list[float]]) -> None:
    """Every SQL statement, once SQLAlchemy is imported (by the store's own import: not earlier)."""
    import sqlalchemy

    started: dict[int, float] = {}

    def before(conn: Any, *_: Any) -> None:
        started[id(conn)] = time.perf_counter()

    def after(conn: Any, *_: Any) -> None:
        entry = acc.setdefault("sql", [0, 0.0])
        entry[0] += 1
        entry[1] += time.perf_counter() - started.pop(id(conn), time.perf_counter())

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", before)
    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "after_cursor_execute", after)


def _instrument_warm(acc: dict[str, list[float]]) -> None:
    import autotune.job.store_imports as store_imports

    original = store_imports._import_store_modules

    def import_and_time() -> None:
        _counter(acc, "store_imports", original)()
        _time_sql(acc)

    store_imports._import_store_modules = import_and_time
    _wrap(acc, "verify", "autotune.cache.signing", "TrustedKeys", "verify")
    _wrap(acc, "fetch", "autotune.job.artifacts", "ArtifactTier", "fetch")
    _wrap(acc, "payload_writes", "autotune.job.artifacts", "", "write_atomic")
    _wrap(acc, "payload_writes", "autotune.job.triton_modules", "", "write_atomic")
    _wrap(acc, "payload_writes", "autotune.inductor_glue.local_cache", "", "write_atomic")
    _wrap(acc, "package_load", "autotune.job.dynamo_package", "PackageSeam", "before_load")


def _load_model(path: str) -> tuple[Any, tuple[Any, ...]]:
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Dynamo's package names the module: import it under its stem
    spec.loader.exec_module(module)
    return module.example()


def _child(args: argparse.Namespace) -> None:
    import autotune

    result: dict[str, Any] = {"scenario": args.child, "code": str(Path(autotune.__file__).parents[1])}
    acc: dict[str, list[float]] = {}
    began = time.perf_counter()
    import torch

    result["torch_import_s"] = time.perf_counter() - began
    model, inputs = _load_model(args.model)
    handle = profile = None
    modules = len(sys.modules)
    if args.child == "floor":
        torch._dynamo.config.caching_precompile = True
        data = Path(args.blob).read_bytes()
        profile = _profiler(args.profile)
        step, cpu = time.perf_counter(), time.process_time()
        torch.compiler.load_cache_artifacts(data)  # its imports of Inductor's modules included
        result["blob_load_s"], result["blob_load_cpu_s"] = time.perf_counter() - step, time.process_time() - cpu
        result["modules_before_call"] = len(sys.modules) - modules
        _wrap(acc, "isa_probe", "autotune.inductor_glue.env", "", "cpu_description")
        compiled = torch.compile(model)
    else:
        step = time.perf_counter()
        import autotune.job.hook  # noqa: F401  (Inductor's modules that any compile imports, among them)

        result["hook_imports_s"] = time.perf_counter() - step
        _wrap(acc, "isa_probe", "autotune.inductor_glue.env", "", "cpu_description")
        _instrument_warm(acc)
        profile = _profiler(args.profile)
        step, cpu = time.perf_counter(), time.process_time()
        handle = autotune.warm_start(args.cache, trusted_keys=[args.trusted])
        result["install_s"], result["install_cpu_s"] = time.perf_counter() - step, time.process_time() - cpu
        result["modules_before_call"] = len(sys.modules) - modules
        compiled = torch.compile(model, mode="max-autotune")
    step, cpu, modules = time.perf_counter(), time.process_time(), len(sys.modules)
    with torch.no_grad():
        compiled(*inputs)
    result["first_call_s"], result["first_call_cpu_s"] = time.perf_counter() - step, time.process_time() - cpu
    result["modules_in_call"] = len(sys.modules) - modules
    # What the warm start imports that the floor does not: the store's and the signatures' libraries.
    result["modules_by_package"] = {package: sum(1 for name in list(sys.modules) if name.split(".")[0] == package)
                                    for package in ("sqlalchemy", "cryptography", "autotune")}
    result["total_s"] = time.perf_counter() - began
    _end_profile(profile, args.profile, args.child)
    if handle is not None:
        stats = handle.stats
        result["stats"] = {k: getattr(stats, k) for k in ("hits", "misses", "benchmarks", "artifacts_loaded",
                                                          "artifacts_rejected", "database_calls", "cpp_compiled")}
    result["counted"] = {k: {"calls": int(n), "s": s} for k, (n, s) in acc.items()}
    harness.emit(result)


def _profiler(folder: str | None) -> Any:
    if not folder:
        return None
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    return profile


def _end_profile(profile: Any, folder: str | None, child: str) -> None:
    if profile is None or not folder:
        return
    profile.disable()
    Path(folder).mkdir(parents=True, exist_ok=True)
    profile.dump_stats(str(Path(folder) / f"{child}-{os.getpid()}.prof"))


# ----------------------------------------------------------------------------- parent side


def _prepare(model: str, tmp: Path, timeout: float) -> dict[str, Any]:
    """A key pair, the swept and signed cache, and the floor's blob, all under ``tmp``."""
    key, cache, blob = tmp / "key", f"sqlite:///{tmp / 'cache.db'}", tmp / "floor.bin"
    env = harness.child_env(tmp / "sweep")
    done = harness.run([*harness.AUTOTUNE, "keys", "new", str(key)], env, 120)
    if done.rc != 0:
        raise SystemExit(f"autotune keys new failed: {harness.tail(done.stderr)}")
    began = time.perf_counter()
    done = harness.run([*harness.AUTOTUNE, "sweep", model, "--cache", cache, "--signing-key", str(key), "--json"],
                       env, timeout)
    report = harness.sweep_report(done.stdout) or {}
    sweep = {"rc": done.rc, "wall_s": time.perf_counter() - began, "totals": report.get("totals")}
    code = ("import sys, torch\nfrom pathlib import Path\nfrom benchmarks.install_cost import _load_model\n"
            "torch._dynamo.config.caching_precompile = True\nmodel, inputs = _load_model(sys.argv[1])\n"
            "with torch.no_grad():\n    torch.compile(model)(*inputs)\n"
            "data, _ = torch.compiler.save_cache_artifacts()\nPath(sys.argv[2]).write_bytes(data)\n")
    done = harness.run([sys.executable, "-c", code, model, str(blob)], harness.child_env(tmp / "floor"), timeout)
    if done.rc != 0 or not blob.exists():
        raise SystemExit(f"the floor's save failed: {harness.tail(done.stderr)}")
    return {"key": str(key), "cache": cache, "blob": str(blob), "blob_bytes": blob.stat().st_size, "sweep": sweep}


def _reuse(folder: Path, model_name: str) -> dict[str, Any]:
    """An earlier run's set-up (its folder, or its MODEL subfolder with several models): key, cache.db, floor.bin."""
    if (folder / model_name).is_dir():
        folder = folder / model_name
    missing = [name for name in ("key.pub", "cache.db", "floor.bin") if not (folder / name).exists()]
    if missing:
        raise SystemExit(f"--prepared {folder} lacks {', '.join(missing)}; leave --prepared out to make them")
    blob = folder / "floor.bin"
    return {"key": str(folder / "key"), "cache": f"sqlite:///{folder / 'cache.db'}", "blob": str(blob),
            "blob_bytes": blob.stat().st_size, "sweep": {"reused": str(folder)}}


def _sample(scenario: str, model: str, prepared: dict[str, Any], code: Path, tmp: Path, args: argparse.Namespace,
            index: int) -> dict[str, Any]:
    child = "floor" if scenario == "floor" else "warm"
    env = harness.child_env(tmp / f"{scenario}-{index}", code=code)
    env["AUTOTUNE_PREFETCH"] = "0"
    # Run from the code's folder (Python puts it first on the path), this file by its path: another
    # commit's code may have no such benchmark.
    runner = f"import runpy; runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')"
    cmd = [sys.executable, "-c", runner, "--child", child, "--model", str((harness.REPO / model).resolve()),
           "--cache", prepared["cache"], "--trusted", f"{prepared['key']}.pub", "--blob", prepared["blob"]]
    if args.profile:
        cmd += ["--profile", str(args.profile / scenario)]
    load = os.getloadavg()[0]
    done = harness.run(cmd, env, args.timeout, cwd=code)
    payload = harness.marker_payload(done.stdout) or {"error": harness.tail(done.stderr)}
    return {**payload, "scenario": scenario, "rc": done.rc, "load_before": round(load, 2)}


def _median(samples: list[dict[str, Any]], key: str) -> float | None:
    values = [s[key] for s in samples if isinstance(s.get(key), (int, float))]
    return statistics.median(values) if values else None


def _median_counted(samples: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    found = [s["counted"][name] for s in samples if name in (s.get("counted") or {})]
    if not found:
        return None
    return {"calls": statistics.median(f["calls"] for f in found), "s": statistics.median(f["s"] for f in found)}


def measure(model_name: str, args: argparse.Namespace) -> dict[str, Any]:
    model = MODELS.get(model_name, model_name)
    tmp = Path(tempfile.mkdtemp(prefix=f"install_cost_{Path(model).stem}_"))
    prepared = _reuse(args.prepared, model_name) if args.prepared else _prepare(model, tmp, args.timeout)
    log.info("%s: cache and blob in %s", model_name, Path(prepared["blob"]).parent)
    codes = {"warm": harness.REPO, "floor": harness.REPO}
    if args.baseline:
        codes["warm-baseline"] = args.baseline.resolve()
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in codes}
    for index in range(args.samples):  # taking turns: a busy moment hits every scenario alike
        for scenario, code in codes.items():
            samples[scenario].append(_sample(scenario, model, prepared, code, tmp, args, index))
            log.info("%s %s #%d: %s", model_name, scenario, index, json.dumps(
                {k: round(v, 2) for k, v in samples[scenario][-1].items() if k.endswith("_s")}))
    medians = {scenario: {**{k: _median(runs, k) for k in STEPS},
                          **{f"{name}": _median_counted(runs, name) for name in COUNTED}}
               for scenario, runs in samples.items()}
    baseline_commit = None
    if args.baseline and (args.baseline / "BASELINE_COMMIT").exists():
        baseline_commit = (args.baseline / "BASELINE_COMMIT").read_text().strip()
    return {"model": model, "blob_bytes": prepared["blob_bytes"], "sweep": prepared["sweep"],
            "baseline_commit": baseline_commit, "medians": medians, "samples": samples}


def render(run: dict[str, Any]) -> list[str]:
    fmt = harness.fmt
    lines = ["Fresh processes with empty Inductor caches, the prefetch off; medians of each scenario's samples "
             "(seconds; `n×` a step's calls). `warm`: `autotune.warm_start()` then max-autotune's first call; "
             "`floor`: `torch.compiler.load_cache_artifacts` then a default compile's first call; "
             "`warm-baseline`: `warm` on the baseline's code.", ""]
    for entry in run.get("models", []):
        lines += [f"### {entry['model']} (blob {entry['blob_bytes']} bytes)", ""]
        if entry.get("baseline_commit"):  # in a table: prose quotes no commit (docs/results.md)
            lines += harness.table(["warm-baseline's code"], [[entry["baseline_commit"]]]) + [""]
        rows = []
        for scenario, m in entry["medians"].items():
            counted = [f"{name} {fmt(c['calls'], '.0f')}× {fmt(c['s'], '.3f')}" for name in COUNTED
                       if (c := m.get(name))]
            rows.append([scenario, len(entry["samples"][scenario]),
                         *(fmt(m.get(k), ".0f" if k.startswith("modules") else ".2f") for k in STEPS),
                         "; ".join(counted) or "-"])
        lines += harness.table(["scenario", "n", *(k.removesuffix("_s") for k in STEPS), "inside (calls, s)"], rows)
        imported = [f"{scenario} {s['modules_by_package']}" for scenario, runs in entry["samples"].items()
                    for s in runs[:1] if s.get("modules_by_package")]
        if imported:
            lines += ["", "Modules imported by the first result, by package: " + "; ".join(imported)]
        stats = [s.get("stats") for runs in entry["samples"].values() for s in runs if s.get("stats")]
        if stats:
            lines += ["", "Hook stats of the warm samples: " + "; ".join(
                " ".join(f"{k}={v}" for k, v in s.items()) for s in stats[:2]) + (" ..." if len(stats) > 2 else "")]
        lines += [""]
    return lines


def results(out: Path) -> harness.Results:
    return harness.Results(out, "install_cost", "The warm start's install, step by step, against the floor", render)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.install_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mlp", help="comma-separated: mlp, gpt or model files (default mlp)")
    parser.add_argument("--samples", type=int, default=3, help="processes per scenario (default %(default)s)")
    parser.add_argument("--baseline", type=Path, help="another commit's code (benchmarks/baseline_code.sh)")
    parser.add_argument("--profile", type=Path, help="write each child's cProfile to this folder")
    parser.add_argument("--prepared", type=Path, help="reuse an earlier run's set-up: a folder (or its MODEL "
                        "subfolder) holding key.pub, cache.db and floor.bin, as the log names it")
    for name in ("--child", "--model", "--cache", "--trusted", "--blob"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    harness.output_options(parser, "install_cost", "cpu, or the GPU's name", timeout=1200.0)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    harness.log_to_stderr()
    store = results(args.out)
    run = harness.new_run(store, args.label, "benchmarks.install_cost", sys.argv[1:] if argv is None else argv)
    run["models"] = [measure(name.strip(), args) for name in args.models.split(",") if name.strip()]
    store.save()
    log.info("wrote %s", store.path.with_suffix(".md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
