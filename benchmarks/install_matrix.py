"""The built wheel beside each torch a user may have: pip keeps that torch, and the README's
quickstart serves every GEMM from the cache (hits, 0 benchmarks).

For each torch release: a fresh venv with that torch installed first, then the wheel
`python -m build` made, with its [sweep] extra (.ci/wheel_install prepare); then
tests/test_wheel.py against it (.ci/wheel_install run: the torch kept, the metadata, the
quickstart: a sweep of examples/mlp.py into a scratch SQLite cache, `cache ls`, the job), and
`autotune doctor --json` from the venv. Each venv (several GB with a CUDA build) is deleted
after its row. Results: benchmarks/results/install_matrix.{json,md}; docs/gen_versions.py
makes docs/versions.md's table from the doctor reports.

    python -m benchmarks.install_matrix                       # 2.11.0, 2.13.0, 2.14.1, 2.15.0
    python -m benchmarks.install_matrix --torch 2.14.1 --keep /tmp/m   # one, its venv kept under /tmp/m

Runs for different releases may go at once (each merges its rows into the results file).

PyPI's torch wheels are their CUDA builds, which install and run on a CPU machine; pip's
constraint file (a cap on torch on some machines) is lifted for these installs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO, RESULTS, cpu_model, now

TORCH = ("2.11.0", "2.13.0", "2.14.1", "2.15.0")
NAME = "install_matrix"


def one(version: str, root: Path, code: Path) -> dict[str, Any]:
    """Install, check and quickstart beside torch ``version``; the row of the results. ``code``:
    the commit's files (its scripts, its tests, the wheel's source)."""
    work = root / f"torch-{version}"
    env = {**os.environ, "PIP_CONSTRAINT": "/dev/null"}
    row: dict[str, Any] = {"torch_spec": f"torch=={version}"}
    began = time.monotonic()
    prepared = subprocess.run([str(code / ".ci" / "wheel_install"), "prepare", str(work), f"torch=={version}"],
                              env=env, capture_output=True, text=True, check=False)
    row["prepare_s"] = round(time.monotonic() - began, 1)
    row["prepare_tail"] = (prepared.stdout + prepared.stderr)[-1500:]
    if prepared.returncode != 0:
        row["ok"] = False
        return row
    row["torch_before"] = (work / "torch.before").read_text().strip()
    row["torch_after"] = (work / "torch.after").read_text().strip()
    row["wheel"] = Path((work / "wheel.path").read_text().strip()).name
    row["venv_size_mb"] = int(subprocess.run(["du", "-sm", str(work / "venv")], capture_output=True, text=True,
                                             check=False).stdout.split()[0] or 0)
    began = time.monotonic()
    # The checkout's tests (under its editable install: the copy's own folders would shadow it).
    tested = subprocess.run([str(REPO / ".ci" / "wheel_install"), "run", str(work)], env=env, capture_output=True,
                            text=True, check=False)
    row["tests_s"] = round(time.monotonic() - began, 1)
    row["tests_tail"] = (tested.stdout + tested.stderr)[-1500:]
    quickstart = work / "quickstart.json"
    row["quickstart"] = json.loads(quickstart.read_text()) if quickstart.exists() else None
    with tempfile.TemporaryDirectory() as scratch:
        doctor_env = {**env, "XDG_CACHE_HOME": scratch}
        doctor_env.pop("AUTOTUNE_CACHE", None)
        began = time.monotonic()
        doctor = subprocess.run([str(work / "venv" / "bin" / "autotune"), "doctor", "--json"], env=doctor_env,
                                capture_output=True, text=True, check=False)
        row["doctor_s"] = round(time.monotonic() - began, 2)
    row["doctor_exit"] = doctor.returncode
    row["doctor"] = json.loads(doctor.stdout) if doctor.stdout.strip().startswith("{") else None
    row["ok"] = tested.returncode == 0 and row["torch_before"] == row["torch_after"]
    return row


def render(data: dict[str, Any]) -> str:
    rows = sorted(data["rows"], key=lambda r: [int(p) for p in re.findall(r"\d+", r["torch_spec"])])
    lines = ["# The wheel beside each torch", "",
             "Made from `install_matrix.json` by `python -m benchmarks.install_matrix` (each row's logs there).", "",
             f"- machine: {data['machine']}; Python {data['python']}",
             f"- date {data['date']}, code {data['commit']}: `{data['command']}`", "",
             "A fresh venv per torch: that torch installed first, then the wheel (`python -m build`) with "
             "`[sweep]`; `tests/test_wheel.py` against it (the torch kept, the metadata, the README's quickstart: "
             "sweep `examples/mlp.py` into a scratch SQLite cache, `cache ls`, the job), and `autotune doctor`. "
             "Seconds are wall time on a shared, loaded machine: they say what a run took, not what it costs.", "",
             "| torch asked | torch before the wheel | after | tests | quickstart job | doctor | install s | tests s "
             "| venv MB |",
             "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: |"]
    for row in rows:
        quick = row.get("quickstart") or {}
        stats = quick.get("stats", "—")
        doctor = row.get("doctor") or {}
        features = doctor.get("features", [])
        on = sum(1 for f in features if f["on"])
        verdict = f"exit {row.get('doctor_exit')}, {on}/{len(features)} features on, {len(doctor.get('warnings', []))} warnings"
        lines.append(f"| {row['torch_spec']} | {row.get('torch_before', '—')} | {row.get('torch_after', '—')} "
                     f"| {'passed' if row.get('ok') else 'FAILED'} | `{stats}` | {verdict} | {row.get('prepare_s', '—')} "
                     f"| {row.get('tests_s', '—')} | {row.get('venv_size_mb', '—')} |")
    warned = [(row["torch_spec"], w) for row in data["rows"] for w in (row.get("doctor") or {}).get("warnings", [])]
    if warned:
        lines += ["", "Doctor's warnings:", ""] + [f"- {spec}: {w}" for spec, w in warned]
    return "\n".join(lines) + "\n"


def _short(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", nargs="+", default=list(TORCH), help="torch versions (default: %(default)s)")
    parser.add_argument("--keep", type=Path, help="build the venvs here and keep them (default: a temporary folder, deleted)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--commit", default="HEAD",
                        help="the commit whose files are built and run (default HEAD); runs beside one another name one")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.install_matrix " + " ".join(argv or sys.argv[1:])
    data = {"benchmark": NAME, "machine": f"{cpu_model()}, {os.cpu_count()} cores", "python": sys.version.split()[0],
            "date": now(), "commit": _short(args.commit), "command": command.strip(), "rows": []}
    root = args.keep or Path(tempfile.mkdtemp(prefix="autotune-install-matrix-"))
    # The commit's files, not the checkout's: what it names is what is measured.
    code = root / "code"
    code.mkdir(parents=True, exist_ok=True)
    subprocess.run(f"git archive --format=tar {args.commit} | tar -xf - -C {code}", shell=True, cwd=REPO, check=True)
    try:
        for version in args.torch:
            row = one(version, root, code)
            data["rows"].append(row)
            print(f"torch {version}: {'ok' if row.get('ok') else 'FAILED'} ({row.get('prepare_s')} s + {row.get('tests_s')} s)",
                  flush=True)
            save(data, args.out)
            if args.keep is None:
                shutil.rmtree(root / f"torch-{version}", ignore_errors=True)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if all(row.get("ok") for row in data["rows"]) else 1


def save(data: dict[str, Any], out: Path) -> None:
    """Merge this run's rows into ``out``'s results (a row of the same torch replaces the one
    before), under a lock: runs for other torch releases may write beside this one."""
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    with open(out / f".{NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = out / f"{NAME}.json"
        merged = json.loads(path.read_text()) if path.exists() else {**data, "rows": []}
        if merged.get("commit") != data["commit"]:  # another commit's rows are not this run's
            merged = {**data, "rows": []}
        merged["command"] = "python -m benchmarks.install_matrix --commit REV --torch VERSION..."
        mine = {row["torch_spec"] for row in data["rows"]}
        merged["rows"] = [row for row in merged["rows"] if row["torch_spec"] not in mine] + data["rows"]
        merged["date"] = data["date"]
        path.write_text(json.dumps(merged, indent=1) + "\n")
        (out / f"{NAME}.md").write_text(render(merged))


if __name__ == "__main__":
    sys.exit(main())
