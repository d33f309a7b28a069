"""The code a benchmark run records is read from git, never typed: a clean checkout's commit, a dirty one's
tree hash and diff, and a copy without .git the stamp's code only where its files match."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import harness


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    (repo / "code.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text("*.log\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    monkeypatch.setattr(harness, "REPO", repo)
    monkeypatch.setattr(harness, "STAMP", repo / "benchmarks" / "code_stamp.json")
    return repo


def test_a_clean_checkout_records_its_full_commit(checkout: Path, tmp_path: Path) -> None:
    run: dict = {}
    (checkout / "ignored.log").write_text("not code")
    harness.record_code(run)
    assert run == {"commit": _git(checkout, "rev-parse", "HEAD")}


def test_a_dirty_checkout_records_its_tree_and_its_diff_beside_the_results(checkout: Path, tmp_path: Path) -> None:
    (checkout / "code.py").write_text("x = 2\n")
    (checkout / "new.py").write_text("y = 1\n")
    store = harness.Results(tmp_path / "out", "demo", "Demo", lambda run: [])
    run = store.run("cpu", {}, "python -m demo")
    assert not (tmp_path / "out" / "diffs").exists()  # nothing beside results not yet saved
    store.save()
    assert run["commit"] == _git(checkout, "rev-parse", "HEAD") + "+changes"
    diff = (tmp_path / "out" / run["changes"]["diff"]).read_text()
    assert "+x = 2" in diff and "+y = 1" in diff
    assert run["changes"]["diff"] == f"diffs/{run['changes']['tree']}.diff"


def test_a_copy_without_git_records_the_stamp_only_where_its_files_match(checkout: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    (checkout / "code.py").write_text("x = 3\n")
    harness.write_stamp()
    stamp = json.loads((checkout / "benchmarks" / "code_stamp.json").read_text())
    copy = tmp_path / "copy"
    shutil.copytree(checkout, copy, ignore=shutil.ignore_patterns(".git"))
    monkeypatch.setattr(harness, "REPO", copy)
    monkeypatch.setattr(harness, "STAMP", copy / "benchmarks" / "code_stamp.json")
    found = harness.code()
    assert (found.commit, found.tree, found.note) == (stamp["commit"], stamp["tree"], None)
    assert "+x = 3" in found.diff
    (copy / "code.py").write_text("x = 4\n")
    changed = harness.code()
    assert changed.commit is None and "differ" in str(changed.note)
