"""The README's set-up commands and quickstart, run as written on CPU into a scratch cache.

Each block the README means to be run is marked by an HTML comment just before it:
``<!-- readme-test: NAME -->``. The set-up commands start with a ``pip install ... &&``
prefix that CI has already run (``.ci/run``); the test checks that prefix against CI's and
runs what follows it. The test command itself is the suite, so it is checked to be the very
line ``.ci/run`` executes, and CI running it is the proof that it runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_job_warnings import warning_lines

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
CI_RUN = REPO / ".ci" / "run"
_MARKED = re.compile(r"<!-- readme-test: (?P<name>[\w-]+)(?: (?P<path>\S+))? -->\n```\w*\n(?P<body>.*?)```", re.S)
_PIP_PREFIX = re.compile(r"^(?P<pip>(?:python -m )?pip install [^&]*?) && (?P<rest>.*)$")
# The quickstart's tests share one sweep (the main job's), so they run on one xdist worker.
pytestmark = pytest.mark.xdist_group("readme")


def marked_blocks() -> dict[str, tuple[str | None, str]]:
    """Every marked block of the README: name -> (the path it names, its text)."""
    return {m["name"]: (m["path"], m["body"]) for m in _MARKED.finditer(README.read_text())}


def block(name: str) -> str:
    blocks = marked_blocks()
    assert name in blocks, f"README.md lost its block marked <!-- readme-test: {name} -->"
    return blocks[name][1]


def commands(text: str) -> list[str]:
    """The shell commands of a block, one per line (a line ending in a backslash goes on in the
    next); comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def split_pip(command: str) -> tuple[str, str]:
    """(the pip install prefix, the commands after it)."""
    match = _PIP_PREFIX.match(command)
    assert match, f"a set-up command must start with `pip install ... &&`: {command}"
    return match["pip"], match["rest"]


def ci_torch_pin() -> str:
    pins = re.findall(r"torch==[\d.]+", CI_RUN.read_text())
    assert pins, ".ci/run no longer pins torch"
    return pins[0]


def test_the_setup_commands_are_what_ci_runs() -> None:
    """The tests command is the line .ci/run executes; the main job installs CI's torch and an
    extra that CI's [test] install includes, so CI's environment runs the rest of it as is."""
    (tests_command,) = commands(block("setup-tests"))
    assert tests_command in CI_RUN.read_text().splitlines(), "README's test command differs from .ci/run's"
    (main_command,) = commands(block("setup-main"))
    pip, _ = split_pip(main_command)
    assert ci_torch_pin() in pip.split(), f"the main job installs another torch than CI ({ci_torch_pin()})"
    extra = re.search(r"-e '\.\[(\w+)\]'", pip)
    assert extra, f"the main job installs the checkout with an extra: {pip}"
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extra[1] in included_extras(optional, "test"), f"CI's [test] install does not include [{extra[1]}]"


def included_extras(optional: dict[str, list[str]], name: str) -> set[str]:
    """The extra ``name`` and every extra it pulls in through ``autotune[...]``."""
    found = {name}
    for requirement in optional.get(name, []):
        match = re.fullmatch(r"(?:inductor-)?autotune\[([\w,]+)\]", requirement.replace(" ", ""))
        for other in match[1].split(",") if match else ():
            found |= included_extras(optional, other)
    return found


def test_the_quickstart_shows_its_example_files_as_they_are() -> None:
    for name, (path, text) in marked_blocks().items():
        if path is not None:
            assert (REPO / path).read_text() == text, f"README block {name} differs from {path}"


@pytest.fixture(scope="module")
def scratch_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The user's shell, pointed at scratch caches: the cache database, XDG's cache dir (the
    default database lives there) and Inductor's, so nothing of the user's is touched."""
    root = tmp_path_factory.mktemp("readme")
    env = dict(os.environ)
    env.update(AUTOTUNE_CACHE=str(root / "cache.db"), XDG_CACHE_HOME=str(root / "xdg"),
               TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    for name in ("AUTOTUNE_TRUSTED_KEYS", "AUTOTUNE_SIGNING_KEY", "AUTOTUNE_READ_ONLY", "AUTOTUNE_ON_MISS"):
        env.pop(name, None)
    return env


def run_shell(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{done.stderr[-3000:]}\n{done.stdout[-2000:]}"
    return done


@pytest.fixture(scope="module")
def main_job(scratch_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The main job's commands after its install: one sweep of examples/mlp.py into the scratch
    cache, and `autotune cache ls`."""
    (main_command,) = commands(block("setup-main"))
    return run_shell(split_pip(main_command)[1], scratch_env)


def test_the_main_job_and_the_quickstart_run_as_written(scratch_env: dict[str, str],
                                                        main_job: subprocess.CompletedProcess[str]) -> None:
    """One sweep of examples/mlp.py (the main job's, which the quickstart's first step repeats),
    then the quickstart's job with the hook in its code, then the same job under `autotune run`:
    each serves every GEMM from the cache."""
    (main_command,) = commands(block("setup-main"))
    _, main_rest = split_pip(main_command)
    swept = main_job
    assert "3 found, 0 cached, 3 tuned, 0 failed" in swept.stdout, swept.stdout[-2000:]
    listed = re.findall(r"^\s*\d+\s+packed_linear ", swept.stdout, re.M)
    assert len(listed) == 3, f"`autotune cache ls` listed {len(listed)} requests, not 3:\n{swept.stdout[-2000:]}"

    ran = [part.strip() for part in main_rest.split("&&")]
    for command in commands(block("quickstart-sweep")):
        assert command in ran, f"the quickstart's `{command}` is not one the main job ran"

    for name in ("quickstart-job", "quickstart-run"):
        for command in commands(block(name)):
            done = run_shell(command, scratch_env)
            assert "autotune: hits=3 misses=0" in done.stdout + done.stderr, (name, done.stdout, done.stderr[-2000:])


def stats_of(done: subprocess.CompletedProcess[str]) -> dict[str, int]:
    """The figures of the stats line a job printed (`autotune: hits=3 misses=0 ...`)."""
    line = re.search(r"^autotune: (hits=.*)$", done.stdout + done.stderr, re.M)
    assert line, f"no stats line:\n{done.stdout[-1000:]}\n{done.stderr[-2000:]}"
    return {name: int(value) for name, value in re.findall(r"(\w+)=(\d+)", line[1])}


def test_the_artifact_block_runs_as_written_and_says_what_each_node_loads(
        scratch_env: dict[str, str], main_job: subprocess.CompletedProcess[str],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """After the main job's sweep: a key pair, a signing sweep, then the job on this node (its
    Inductor cache, which the sweep's compiles filled, serves most of it: fewer artifacts loaded,
    none with torch 2.13) and on a fresh node (an empty Inductor cache: signed artifacts serve
    it, at most as many as the sweep published). Neither job's output holds a warning."""
    root = tmp_path_factory.mktemp("readme-artifacts")
    env = {**scratch_env, "HOME": str(root / "home"), "TMPDIR": str(root)}  # ~/.autotune is the scratch one
    claimed = [int(n) for n in re.findall(r"`artifacts_loaded=(\d+)`", block_and_after("artifacts"))]
    assert len(claimed) >= 2 and claimed[-1] > max(claimed[:-1]), \
        "the README names artifacts_loaded on the node that swept (per torch), then a higher one on a fresh node"
    outputs = [(command, run_shell(command, env)) for command in commands(block("artifacts"))]
    published = [re.search(r"(\d+) signed artifacts published", done.stdout) for command, done in outputs
                 if "--signing-key" in command]
    assert published and published[0], f"the sweep published no artifacts:\n{outputs[1][1].stdout[-2000:]}"
    jobs = [done for command, done in outputs if "autotune run" in command]
    assert len(jobs) == 2, "the artifact block runs the job on this node, then on a fresh node"
    loaded = [stats_of(done) for done in jobs]
    for stats, done in zip(loaded, jobs):
        assert (stats["hits"], stats["misses"], stats["benchmarks"], stats["artifacts_rejected"]) == (3, 0, 0, 0), stats
        assert warning_lines(done.stderr) == [], f"the job printed warnings:\n{done.stderr[-3000:]}"
    assert 0 < loaded[1]["artifacts_loaded"] <= int(published[0][1]), (loaded[1], published[0][0])
    assert loaded[0]["artifacts_loaded"] < loaded[1]["artifacts_loaded"], ("this node, a fresh node", loaded)


def block_and_after(name: str) -> str:
    """A marked block and the README's paragraph after it, which says what the block prints."""
    text = README.read_text()
    start = text.index(f"<!-- readme-test: {name} -->")
    closing = text.index("```\n", text.index("```", start) + 3)
    return text[start:text.index("\n\n", closing + len("```\n\n"))]
