"""Every command's exit status, against the one table it is documented by (autotune.cli's
EXIT_STATUSES and COMMAND_EXITS; docs/cli.md#exit-status is generated from them): each
cause a command can meet is met here, in a real `autotune` process, and must give the
table's code. A pair in the table without a case here fails the first test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from factories import make_env, make_request, make_result

from autotune.cache import Store
from autotune.cli import COMMAND_EXITS, EXIT_STATUSES, ExitStatus

REPO = Path(__file__).resolve().parents[1]
MODELS = Path(__file__).parent / "models"
TINY = str(MODELS / "tiny_mlp.py")
STATUS = {status.cause: status for status in EXIT_STATUSES}


def autotune(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune.cli", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, env={**os.environ, **(env or {})}, timeout=timeout)


class Where:
    """What the cases run against: a populated SQLite cache, an export of it, a working folder."""

    def __init__(self, tmp_path: Path, readonly: tuple[str, str] | None = None) -> None:
        self.dir = tmp_path
        self.url = f"sqlite:///{tmp_path / 'cache.db'}"
        self.readonly = readonly
        with Store(self.url) as store:
            store.put_results([make_result(m=64 * i) for i in range(1, 4)])
            store.record_miss(make_env(), make_request(m=3, n=5, k=7), host="train-0")
            self.first_id = store.list_results()[0][0]
        self.export = tmp_path / "cache.jsonl"
        assert autotune("cache", "--cache", self.url, "export", str(self.export)).returncode == 0

    @property
    def reader(self) -> str:
        assert self.readonly is not None, "this case needs the read-only role"
        return self.readonly[1]


def _unreachable() -> str:
    return "postgresql://postgres@127.0.0.1:1/kernels"  # nothing listens on port 1: refused at once


def _keys(where: Where) -> str:
    path = where.dir / "signer"
    assert autotune("keys", "new", str(path)).returncode == 0
    return str(path)


def _garbage(where: Where) -> str:
    path = where.dir / "garbage.jsonl"
    path.write_text("this is no export\n")
    return str(path)


def _script(where: Where, code: str) -> str:
    path = where.dir / "job.py"
    path.write_text(code)
    return str(path)


# (command, cause) -> the arguments that meet that cause. "closed pipe" is met with a real pipe
# by its own tests below; "sweep"'s "work failed" by a real sweep (slow).
Case = Callable[[Where], list[str]]
CASES: dict[tuple[str, str], Case] = {
    ("", "done"): lambda w: ["--version"],
    ("", "bad input"): lambda w: ["nonesuch"],
    ("cache stats", "done"): lambda w: ["cache", "--cache", w.url, "stats"],
    ("cache stats", "bad input"): lambda w: ["cache", "--cache", _unreachable(), "stats"],
    ("cache ls", "done"): lambda w: ["cache", "--cache", w.url, "ls", "--misses"],
    ("cache ls", "bad input"): lambda w: ["cache", "--cache", w.url, "ls", "--misses", "--artifacts"],
    ("cache show", "done"): lambda w: ["cache", "--cache", w.url, "show", str(w.first_id)],
    ("cache show", "bad input"): lambda w: ["cache", "--cache", w.url, "show", "999999"],
    ("cache export", "done"): lambda w: ["cache", "--cache", w.url, "export", str(w.dir / "again.jsonl")],
    ("cache export", "bad input"): lambda w: ["cache", "--cache", w.url, "export", str(w.dir / "no" / "x.jsonl")],
    ("cache import", "done"): lambda w: ["cache", "--cache", f"sqlite:///{w.dir / 'new.db'}", "import", str(w.export)],
    ("cache import", "bad input"): lambda w: ["cache", "--cache", w.url, "import", _garbage(w)],
    ("cache import", "refused write"): lambda w: ["cache", "--cache", w.reader, "import", str(w.export)],
    ("cache prune", "done"): lambda w: ["cache", "--cache", w.url, "prune", "--older-than", "30d"],
    ("cache prune", "bad input"): lambda w: ["cache", "--cache", w.url, "prune"],
    ("cache prune", "refused write"): lambda w: ["cache", "--cache", w.reader, "prune", "--older-than", "1s"],
    ("cache upgrade", "done"): lambda w: ["cache", "--cache", f"sqlite:///{w.dir / 'fresh.db'}", "upgrade"],
    ("cache upgrade", "bad input"): lambda w: ["cache", "--cache", _unreachable(), "upgrade"],
    # The cache's misses are another machine's (an H100): nothing to tune here, and a note says so.
    ("sweep", "done"): lambda w: ["sweep", "--misses", "--dry-run", "--device", "cpu", "--cache", w.url],
    ("sweep", "bad input"): lambda w: ["sweep", str(w.dir / "missing.py"), "--cache", w.url],
    ("sweep", "refused write"): lambda w: ["sweep", TINY, "--device", "cpu", "--cache", w.reader],
    ("run", "bad input"): lambda w: ["run", str(w.dir / "missing.py")],
    ("keys new", "done"): lambda w: ["keys", "new", str(w.dir / "new-key")],
    ("keys new", "bad input"): lambda w: ["keys", "new", _keys(w)],  # exists: --force names the fix
    ("keys show", "done"): lambda w: ["keys", "show", _keys(w) + ".pub"],
    ("keys show", "bad input"): lambda w: ["keys", "show", _garbage(w)],
    ("doctor", "bad input"): lambda w: ["doctor", "--bogus"],
}
NEEDS_ROLE = {pair for pair in CASES if pair[1] == "refused write"}
# Met by tests of their own below, which read the code from the table too.
OWN_TESTS = {("cache ls", "closed pipe"), ("cache export", "closed pipe"), ("sweep", "work failed"),
             ("doctor", "done"), ("doctor", "work failed")}


def test_every_cause_of_every_command_in_the_table_is_tested() -> None:
    table = {(command, status.cause) for command, statuses in COMMAND_EXITS.items() for status in statuses}
    assert table == set(CASES) | OWN_TESTS
    assert len({status.cause for status in EXIT_STATUSES}) == len(EXIT_STATUSES)  # a cause has one code


@pytest.fixture
def where(tmp_path: Path) -> Where:
    return Where(tmp_path)


@pytest.mark.parametrize("pair", sorted(set(CASES) - NEEDS_ROLE), ids=lambda p: f"{p[0] or 'autotune'}: {p[1]}")
def test_each_command_exits_by_the_table(pair: tuple[str, str], where: Where) -> None:
    _check(pair, where)


@pytest.mark.parametrize("pair", sorted(NEEDS_ROLE), ids=lambda p: f"{p[0]}: {p[1]}")
def test_a_refused_write_is_the_same_code_from_every_command(pair: tuple[str, str], tmp_path: Path,
                                                             readonly_postgres_url: tuple[str, str]) -> None:
    """The same refused write (a role that may only read) from every command that writes."""
    _check(pair, Where(tmp_path, readonly_postgres_url))


def _check(pair: tuple[str, str], where: Where) -> None:
    expected: ExitStatus = STATUS[pair[1]]
    done = autotune(*CASES[pair](where), cwd=where.dir)
    assert done.returncode == expected.code, f"{pair}: {done.returncode}\n{done.stdout[-1500:]}{done.stderr[-1500:]}"
    assert "Traceback" not in done.stderr
    if expected.code == STATUS["bad input"].code or expected is STATUS["refused write"]:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    if pair == ("sweep", "done"):
        assert "note: nothing to tune" in done.stdout, done.stdout
    if pair == ("sweep", "refused write"):
        assert "may not write" in done.stderr


def test_run_exits_with_its_scripts_status(where: Where) -> None:
    done = autotune("run", _script(where, "import sys\nsys.exit(5)\n"), "--cache", where.url, cwd=where.dir)
    assert done.returncode == 5, done.stderr[-2000:]


# ------------------------------------------------------------------ a closed pipe


@pytest.fixture
def many_rows(tmp_path: Path) -> str:
    """A cache whose listing is far bigger than a pipe's buffer: the reader's leaving is seen."""
    url = f"sqlite:///{tmp_path / 'many.db'}"
    with Store(url) as store:
        store.put_results([make_result(m=i + 1) for i in range(2000)])
    return url


def _read_one_line_then_close(args: list[str]) -> tuple[int, str]:
    """`autotune ARGS | head -1` with a real pipe: the reader closes it after one line."""
    proc = subprocess.Popen([sys.executable, "-m", "autotune.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert first, err
    return code, err


@pytest.mark.parametrize("listing", [["ls", "--limit", "0"], ["ls", "--limit", "0", "--json"], ["export", "-"]],
                         ids=lambda a: " ".join(a))
def test_a_closed_pipe_gives_the_same_code_every_time(listing: list[str], many_rows: str) -> None:
    runs = [_read_one_line_then_close(["cache", "--cache", many_rows, *listing]) for _ in range(4)]
    assert runs == [(STATUS["closed pipe"].code, "")] * 4


# ------------------------------------------------------------------ what a sweep meets


@pytest.mark.parametrize(("name", "text", "args", "needle"), [
    ("missing.py", None, [], "no such file"),
    ("syntax.py", "def example(:\n", [], "syntax error"),
    ("no_example.py", "import torch\nmodel = torch.nn.Linear(2, 2)\n", [], "defines no function example()"),
    ("mlp.py", "from tiny_mlp import example\n", ["--mode", "bogus"], "is not a torch.compile mode"),
    ("mlp.py", "from tiny_mlp import example\n", ["--device", "cuda"], "--device cuda"),
    ("mlp.py", "from tiny_mlp import example\n", ["--inductor-config", "freezing"], "expected KEY=VALUE"),
])
def test_a_sweeps_mistakes_are_told_before_anything_starts_and_leave_nothing(
        tmp_path: Path, name: str, text: str | None, args: list[str], needle: str) -> None:
    """One line and exit 2, with neither torch, Ray nor SQLAlchemy imported (so no Inductor,
    no Ray and no database started), and no cache file or log left behind."""
    if "--device" in args and _has_cuda():
        pytest.skip("this host has a CUDA GPU: --device cuda is no mistake here")
    model = tmp_path / "work" / name
    model.parent.mkdir()
    if text is not None:
        model.write_text(text)
    cache = tmp_path / "cache" / "cache.db"
    code = ("import sys\nfrom autotune.cli import main\n"
            "try:\n    main(sys.argv[1:])\n"
            "finally:\n    print('loaded:', sorted(m for m in ('torch', 'ray', 'sqlalchemy') if m in sys.modules),"
            " file=sys.stderr)\n")
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code, "sweep", str(model), "--cache", str(cache), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(MODELS), "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    seconds = time.monotonic() - began
    lines = done.stderr.splitlines()
    assert done.returncode == STATUS["bad input"].code, done.stderr
    assert len(lines) == 2 and lines[0].startswith("Error: ") and needle in lines[0], done.stderr
    assert lines[1] == "loaded: []"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == sorted(
        ["work", *(["work/" + name] if text is not None else [])])  # no cache, no log, no folder for them
    assert seconds < 30, seconds  # in seconds, not after a capture (the benchmark times it: cli_latency.py)


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_load_neither_torch_ray_nor_sqlalchemy(flag: str) -> None:
    """What keeps them within a second (benchmarks/cli_latency.py times them): the CLI's module
    imports only click, rich and autotune's plain records."""
    code = ("import sys\nfrom autotune.cli import main\ntry:\n    main([sys.argv[1]])\nexcept SystemExit as done:\n"
            "    print(done.code, sorted(m for m in ('torch', 'ray', 'sqlalchemy') if m in sys.modules), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code, flag], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.stderr.strip() == "0 []", done.stderr


def _has_cuda() -> bool:
    from autotune.cli import _no_cuda_here

    return _no_cuda_here() is None


def test_a_sweep_that_fails_after_its_log_is_made_leaves_the_error_in_it(
        tmp_path: Path, readonly_postgres_url: tuple[str, str]) -> None:
    log = tmp_path / "sweep.log"
    done = autotune("sweep", TINY, "--device", "cpu", "--cache", readonly_postgres_url[1], "--log", str(log))
    assert done.returncode == STATUS["refused write"].code, done.stderr
    text = log.read_text()
    assert "the sweep stopped: CacheWriteRefused: cannot write to cache database" in text and "may not write" in text


@pytest.mark.slow
def test_a_sweep_whose_requests_fail_exits_work_failed(tmp_path: Path) -> None:
    """A real sweep (Ray, capture, tuning) whose every request's tuning process dies: the
    request keys are hexadecimal, so one crash per leading digit fails them all."""
    crash_all = ",".join(f"crash:{digit}" for digit in "0123456789abcdef")
    done = autotune("sweep", TINY, "--device", "cpu", "--cache", f"sqlite:///{tmp_path / 'c.db'}", "--json",
                    env={"AUTOTUNE_FAULT_INJECT": crash_all}, timeout=600)
    assert done.returncode == STATUS["work failed"].code, done.stderr[-3000:]
    totals = json.loads(done.stdout)["totals"]
    assert totals["failed"] == totals["found"] > 0, totals


def test_doctor_exits_done_or_work_failed_as_its_report_says() -> None:
    from autotune.doctor import exit_code

    done = autotune("doctor", "--json")
    report = json.loads(done.stdout)
    expected = STATUS["done"] if exit_code(report) == 0 else STATUS["work failed"]
    assert done.returncode == expected.code == exit_code(report), done.stderr[-2000:]
