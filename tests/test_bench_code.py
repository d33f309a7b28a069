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


def _ignore_the_stamp(checkout: Path) -> None:
    """As this repository does: the stamp is written before a copy travels, never committed."""
    (checkout / ".gitignore").write_text("*.log\n/benchmarks/code_stamp.json\n")
    _git(checkout, "add", "-A")
    _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "ignore the stamp")


def test_a_dirty_checkout_is_seen_when_the_stamp_is_ignored(checkout: Path) -> None:
    _ignore_the_stamp(checkout)
    harness.write_stamp()
    (checkout / "code.py").write_text("x = 5\n")
    found = harness.code()
    assert found.field() == _git(checkout, "rev-parse", "HEAD") + "+changes" and "+x = 5" in found.diff


def test_a_copy_on_a_machine_without_git_is_checked_by_its_files_hashes(checkout: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _ignore_the_stamp(checkout)
    harness.write_stamp()
    copy = tmp_path / "copy"
    shutil.copytree(checkout, copy, ignore=shutil.ignore_patterns(".git"))
    monkeypatch.setattr(harness, "REPO", copy)
    monkeypatch.setattr(harness, "STAMP", copy / "benchmarks" / "code_stamp.json")
    head = _git(checkout, "rev-parse", "HEAD")
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))  # as a device image without git
    assert harness.code().commit == head
    (copy / "code.py").write_text("x = 6\n")
    changed = harness.code()
    assert changed.commit is None and "code.py" in str(changed.note)


def test_attest_names_the_commit_of_runs_made_from_its_archive_and_refuses_another(checkout: Path,
                                                                                  tmp_path: Path) -> None:
    _ignore_the_stamp(checkout)
    harness.write_stamp()
    head = _git(checkout, "rev-parse", "HEAD")
    archive = tmp_path / "code.tar"
    _git(checkout, "archive", "-o", str(archive), "HEAD")
    results = tmp_path / "out" / "harness_demo.json"
    results.parent.mkdir()
    unnamed = {"label": "gpu", "commit": None, "code_note": "the files differ"}
    results.write_text(json.dumps({"benchmark": "install_cost", "runs": [unnamed]}))
    harness.attest(results, archive, checkout / "benchmarks" / "code_stamp.json")
    run = json.loads(results.read_text())["runs"][0]
    assert run["commit"] == head and run["code_note"].startswith("attested after the run")
    (checkout / "code.py").write_text("x = 7\n")
    _git(checkout, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")
    harness.write_stamp()  # a stamp of the new commit: the old archive is not its files
    with pytest.raises(SystemExit, match="is not commit"):
        harness.attest(results, archive, checkout / "benchmarks" / "code_stamp.json")
