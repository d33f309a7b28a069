"""benchmarks.plots draws docs/results.md's pictures from the committed results (matplotlib
comes with the test extra, through bench: a missing matplotlib fails here, it does not skip)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_plots_are_drawn_from_the_committed_results_and_shown_in_the_docs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.plots", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    from benchmarks.plots import IMAGES

    for name in IMAGES:
        image = (tmp_path / name).read_bytes()
        assert image.startswith(b"\x89PNG") and len(image) > 20_000, name  # a picture, not an empty canvas
        assert f"images/{name}" in (REPO / "docs" / "results.md").read_text(), f"docs/results.md does not show {name}"
