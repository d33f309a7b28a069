"""Fault injection at full size: tests/test_faults.py with N up to 32 on SQLite and the local
PostgreSQL (``AUTOTUNE_FAULTS=full``), every scenario's checks and figures into faults.json/.md.

The scenarios live beside the tests that run them at small N in CI (tests/fault_scenarios.py).
Needs root (a tmpfs for the disk-full scenarios), PostgreSQL's server binaries (the restart
stops a cluster of its own: tests/private_postgres.py) and the local PostgreSQL
(``AUTOTUNE_TEST_POSTGRES``), which no scenario stops. The tests' g++ shim is off: the jobs' compile seconds
are a plain compile's.

    python -m benchmarks.faults
    python -m benchmarks.faults --only slow_database     # a trial run (pytest -k); nothing is written
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import harness


def render(run: dict[str, Any]) -> list[str]:
    outcomes = run["scenarios"]
    rows = [[o["scenario"], o["checks"], "yes" if o["passed"] else "NO",
             ", ".join(f"{k} {v}" for k, v in o["figures"].items()) + ("; PROBLEMS: " + "; ".join(o["problems"])
                                                                        if o["problems"] else "")] for o in outcomes]
    versions = ", ".join(f"{k} {v}" for k, v in (run.get("databases") or {}).items())
    return [f"**{sum(o['passed'] for o in outcomes)} of {len(outcomes)} scenarios passed.** {versions}", ""] + \
        harness.table(["scenario", "checks", "passed", "figures"], rows)


def results(out: Path) -> harness.Results:
    return harness.Results(out, "faults", "Fault injection", render)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.output_options(parser, "faults", "the device")
    parser.add_argument("--only", default=None, help="pytest -k: a trial run of some scenarios, nothing written")
    args = parser.parse_args(argv)
    info = harness.machine()
    with tempfile.TemporaryDirectory(prefix="faults_") as tmp:
        lines = Path(tmp) / "outcomes.jsonl"
        env = {**os.environ, "AUTOTUNE_FAULTS": "full", "AUTOTUNE_FAULTS_OUT": str(lines),
               "AUTOTUNE_TEST_NO_CXX_CACHE": "1"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "tests/test_faults.py"]
        done = subprocess.run(cmd + (["-k", args.only] if args.only else []), cwd=harness.REPO, env=env)
        outcomes = [json.loads(line) for line in lines.read_text().splitlines()] if lines.exists() else []
    if args.only:
        return done.returncode
    store = results(Path(args.out))
    run = store.run(args.label or harness.slug(info.get("gpu") or "cpu"), info,
                    "python -m benchmarks.faults " + " ".join(sys.argv[1:] if argv is None else argv))
    url = os.environ.get("AUTOTUNE_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    run.update(databases=harness.database_versions(url), scenarios=outcomes, pytest_exit=done.returncode)
    store.save()
    print(store.path.with_suffix(".md").read_text())
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
