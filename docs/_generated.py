"""The command line of a generated page (docs/gen_results.py, docs/gen_versions.py): write the
page, or with ``--check`` exit 1 where the page on disk is not what the generator makes.

The scripts run as ``python docs/gen_NAME.py`` and tests load them by file path, so neither
imports this as part of a package: each puts docs/ on the path first.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_or_check(page: Path, make: Callable[[], str], script: str, doc: str,
                   argv: list[str] | None = None) -> int:
    """Write ``page`` from ``make()``, or with ``--check`` compare it; the exit status.

    ``script`` is the generator's ``__file__`` (its command in the messages), ``doc`` its
    docstring (the first paragraph is the ``--help`` description)."""
    name = page.resolve().relative_to(REPO)
    command = f"python {Path(script).resolve().relative_to(REPO)}"
    parser = argparse.ArgumentParser(prog=command, description=doc.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help=f"exit 1 if {name} is out of date")
    args = parser.parse_args(argv)
    text = make()
    if args.check:
        if not page.exists() or page.read_text() != text:
            print(f"{name} is out of date: run {command}", file=sys.stderr)
            return 1
        return 0
    page.write_text(text)
    print(f"wrote {name} ({len(text.encode())} bytes)")
    return 0
