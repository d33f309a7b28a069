"""What every benchmark shares: the machine, versions, date and code its results name;
child processes with fresh compile caches; one results file per benchmark.

A results file ``<out>/<name>.json`` holds ``{"benchmark": name, "runs": [...]}``. Each run
names its machine, versions, date, code commit and command; a run of the same label
replaces the one before, and ``<name>.md`` beside it is made from the JSON. The commit is
read from git, never typed: on a tree with uncommitted changes the run also names the
tree's hash and its diff (``<out>/diffs/<tree>.diff``); a copy of the tree without .git
names the code of ``benchmarks/code_stamp.json`` (``stamp``) where its files match it.

    python -m benchmarks.harness stamp   # before copying the tree to a machine without .git

    python -m benchmarks.harness merge benchmarks/results/compile_time.json $OUT/compile_time.json
    python -m benchmarks.harness render benchmarks/results/*.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import importlib
import json
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("benchmarks")

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MARKER = "RESULT "  # a child's one result line; the rest of its stdout is ignored
TAIL_CHARS = 4000
# A child cut at its timeout gets SIGTERM first and SIGKILL this long after: a sweep's end-to-end
# pass then stores the kernel configs it tuned, and the next attempt goes on from them.
STOP_GRACE_S = 30.0
PYCACHE = Path(tempfile.gettempdir()) / "autotune-bench-pycache"
# What the bytecode warm-up imports: every compile's stack, the hook and the cache.
WARM_IMPORTS = ("torch", "torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.select_algorithm",
                "autotune.job.hook", "autotune.job.artifacts", "autotune.cache.store", "sqlalchemy.dialects.sqlite.pysqlite",
                "sqlalchemy.dialects.postgresql.psycopg", "alembic.command", "ray", "autotune.cli",
                "autotune.workers.child", "autotune.workers.tune")
AUTOTUNE = [sys.executable, "-c", "from autotune.cli import main; main(prog_name='autotune')"]


def output_options(parser: argparse.ArgumentParser, name: str, label_default: str | None, *,
                   timeout: float | None = None, per: str = "process", out_help: str | None = None) -> None:
    """The options every benchmark takes: where its results go (``--out``), the run's name
    (``--label``, unless ``label_default`` is None: a benchmark that names its runs itself) and,
    for one that runs children, each one's time limit (``--timeout``)."""
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help=out_help or f"folder of {name}.json/.md (default benchmarks/results)")
    if label_default is not None:
        parser.add_argument("--label", default=None, help=f"the run's name in the results (default: {label_default})")
    if timeout is not None:
        parser.add_argument("--timeout", type=float, default=timeout, help=f"seconds per {per} (default %(default)s)")


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


STAMP = REPO / "benchmarks" / "code_stamp.json"  # written by ``stamp`` before a copy without .git travels
DIFFS = "diffs"  # beside a results file: the uncommitted changes a run measured, by tree hash


@dataclass(frozen=True)
class Code:
    """The code a run measured: the commit, and the tree's hash and diff where the tree differs from it."""

    commit: str | None
    tree: str | None = None
    diff: str = ""
    note: str | None = None  # why the code is not known exactly

    def field(self) -> str | None:
        """The run's "commit": the full hash, with ``+changes`` where the tree is not that commit's."""
        if self.commit is None:
            return None
        return self.commit + ("+changes" if self.diff else "")


def _git(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd or REPO, capture_output=True, text=True, timeout=60,
                              env={**os.environ, **(env or {})})
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _tree(git_env: dict[str, str], work_tree: Path) -> str | None:
    """The hash of ``work_tree`` as git would commit it: tracked and untracked files that .gitignore keeps, less
    the stamp (which names this hash)."""
    env = {**git_env, "GIT_WORK_TREE": str(work_tree)}
    # No ":!stamp" pathspec: git refuses a pathspec naming an ignored file, and .gitignore has the stamp.
    if _git("add", "-A", ".", env=env, cwd=work_tree) is None:
        return None
    if _git("rm", "--cached", "-q", "--ignore-unmatch", str(STAMP.relative_to(REPO)), env=env, cwd=work_tree) is None:
        return None
    written = _git("write-tree", env=env, cwd=work_tree)
    return written.strip() if written else None


def code_of_checkout() -> Code | None:
    """This checkout's code: HEAD, and where the files differ from it, their tree's hash and the diff."""
    head = _git("rev-parse", "HEAD")
    if head is None:
        return None
    with tempfile.TemporaryDirectory(prefix="bench_index_") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git("read-tree", "HEAD", env=env)
        tree = _tree(env, REPO)
        base = (_git("rev-parse", "HEAD^{tree}") or "").strip()
        if tree is None or tree == base:
            return Code(head.strip())
        diff = _git("diff", "--cached", "--binary", "HEAD", env=env) or ""
    return Code(head.strip(), tree, diff)


def blob_hash(data: bytes) -> str:
    """A file's git blob hash, computed without git (a device image may have none)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def file_blob_hash(path: Path) -> str:
    """The blob hash git stores for ``path``: a link's is its target's name, as git keeps links."""
    return blob_hash(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())


def _stamped_files() -> dict[str, str]:
    """Every file git would commit here (tracked, and untracked that .gitignore keeps), less the
    stamp, with its blob hash."""
    listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard") or ""
    stamp = str(STAMP.relative_to(REPO))
    return {name: file_blob_hash(REPO / name)
            for name in sorted(set(listed.split("\0"))) if name and name != stamp and (REPO / name).is_file()}


def files_differing(root: Path, files: dict[str, str]) -> list[str]:
    """The stamped files that are absent under ``root`` or hash otherwise."""
    return [name for name, digest in files.items()
            if not (root / name).is_file() or file_blob_hash(root / name) != digest]


def code_of_copy() -> Code:
    """A copy without .git: the stamp's code, where this copy's files hash to the stamp's tree
    (with git) or to its files' blob hashes (without)."""
    if not STAMP.exists():
        return Code(None, note="no .git and no benchmarks/code_stamp.json (run `python -m benchmarks.harness stamp`)")
    stamp = json.loads(STAMP.read_text())
    with tempfile.TemporaryDirectory(prefix="bench_git_") as tmp:
        env = {"GIT_DIR": str(Path(tmp) / ".git")}
        tree = _tree(env, REPO) if _git("init", "-q", tmp, cwd=Path(tmp)) is not None else None
    if tree is None and stamp.get("files"):
        differing = files_differing(REPO, stamp["files"])
        if differing:
            return Code(None, note=f"{len(differing)} files differ from benchmarks/code_stamp.json's, "
                                   f"{', '.join(differing[:3])} first")
    elif tree != stamp["tree"]:
        return Code(None, note=f"the files differ from benchmarks/code_stamp.json's (tree {tree})")
    return Code(stamp["commit"], stamp["tree"] if stamp.get("diff") else None, stamp.get("diff", ""))


def commit_files(commit: str) -> dict[str, str]:
    """A commit's files with their blob hashes, as git stores them."""
    listed = _git("ls-tree", "-r", "-z", commit) or ""
    rows = (line.split("\t", 1) for line in listed.split("\0") if line)
    return {name: meta.split()[2] for meta, name in rows if meta.split()[1] == "blob"}


def attest(results: Path, archive: Path, stamp_path: Path) -> int:
    """Name the commit of runs made from ``archive`` (a ``git archive`` of the stamp's commit that
    travelled to a machine) whose copy could not name it then: the archive's files are checked
    against the commit's here, by blob hash, and each such run says it was attested."""
    stamp = json.loads(stamp_path.read_text())
    expected = commit_files(stamp["commit"])
    if not expected:
        raise SystemExit(f"attest: commit {stamp['commit']} is not in this repository; fetch it first")
    with tempfile.TemporaryDirectory(prefix="bench_attest_") as tmp:
        shutil.unpack_archive(str(archive), tmp)
        differing = files_differing(Path(tmp), expected)
    if differing or stamp.get("diff"):
        raise SystemExit(f"attest: {archive} is not commit {stamp['commit']}'s files "
                         f"({len(differing)} differ); rerun on a copy made by `git archive`")
    store = results_of(results)
    named = [run for run in store.data["runs"] if run.get("commit") is None and run.get("code_note")]
    for run in named:
        run["commit"] = stamp["commit"]
        run["code_note"] = (f"attested after the run: it ran from {archive.name}, whose files are this commit's "
                            f"(checked by blob hash); at run time: {run['code_note']}")
    store.save()
    print(f"attested {len(named)} runs of {results} as {stamp['commit'][:12]}")
    return 0


def code() -> Code:
    """The code measured, read from git: never typed by hand."""
    return code_of_checkout() or code_of_copy()


def commit() -> str | None:
    """The run's "commit" field (see ``Code.field``)."""
    return code().field()


def write_commit_stamp(commit: str, target: Path) -> Path:
    """The stamp of one commit's files (for its ``git archive``, whatever this checkout holds)."""
    full = (_git("rev-parse", "--verify", f"{commit}^{{commit}}") or "").strip()
    if not full:
        raise SystemExit(f"stamp --commit {commit}: no such commit here")
    tree = (_git("rev-parse", f"{full}^{{tree}}") or "").strip()
    target.write_text(json.dumps({"commit": full, "tree": tree, "diff": "", "files": commit_files(full)}) + "\n")
    return target


def write_stamp() -> Path:
    """Stamp this checkout's code into the tree, for a copy without .git to name (``code_of_copy``)."""
    found = code_of_checkout()
    if found is None:
        raise SystemExit("stamp: not a git checkout; run it where .git is")
    tree = found.tree or (_git("rev-parse", "HEAD^{tree}") or "").strip()
    STAMP.write_text(json.dumps({"commit": found.commit, "tree": tree, "diff": found.diff,
                                 "files": _stamped_files()}) + "\n")
    return STAMP


def record_code(run: dict[str, Any]) -> Code:
    """Put the measured code in ``run``: its commit and, for uncommitted changes, where its diff goes."""
    found = code()
    run["commit"] = found.field()
    if found.note:
        run["code_note"] = found.note
    if found.diff and found.tree:
        run["changes"] = {"tree": found.tree, "diff": f"{DIFFS}/{found.tree}.diff"}
    return found


def save_diff(run: dict[str, Any], found: Code, folder: Path) -> None:
    """Write the diff ``run`` names beside its results file, once the results are saved."""
    changes = run.get("changes") or {}
    if changes.get("tree") == found.tree and found.diff:
        path = folder / changes["diff"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(found.diff)


def log_to_stderr(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


@dataclass
class Completed:
    rc: int | None  # None: cut at its timeout
    stdout: str
    stderr: str
    wall_s: float


def child_env(cache_root: Path, cache_url: str | None = None, code: Path = REPO) -> dict[str, str]:
    """Fresh Inductor and Triton caches under ``cache_root``; no signing key of the caller's shell;
    the project's code from ``code`` (another version's: benchmarks/baseline_code.sh)."""
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOTUNE_SIGNING_KEY", "AUTOTUNE_TRUSTED_KEYS")}
    for name, folder in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
        (cache_root / folder).mkdir(parents=True, exist_ok=True)
        env[name] = str(cache_root / folder)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(code), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    # Compiled bytecode, as a normal install has it: where site-packages is read-only, every
    # process would otherwise compile ~1,400 torch modules (~5 s) inside its timings.
    env.setdefault("PYTHONPYCACHEPREFIX", str(PYCACHE))
    # A shell with PYTHONDONTWRITEBYTECODE would make every child compile every module it imports
    # afresh (seconds of CPU in each timing); the prefix is the benchmarks' own folder, so write.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if cache_url:
        env["AUTOTUNE_CACHE"] = cache_url
    return env


def run(cmd: list[str], env: dict[str, str], timeout: float, log_path: Path | None = None,
        cwd: Path = REPO) -> Completed:
    """Run a child in its own process group; at its timeout stop that group, then kill it."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)
    rc: int | None
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGTERM)  # the child, its pass, its compile workers
        try:
            stdout, stderr = proc.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        rc = None
    wall = time.perf_counter() - start
    _reap_group(proc.pid)
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(f"$ {' '.join(cmd)}\n# rc={rc} wall={wall:.1f}s\n--- stdout\n{stdout}\n--- stderr\n{stderr}")
    return Completed(rc, stdout or "", stderr or "", wall)


def _reap_group(pid: int, grace_s: float = 10.0) -> None:
    """Wait until nothing of a finished child's process group still runs (its compile workers shut
    down after it): a worker still ending would take CPU from the next child's timings. What still
    runs after ``grace_s`` is killed."""
    deadline = time.perf_counter() + grace_s
    while _group_runs(pid):
        if time.perf_counter() > deadline:
            log.warning("process group %d still ran %.0f s after its child ended: killed", pid, grace_s)
            _signal_group(pid, signal.SIGKILL)
            return
        time.sleep(0.05)


def _group_runs(group: int) -> bool:
    """Whether a process of ``group`` runs (a zombie waiting for init to reap it does not)."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: the group's existence is all there is to ask
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # it ended while being read
        if len(fields) > 2 and fields[2] == str(group) and fields[0] not in ("Z", "X"):
            return True
    return False


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass


def child_result(result: dict[str, Any], body: Callable[[], None]) -> int:
    """A child's one result line: ``result`` marked ok once ``body`` returns, or with the error it
    raised, whatever it is, and the end of its traceback (the parent records them); the child's
    exit code."""
    try:
        body()
        result["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 - the parent gets the error, whatever it is
        result.update(status="error", error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc()[-TAIL_CHARS:])
    emit(result)
    return 0 if result["status"] == "ok" else 1


def copy_sqlite(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite cache: its write-ahead log's last writes included."""
    import sqlite3

    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)


def emit(payload: dict[str, Any]) -> None:
    sys.stdout.write(MARKER + json.dumps(payload, default=str) + "\n")
    sys.stdout.flush()


def marker_payload(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                payload = json.loads(line[len(MARKER):])
            except json.JSONDecodeError:
                continue
            if isinstance(payload, dict):
                return payload
    return None


def sweep_report(stdout: str) -> dict[str, Any] | None:
    """``autotune sweep --json``'s report: the last JSON object on stdout that has "totals"."""
    decoder, found = json.JSONDecoder(), None
    for match in re.finditer(r"^\s*\{", stdout, flags=re.MULTILINE):
        try:
            obj, _ = decoder.raw_decode(stdout, match.end() - 1)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "totals" in obj:
            found = obj
    return found


def tail(text: str) -> str:
    return text[-TAIL_CHARS:] if text else ""


def warm_bytecode() -> None:
    """Compile the bytecode every timed process imports, once, before any is timed."""
    env = child_env(Path(tempfile.mkdtemp(prefix="bench_warm_")))
    code = f"import importlib\nfor name in {WARM_IMPORTS!r}:\n    try:\n        importlib.import_module(name)\n" \
           "    except Exception:\n        pass\n"  # one that is missing here skips only itself
    started = time.perf_counter()
    done = run([sys.executable, "-c", code], env, 600)
    log.info("bytecode warm-up: %.1f s (rc %s)", time.perf_counter() - started, done.rc)


def machine(timeout: float = 300) -> dict[str, Any]:
    """Machine and versions, read by a child so that the parent never imports torch or holds the GPU."""
    with tempfile.TemporaryDirectory(prefix="bench_info_") as tmp:
        done = run([sys.executable, "-m", "benchmarks.harness", "info"], child_env(Path(tmp)), timeout)
    info = marker_payload(done.stdout)
    if info is None:
        log.warning("could not read the machine's versions (rc=%s): %s", done.rc, tail(done.stderr)[-500:])
        info = {"python": platform.python_version(), "cpu": cpu_model(), "cpu_count": os.cpu_count()}
    return info


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _versions() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                            "cpu": cpu_model(), "cpu_count": os.cpu_count(), "gpu": None, "gpu_count": 0}
    try:
        import torch

        info.update(torch=torch.__version__, cuda=torch.version.cuda)
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                        gpu_memory_gib=round(props.total_memory / 2**30, 1))
    except Exception as exc:  # noqa: BLE001 - the versions say what failed
        info["torch_error"] = f"{type(exc).__name__}: {exc}"
    for name in ("triton", "autotune"):
        try:
            info[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001
            info[name] = None
    if shutil.which("nvidia-smi"):
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        info["driver"] = next(iter(done.stdout.split()), None)
    return info


def database_versions(url: str | None) -> dict[str, Any]:
    """The database stack's versions, and the PostgreSQL server's at ``url`` (if given)."""
    import sqlite3
    from importlib import metadata

    import sqlalchemy as sa

    info: dict[str, Any] = {"sqlite": sqlite3.sqlite_version, "sqlalchemy": sa.__version__,
                            **{name: metadata.version(name) for name in ("alembic", "psycopg")}}
    if url:
        try:
            with sa.create_engine(url, poolclass=sa.NullPool, connect_args={"connect_timeout": 5}).connect() as conn:
                info.update(postgresql=conn.exec_driver_sql("SHOW server_version").scalar_one(),
                            shared_buffers=conn.exec_driver_sql("SHOW shared_buffers").scalar_one())
        except sa.exc.SQLAlchemyError as error:
            info["postgresql"] = f"unreachable: {str(error).splitlines()[0]}"
    return info


def machine_line(info: dict[str, Any]) -> str:
    gpu = f"{info['gpu']} x{info.get('gpu_count', 1)}" if info.get("gpu") else "no GPU"
    versions = ", ".join(f"{k} {info[k]}" for k in ("python", "torch", "triton", "cuda", "autotune") if info.get(k))
    return f"{gpu}; {info.get('cpu') or '-'} ({info.get('cpu_count')} cores); {versions}"


class Results:
    """``<out>/<name>.json`` and the Markdown made from it by ``render`` (one run -> lines)."""

    def __init__(self, out: Path, name: str, title: str, render: Callable[[dict[str, Any]], list[str]]) -> None:
        self.path, self.name, self.title, self.render = Path(out) / f"{name}.json", name, title, render
        self.data: dict[str, Any] = load(self.path) if self.path.exists() else {"benchmark": name, "runs": []}
        self.codes: list[tuple[dict[str, Any], Code]] = []  # this process's runs and the code each measured

    def run(self, label: str, info: dict[str, Any], command: str) -> dict[str, Any]:
        """The run of ``label``: a new one (replacing one of the same label), headed by what it measured on."""
        new = {"label": label, "machine": info, "date": now(), "commit": None, "command": command}
        self.codes.append((new, record_code(new)))
        self.data["runs"] = [r for r in self.data["runs"] if r.get("label") != label] + [new]
        return new

    def find(self, label: str) -> dict[str, Any] | None:
        return next((r for r in self.data["runs"] if r.get("label") == label), None)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        self.path.with_suffix(".md").write_text(markdown(self.data, self.title, self.render))
        for run, found in self.codes:
            save_diff(run, found, self.path.parent)


def new_run(store: Results, label: str | None, prog: str, argv: list[str]) -> dict[str, Any]:
    """This machine's new run in ``store``, named ``label``, else by its GPU ("cpu" without one)."""
    info = machine(120)
    name = label or (slug(info["gpu"]) if info.get("gpu") else "cpu")
    return store.run(name, info, " ".join([f"python -m {prog}", *argv]))


def resumable_run(store: Results, args: argparse.Namespace, prog: str,
                  argv: list[str] | None) -> tuple[dict[str, Any], dict[str, Any], int]:
    """This machine's new run in ``store`` (named ``--label``, else by its GPU and their count),
    what the run of that name in ``--resume`` measured (empty without one), and the GPU count."""
    info = machine(120)
    gpus = int(info.get("gpu_count") or 0)
    label = args.label or (f"{slug(info['gpu'])} x{gpus}" if gpus else "cpu")
    earlier = (results_of(Path(args.resume)).find(label) or {}) if args.resume else {}
    run = store.run(label, info, f"python -m {prog} " + " ".join(sys.argv[1:] if argv is None else argv))
    return run, earlier, gpus


def load(path: Path) -> dict[str, Any]:
    """A results file; one of an older layout (a single run, no "runs") is read as one run."""
    data = json.loads(Path(path).read_text())
    return data if "runs" in data else {"benchmark": Path(path).stem, "runs": [data]}


def markdown(data: dict[str, Any], title: str, render: Callable[[dict[str, Any]], list[str]]) -> str:
    lines = [f"# {title}", "", f"Made from `{data['benchmark']}.json` (every figure, with each child's details).", ""]
    for entry in data["runs"]:
        lines += [f"## {entry.get('label')}", "", f"- machine: {machine_line(entry.get('machine') or {})}",
                  *(f"- also on: {host}" for host in entry.get("other_hosts", [])),
                  f"- date {entry.get('date')}, code {entry.get('commit') or 'unrecorded'}: "
                  f"`{entry.get('command')}`"]
        lines += [f"- {entry['note']}"] if entry.get("note") else []
        lines += [""] + render(entry) + [""]
    return "\n".join(lines)


def table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    header = list(header)
    cells = [[str(c).replace("|", "\\|").replace("\n", " ") for c in row] for row in rows]
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)] + ["| " + " | ".join(r) + " |" for r in cells]


def fmt(value: Any, spec: str = ".1f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None


def results_of(path: Path) -> Results:
    """The results file at ``path``, with its benchmark's own Markdown (``benchmarks.<name>.results``)."""
    data = load(path) if Path(path).exists() else {"benchmark": Path(path).stem, "runs": []}
    store = importlib.import_module(f"benchmarks.{data['benchmark']}").results(Path(path).parent)
    store.path, store.data = Path(path), data
    return store


def _carry_diff(entry: dict[str, Any], source: Path, target: Path) -> None:
    """A merged run's diff goes with it, to the same place beside the results file it joins."""
    diff = (entry.get("changes") or {}).get("diff")
    if diff and (source / diff).exists() and source.resolve() != target.resolve():
        (target / diff).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / diff, target / diff)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.harness")
    parser.add_argument("command", choices=("info", "stamp", "merge", "render", "attest"),
                        help="info: this machine's versions; stamp: write benchmarks/code_stamp.json, the code "
                        "that a copy of this tree without .git will record; merge FILE NEW...: the runs of NEW files replace "
                        "those of the same label in FILE; render FILE...: make each FILE's Markdown again; "
                        "attest FILE ARCHIVE STAMP: name the commit of FILE's runs made from a `git archive` copy")
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--commit", default=None, help="stamp: this commit's files (its git archive), not the checkout")
    parser.add_argument("--to", type=Path, default=None, help="stamp --commit: where the stamp goes")
    args = parser.parse_args(argv)
    if args.command == "info":
        emit(_versions())
        return 0
    if args.command == "stamp":
        print(f"wrote {write_commit_stamp(args.commit, args.to or STAMP) if args.commit else write_stamp()}")
        return 0
    if args.command == "attest":
        if len(args.files) != 3:
            raise SystemExit("attest: give FILE ARCHIVE STAMP (the results, the archive that travelled, its stamp)")
        return attest(*args.files)
    targets = args.files[:1] if args.command == "merge" else args.files
    for path in targets:
        if "runs" not in json.loads(Path(path).read_text()):
            print(f"skipped {path}: one run of its own layout, whose benchmark writes its Markdown")
            continue
        results = results_of(path)
        for source in args.files[1:] if args.command == "merge" else ():
            for entry in load(source)["runs"]:
                results.data["runs"] = [r for r in results.data["runs"] if r.get("label") != entry.get("label")]
                results.data["runs"].append(entry)
                _carry_diff(entry, Path(source).parent, results.path.parent)
        results.save()
        print(f"wrote {results.path} ({len(results.data['runs'])} runs) and its .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
