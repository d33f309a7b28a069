"""docs/results.md stays short and true: made from the committed results by docs/gen_results.py,
under 25 KB, and quoting commits only in its tables' commit cells."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "results.md"
MAX_BYTES = 25 * 1024
HASH = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def _prose(markdown: str) -> list[str]:
    """The page's lines outside tables and code blocks."""
    lines, in_code = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and not line.startswith("|"):
            lines.append(line)
    return lines


def test_the_page_is_short() -> None:
    size = PAGE.stat().st_size
    assert size < MAX_BYTES, f"docs/results.md is {size} bytes; lower BODY_LIMIT in docs/gen_results.py"


def test_the_prose_quotes_no_commit_and_no_issue() -> None:
    quoted = [line for line in _prose(PAGE.read_text()) if HASH.search(line) or re.search(r"\bissue \d+", line)]
    assert quoted == []


def test_the_page_is_what_the_results_make() -> None:
    spec = importlib.util.spec_from_file_location("gen_results", REPO / "docs" / "gen_results.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert PAGE.read_text() == module.make(), "docs/results.md is out of date: run python docs/gen_results.py"


def test_a_run_split_over_device_calls_shows_as_the_readmes_headline_table() -> None:
    """The startup section holds every model of the headline's run, each call's row above it."""
    from benchmarks import headline
    from benchmarks.harness import load

    chosen = headline.pick_runs(load(REPO / "benchmarks" / "results" / "startup.json"), None)
    table, _, _ = headline.rows(chosen)
    section = PAGE.read_text().split("## Startup", 1)[1].split("\n## ", 1)[0]
    assert all("| " + " | ".join(row) + " |" in section for row in table)
    assert all(f"| {run['label']} |" in section for run in chosen)
