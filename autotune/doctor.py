"""``autotune doctor``: what this install of autotune runs on, and what of it works here.

It reports autotune's version and extras, torch, Triton, Python, the device, the C++ compiler
Inductor would use and whether the configured cache answers; then each feature on or off.

Each feature depends on private torch attributes (``inductor_glue/seams.py``). A feature
is on when every seam it needs resolves on this torch, and off otherwise, naming the
seam and what happens instead. The verdict is about the torch install, so it is reached
the same way on any machine: a GPU-only feature (pinning, kernel configs, the two kinds
of verdicts, CUDA-graph reload) is still checked on a CPU, and shown as such, but only
the features this machine would use decide the exit status: 0 when all of them are on,
1 otherwise. The rest are warnings, exit 0: a torch release autotune was not tested on, a
Triton other than the one torch pins, a feature off, no C++ compiler, a cache that does not
answer.

It stays cheap (at most a few seconds on a 2-core machine): versions come from the installed
packages' metadata, not their imports; the compiler is found, not run on a source; the cache
is asked one query, with short timeouts, on a thread beside torch's imports.
"""

from __future__ import annotations

import importlib.metadata
import logging
import platform
import re
import shutil
import sqlite3
import subprocess
import threading
import time
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

import autotune

GPU_ONLY_NOTE = "GPUs only"
# torch releases (major.minor) autotune was tested on: CI's full suite on the newest, its fast
# subset on 2.11 (the GPU machines'), and the wheel's install and quickstart on each
# (benchmarks/install_matrix.sh). A release that is not here gets a warning, not a refusal.
TESTED_TORCH = ("2.11", "2.13", "2.14", "2.15")
# Each extra of pyproject.toml and the distributions it adds (tests/test_doctor.py checks them).
EXTRAS = {"sweep": ("ray",), "postgres": ("psycopg",), "bench": ("matplotlib",)}
DISTRIBUTION = "inductor-autotune"
CACHE_TIMEOUT_S = 3.0  # the connect and the query of the cache check, each
_URL_FORMS = "use sqlite:///PATH, a file path or postgresql://USER@HOST[:PORT]/DB"


def diagnose(cache: str | None = None) -> dict[str, Any]:
    """The report ``autotune doctor --json`` prints; ``cache`` is the configured cache's URL
    (None: the default SQLite file)."""
    probe = _CacheProbe(cache)
    probe.start()  # a server's round trips overlap torch's imports
    import torch

    from autotune.inductor_glue import seams
    from autotune.inductor_glue.env import cpu_model

    gpu = torch.cuda.is_available()
    features = [_feature(seams.state(feature), gpu) for feature in seams.FEATURES]
    absent = [{"seam": seam.path, "why": seam.why} for seam in seams.SEAMS
              if not seam.required and seam.problem() is not None]
    report: dict[str, Any] = {
        "autotune": autotune.__version__,
        "torch": torch.__version__,
        "torch_tested": _tested(torch.__version__),
        "tested_torch": list(TESTED_TORCH),
        "triton": _installed("triton") or "not installed",
        "triton_pinned": triton_pin(_torch_requires()),
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if gpu else f"cpu ({cpu_model()})",
        "extras": extras(),
        "compiler": compiler(),
        "cache": probe.result(),
        "features": features,
        "optional_seams_absent": absent,
        "ok": all(entry["on"] for entry in features if entry["used_here"]),
    }
    report["warnings"] = warnings(report)
    return report


def _feature(state: Any, gpu: bool) -> dict[str, Any]:
    feature = state.feature
    return {
        "key": feature.key,
        "name": feature.name,
        "on": state.on,
        "gpu_only": feature.gpu_only,
        "used_here": gpu or not feature.gpu_only,
        "missing": [{"seam": seam.path, "kind": seam.kind, "problem": problem} for seam, problem in state.missing],
        "instead": None if state.on else feature.fallback,
    }


def exit_code(report: dict[str, Any]) -> int:
    return 0 if report["ok"] else 1


def leave(code: int) -> NoReturn:
    """End the process with ``code``, its output flushed, without the interpreter's teardown:
    tearing down what the seams' check imported (torch, Dynamo, Inductor) is a large part of
    doctor's time. Only where the output is the process's own: a caller that captures it (a test's
    runner, a script calling ``cli.main``) gets SystemExit, as from any command."""
    import os
    import sys

    out, err = sys.stdout, sys.stderr
    if out is not sys.__stdout__ or err is not sys.__stderr__:
        raise SystemExit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


# ------------------------------------------------------------------ versions


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> str:
    """'2.15.0+cu130' -> '2.15'."""
    return ".".join(re.split(r"[.+]", version)[:2])


def _tested(version: str) -> bool:
    return _release(version) in TESTED_TORCH


def _torch_requires() -> list[str]:
    try:
        return importlib.metadata.requires("torch") or []
    except importlib.metadata.PackageNotFoundError:
        return []


def triton_pin(requires: list[str]) -> str | None:
    """The Triton release(s) torch's metadata asks for on this platform, as its specifier
    (``triton==3.6.0; markers`` gives ``==3.6.0``, ``triton~=3.9.0`` gives ``~=3.9.0``), or None:
    a CPU build asks for none."""
    for requirement in requires:
        match = re.fullmatch(r"\s*triton\s*((?:==|~=|>=|<=|!=|<|>)[^;]+?)\s*(?:;(.*))?", requirement)
        if match and _marker_holds(match[2]):
            return match[1].replace(" ", "")
    return None


def triton_matches(installed: str | None, pin: str | None) -> bool:
    """Whether the installed Triton is one that torch's pin allows (no pin: any, or none)."""
    if pin is None:
        return True
    if installed is None:
        return False
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:  # no packaging here: ==X and ~=X.Y.Z by hand, other forms taken as met
        if pin.startswith("=="):
            return installed == pin[2:]
        if pin.startswith("~="):
            return installed.startswith(pin[2:].rsplit(".", 1)[0] + ".")
        return True
    return SpecifierSet(pin).contains(installed, prereleases=True)


def _marker_holds(marker: str | None) -> bool:
    if not marker or not marker.strip():
        return True
    try:
        from packaging.markers import Marker
    except ImportError:  # no packaging here: a pin torch declares is taken to apply
        return True
    return Marker(marker).evaluate({"extra": ""})


def extras() -> dict[str, dict[str, str | None]]:
    """Each extra: the version of each distribution it adds, None where that one is absent."""
    return {extra: {name: _installed(name) for name in names} for extra, names in EXTRAS.items()}


# ------------------------------------------------------------------ compiler


def compiler() -> dict[str, Any]:
    """The C++ compiler Inductor's CPU code is built with, as Inductor finds it, and its
    version line; nothing is compiled."""
    from autotune.inductor_glue import seams

    try:
        found = str(seams.CPP_COMPILER.get()())
    except Exception as exc:  # noqa: BLE001 - none found (torch raises its InvalidCxxCompiler) or no seam
        return {"name": None, "path": None, "version": None, "problem": _one_line(exc)}
    path = shutil.which(found)
    return {"name": found, "path": path, "version": _compiler_version(path or found), "problem": None}


def _compiler_version(path: str) -> str | None:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.splitlines()[0].strip() if done.stdout.strip() else None


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


# ------------------------------------------------------------------ the cache


class _CacheProbe:
    """One query to the configured cache, on a thread of its own, within CACHE_TIMEOUT_S."""

    def __init__(self, url: str | None) -> None:
        from autotune.cache.errors import CacheUnavailable
        from autotune.cache.url import resolve_cache_url

        self.url = resolve_cache_url(url)
        if self.url.partition("://")[0].split("+")[0] not in ("sqlite", "postgresql"):  # bad input: exit 2
            raise CacheUnavailable(f"unsupported cache database in {masked(self.url)}: {_URL_FORMS}")
        self._result: dict[str, Any] = {"url": masked(self.url), "answers": False, "detail": "not checked"}
        self._thread = threading.Thread(target=self._run, name="autotune-doctor-cache", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def result(self) -> dict[str, Any]:
        self._thread.join(3 * CACHE_TIMEOUT_S)
        if self._thread.is_alive():
            return {**self._result, "answers": False, "detail": f"no answer within {3 * CACHE_TIMEOUT_S:.0f} s"}
        return self._result

    def _run(self) -> None:
        began = time.perf_counter()
        try:
            answers, detail = check_cache(self.url)
        except Exception as exc:  # noqa: BLE001 - whatever the database says is the report
            answers, detail = False, _one_line(exc)
        self._result = {**self._result, "answers": answers, "detail": detail,
                        "seconds": round(time.perf_counter() - began, 3)}


def masked(url: str) -> str:
    """The URL with its password hidden."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def check_cache(url: str) -> tuple[bool, str]:
    """(whether the cache answers, what it said): one read-only query, nothing created."""
    scheme, _, rest = url.partition("://")
    if scheme == "sqlite":
        return _check_sqlite(rest.removeprefix("/").split("?", 1)[0])
    if scheme.split("+")[0] == "postgresql":
        return _check_postgres(f"postgresql://{rest}")
    return False, f"unsupported cache database {scheme!r}: {_URL_FORMS}"


def _check_sqlite(path: str) -> tuple[bool, str]:
    from pathlib import Path

    if path in ("", ":memory:"):
        return True, "an in-memory SQLite database"
    if not Path(path).exists():
        return False, f"no database at {path} yet: the first sweep (or a job's write-back) creates it"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=CACHE_TIMEOUT_S) as conn:
        return True, _schema(conn.execute, "SQLite")


def _check_postgres(conninfo: str) -> tuple[bool, str]:
    try:
        import psycopg
    except ImportError:
        return False, f"psycopg is not installed: pip install '{DISTRIBUTION}[postgres]'"
    from psycopg.conninfo import conninfo_to_dict

    timeout_ms = int(CACHE_TIMEOUT_S * 1000)
    params: dict[str, Any] = dict(conninfo_to_dict(conninfo))
    # The URL's own options (a search_path) stay; the timeouts join them.
    params["options"] = f"{params.get('options') or ''} -c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms}"
    params["connect_timeout"] = max(1, int(CACHE_TIMEOUT_S))
    with psycopg.connect(autocommit=True, **params) as conn:
        return True, _schema(conn.execute, f"PostgreSQL {conn.info.server_version // 10000}")


def _schema(execute: Any, server: str) -> str:
    """Which revision of autotune's schema the database holds, if any."""
    try:
        row = execute("SELECT version_num FROM alembic_version").fetchone()
    except Exception:  # noqa: BLE001 - no such table: nothing of ours yet
        return f"{server}, answers; no autotune schema yet (the first sweep creates it)"
    return f"{server}, answers; schema revision {row[0] if row else 'none'}"


# ------------------------------------------------------------------ warnings and text


def warnings(report: dict[str, Any]) -> list[str]:
    """Everything the report found that a user should know of, one line each."""
    found = []
    if not report["torch_tested"]:
        found.append(f"torch {report['torch']} was not tested with autotune {report['autotune']} (tested: "
                     f"{', '.join(report['tested_torch'])}); the features below say what resolves on it")
    pinned, triton = report["triton_pinned"], report["triton"]
    if not triton_matches(None if triton == "not installed" else triton, pinned):
        found.append(f"triton {triton} is not the triton{pinned} torch {report['torch']} pins: "
                     f"pip install 'triton{pinned}'")
    for entry in report["features"]:
        if not entry["on"]:
            missing = ", ".join(item["seam"] for item in entry["missing"])
            where = "" if entry["used_here"] else f" ({GPU_ONLY_NOTE}: not used here)"
            found.append(f"{entry['name']} is off: no {missing}; {entry['instead']}{where}")
    if report["compiler"]["name"] is None:
        found.append(f"no C++ compiler for Inductor's CPU code ({report['compiler']['problem']}): "
                     "apt install g++ python3-dev, or set CXX")
    cache = report["cache"]
    if not cache["answers"] and not cache["detail"].startswith("no database at "):
        found.append(f"the cache {cache['url']} does not answer: {cache['detail']}")
    return found


def render(report: dict[str, Any]) -> list[str]:
    """The report as lines of text."""
    tested = "" if report["torch_tested"] else "  (not tested)"
    pin = f"  (torch pins triton{report['triton_pinned']})" if report["triton_pinned"] else ""
    lines = [f"torch    {report['torch']}{tested}", f"triton   {report['triton']}{pin}",
             f"Python   {report['python']}", f"device   {report['device']}", f"autotune {report['autotune']}",
             f"extras   {_render_extras(report['extras'])}", f"C++      {_render_compiler(report['compiler'])}"]
    cache = report["cache"]
    lines.append(f"cache    {cache['url']}: {cache['detail']}")
    width = max(len(entry["name"]) for entry in report["features"])
    for entry in report["features"]:
        note = "" if entry["used_here"] else f"  ({GPU_ONLY_NOTE}: not used here)"
        if entry["on"]:
            lines.append(f"{entry['name']:<{width}}  on{note}")
            continue
        missing = ", ".join(item["seam"] for item in entry["missing"])
        lines.append(f"{entry['name']:<{width}}  off: no {missing}; {entry['instead']}{note}")
    for item in report["optional_seams_absent"]:
        lines.append(f"(not in this torch, and handled: {item['seam']})")
    lines.extend(f"warning: {line}" for line in report["warnings"])
    return lines


def _render_extras(found: dict[str, dict[str, str | None]]) -> str:
    parts = []
    for extra, versions in found.items():
        if all(versions.values()):
            parts.append(f"[{extra}] " + ", ".join(f"{name} {version}" for name, version in versions.items()))
        else:
            parts.append(f"[{extra}] not installed")
    return "; ".join(parts)


def _render_compiler(found: dict[str, Any]) -> str:
    if found["name"] is None:
        return f"none found: {found['problem']}"
    return f"{found['path'] or found['name']}" + (f" ({found['version']})" if found["version"] else "")
